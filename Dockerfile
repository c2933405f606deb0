# Two images from one file (docker-compose.yaml builds both):
#   --target sidecar         `sidecar serve` (ext_proc gRPC on :50051) and `render-envoy`;
#                            no Envoy wheel (Envoy runs from its official image) and no
#                            embedded stack or demo providers.
#   --target demo-providers  the fake OpenAI/Anthropic providers compose's demo talks to.
FROM python:3.11-slim AS source
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
# /run/sidecar: where the render step writes Envoy's bootstrap, xDS and SDS files and the
# channel token (a named volume takes this folder's owner on first use).
RUN useradd --system --uid 10001 sidecar && mkdir -p /run/sidecar && chown 10001 /run/sidecar

FROM source AS demo-providers
RUN pip install --no-cache-dir .
USER 10001
EXPOSE 18080
ENTRYPOINT ["sidecar", "demo-providers"]
CMD ["--listen", "0.0.0.0:18080"]

FROM source AS sidecar
RUN rm -rf sidecar/devstack && pip install --no-cache-dir .
USER 10001
EXPOSE 50051
ENTRYPOINT ["sidecar"]
CMD ["serve", "--config", "/etc/sidecar/config.yaml", "--listen", "0.0.0.0:50051", \
     "--grpc-token-file", "/run/sidecar/grpc-token"]
