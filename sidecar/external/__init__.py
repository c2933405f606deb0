"""`strategy: external`: the operator's routing service, asked over gRPC or HTTP JSON
(docs/external.md). `v1/` holds the stubs grpcio-tools generates from
proto/sidecar/external/v1/router.proto (tests/unit/test_external_stubs.py regenerates them)."""
