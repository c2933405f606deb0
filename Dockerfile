# The sidecar image: `sidecar serve` (ext_proc gRPC on :50051) by default; the same image
# runs the demo providers in docker-compose.yaml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
# /run/sidecar: where compose's envoy-config service writes Envoy's bootstrap, SDS files and
# the channel token (a named volume takes this folder's owner on first use).
RUN pip install --no-cache-dir . && useradd --system --uid 10001 sidecar \
    && mkdir -p /run/sidecar && chown 10001 /run/sidecar
USER 10001
EXPOSE 50051
ENTRYPOINT ["sidecar"]
CMD ["serve", "--config", "/etc/sidecar/config.yaml", "--listen", "0.0.0.0:50051", \
     "--grpc-token-file", "/run/sidecar/grpc-token"]
