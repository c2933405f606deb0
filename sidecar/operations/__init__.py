"""The sidecar as a running process: service assembly, the admin endpoint, POSIX signal
handling, process set-up (event loop, allocator) and log formatting."""
