"""The benchmark commands refuse bad arguments before starting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"


@pytest.mark.parametrize(
    ("script", "argument", "error"),
    [
        ("client.py", ["--round-trips", "0"], "--round-trips: must be at least 1, not 0"),
        ("client.py", ["--rounds", "-2"], "--rounds: must be at least 1, not -2"),
        ("client.py", ["--messages", "lots"], "--messages: 'lots' is not a whole number"),
        ("state_cipher.py", ["--rounds", "0"], "--rounds: must be at least 1, not 0"),
        ("state_cipher.py", ["--sizes", "256,big"], "--sizes: sizes: 'big' is not a whole number"),
        ("e2e.py", ["--runs", "0"], "--runs: must be at least 1, not 0"),
        ("e2e.py", ["--round-trips", "-1"], "--round-trips: must be at least 1, not -1"),
        ("e2e.py", ["--messages", "lots"], "--messages: 'lots' is not a whole number"),
        ("rtt_legs.py", ["--pings", "0"], "--pings: must be at least 1, not 0"),
        ("rtt_legs.py", ["--pings", "5"], "--pings must be more than --warm-up"),
        ("rtt_legs.py", ["--slowest", "-1"], "--slowest: must be at least 0, not -1"),
        ("log_stalls.py", ["--rounds", "0"], "--rounds: must be at least 1, not 0"),
        ("log_stalls.py", ["--seconds", "0.5"], "--seconds: '0.5' is not a whole number"),
        (
            "log_stalls.py",
            ["--dir", "/nonexistent/svc"],
            "--dir: /nonexistent/svc is not a directory",
        ),
        ("receiver_memory.py", ["--runs", "0"], "--runs: must be at least 1, not 0"),
        ("relay_memory.py", ["--streams", "0"], "--streams: must be at least 1, not 0"),
        ("hostile_frames.py", ["--calls", "0"], "--calls: must be at least 1, not 0"),
        ("refused_requests.py", ["--pings", "10"], "--pings: must be at least 100, not 10"),
        ("refused_requests.py", ["--streams", "0"], "--streams: must be at least 1, not 0"),
        ("relay_memory.py", ["--publishes", "lots"], "--publishes: 'lots' is not a whole number"),
        ("receiver_memory.py", ["--size", "916481"], "--size: must be 1 to 916480, not 916481"),
    ],
)
def test_bench_rejects_bad_counts(script: str, argument: list[str], error: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *argument], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert error in proc.stderr
