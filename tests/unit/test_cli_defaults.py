"""The documented defaults of the command line (README: ports, all on loopback)."""

from __future__ import annotations

from sidecar.commands.arguments import parser as _parser


def test_up_defaults_are_the_documented_loopback_ports() -> None:
    args = _parser().parse_args(["up"])
    assert (args.listen, args.ext_proc, args.admin, args.admin_http, args.demo_port) == (
        "127.0.0.1:10000", "127.0.0.1:50051", "127.0.0.1:9901", "127.0.0.1:50052", 18080)
    assert args.config is None and args.demo_token == "demo-caller-token"


def test_serve_and_observations_defaults() -> None:
    serve = _parser().parse_args(["serve", "--config", "x.yaml", "--grpc-token-file", "t"])
    assert (serve.listen, serve.admin_http) == ("127.0.0.1:50051", "127.0.0.1:50052")
    observations = _parser().parse_args(["observations"])
    assert observations.admin_http == "127.0.0.1:50052" and observations.format == "table"
