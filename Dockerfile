# The sidecar image: `sidecar serve` (ext_proc gRPC on :50051) by default; the same image
# runs the demo providers in docker-compose.yaml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN pip install --no-cache-dir . && useradd --system --uid 10001 sidecar
USER 10001
EXPOSE 50051
ENTRYPOINT ["sidecar"]
CMD ["serve", "--config", "/etc/sidecar/config.yaml", "--listen", "0.0.0.0:50051"]
