"""The exact-match response cache (docs/cache.md): identical non-streaming requests of a
group with `response_cache` answered from the sidecar's memory, without an upstream call."""
