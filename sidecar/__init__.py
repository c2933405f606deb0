"""Envoy external-processing sidecar that routes a caller-visible LLM model group to one of
its provider targets. Envoy moves the bytes (including SSE); this package decides where they go."""

__version__ = "0.1.0"
