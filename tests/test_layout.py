"""Packaging: what lands in site-packages, and the command line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import svc_sdk


def test_import_names_are_prefixed() -> None:
    for name in ("svc_sdk", "svc_server", "svc_integrations", "svc_sdk._native"):
        assert importlib.util.find_spec(name) is not None, name
    # Nothing generic may be importable from the installed distribution.
    for name in ("server", "integrations", "native", "_native"):
        spec = importlib.util.find_spec(name)
        assert spec is None or "site-packages" not in str(spec.origin), name


def test_native_module_lives_inside_svc_sdk() -> None:
    from svc_sdk import _native

    assert Path(_native.__file__).parent == Path(svc_sdk.__file__).parent


def test_public_api() -> None:
    assert issubclass(svc_sdk.MlsError, RuntimeError)
    assert set(svc_sdk.__all__) <= set(dir(svc_sdk))


def test_svc_demo_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "svc_sdk.cli", "demo", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "bob said 'bob -> alice: task 0 acknowledged'" in proc.stdout
    assert proc.stdout.rstrip().endswith("decrypted by the other")


def test_cli_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "svc_sdk.cli", "no-such-command"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr
