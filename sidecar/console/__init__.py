"""The operator console: read-only pages on the admin endpoint (docs/console.md)."""
