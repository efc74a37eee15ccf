"""The committed protobuf modules match proto/relay.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), str(tmp_path)], check=True
    )
    committed = ROOT / "src" / "svc_sdk" / "_relay_pb"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in committed.iterdir() if p.suffix != ".pyc" and p.name != "__pycache__"
    )
    for name in ("relay_pb2.py", "relay_pb2.pyi", "__init__.py"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), (
            f"{name} is stale: run python scripts/gen_proto.py"
        )
