"""Wire shapes of the caller-facing APIs: error bodies and model listings per dialect."""
