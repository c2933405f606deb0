"""The stubs checked in under sidecar/external/v1 are exactly what grpcio-tools generates
from proto/sidecar/external/v1/router.proto: a change to the API cannot ship without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("router_pb2.py", "router_pb2.pyi", "router_pb2_grpc.py")


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}",
                    f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}",
                    str(ROOT / "proto/sidecar/external/v1/router.proto")],
                   check=True, capture_output=True)
    for name in GENERATED:
        fresh = (tmp_path / "sidecar/external/v1" / name).read_bytes()
        checked_in = (ROOT / "sidecar/external/v1" / name).read_bytes()
        assert fresh == checked_in, (
            f"sidecar/external/v1/{name} is stale: regenerate with `python -m "
            "grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. "
            "proto/sidecar/external/v1/router.proto`")
