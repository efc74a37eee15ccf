"""Regenerates src/svc_sdk/_relay_pb from proto/relay.proto (grpcio-tools).

    python scripts/gen_proto.py [OUT_DIR]

The generated modules are committed; tests/relay/test_proto_drift.py fails when they no
longer match the .proto file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent


def generate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        str(ROOT / "proto" / "relay.proto"),
    ]
    # Messages only, no grpc stubs: both sides speak the one bidirectional stream through
    # grpc's generic API (stream_stream on the client, a generic handler on the relay).
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    (out / "__init__.py").write_text('"""Generated from proto/relay.proto; do not edit."""\n')


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "src" / "svc_sdk" / "_relay_pb")
