"""A real inference engine for the end-to-end tests: llama.cpp's `llama-server`, built once
from the llama.cpp tree the `llama-cpp-python` sdist vendors (llama_build.py), serving a tiny
model with random weights that the tests write themselves (tiny_model.py), started and
stopped by PID like the fake providers (llama_server.py). docs/real-engine.md."""
