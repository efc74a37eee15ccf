"""The benchmark commands refuse bad arguments before starting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench" / "client.py"


@pytest.mark.parametrize(
    ("argument", "error"),
    [
        (["--round-trips", "0"], "--round-trips: must be at least 1, not 0"),
        (["--rounds", "-2"], "--rounds: must be at least 1, not -2"),
        (["--messages", "lots"], "--messages: 'lots' is not a whole number"),
    ],
)
def test_client_bench_rejects_bad_counts(argument: list[str], error: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), *argument], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert error in proc.stderr


E2E = Path(__file__).parents[1] / "bench" / "e2e.py"


@pytest.mark.parametrize(
    ("argument", "error"),
    [
        (["--runs", "0"], "--runs: must be at least 1, not 0"),
        (["--round-trips", "-1"], "--round-trips: must be at least 1, not -1"),
        (["--messages", "lots"], "--messages: 'lots' is not a whole number"),
    ],
)
def test_e2e_bench_rejects_bad_counts(argument: list[str], error: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(E2E), *argument], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert error in proc.stderr
