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
        f"--grpc_python_out={out}",
        str(ROOT / "proto" / "relay.proto"),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    grpc_module = out / "relay_pb2_grpc.py"
    # protoc writes an absolute import; the modules live inside a package.
    text = grpc_module.read_text().replace(
        "import relay_pb2 as relay__pb2", "from . import relay_pb2 as relay__pb2"
    )
    grpc_module.write_text(text)
    (out / "__init__.py").write_text('"""Generated from proto/relay.proto; do not edit."""\n')


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "src" / "svc_sdk" / "_relay_pb")
