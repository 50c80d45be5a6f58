"""The generated gRPC stubs of dissem's public API (``proto/dissem/v1``; ``generate.sh``)."""
