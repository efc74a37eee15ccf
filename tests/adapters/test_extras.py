"""The adapters import their optional dependencies lazily and name the missing extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BLOCK = "import sys\nfor name in ('a2a', 'mcp'):\n    sys.modules[name] = None\n"


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_core_imports_without_the_extras() -> None:
    done = run("""
        import svc_sdk
        from svc_sdk import SvcA2AAdapter, SvcTransport, SLIMAdapter, ProtocolBridge
        assert 'a2a' not in [m for m in sys.modules if sys.modules[m] is not None]
        print('ok')
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("code", "extra"),
    [
        ("from svc_sdk import SvcA2AAdapter\nSvcA2AAdapter(None, 'x')", "a2a"),
        ("from svc_sdk.adapters.mcp import SvcMCPTransport\nSvcMCPTransport(None, 'a/b/c')", "mcp"),
    ],
)
def test_missing_extra_is_named(code: str, extra: str) -> None:
    done = run(code)
    assert done.returncode == 1
    assert "ImportError" in done.stderr
    assert f"pip install 'svc-sdk[{extra}]'" in done.stderr


def test_an_integration_names_its_missing_extra() -> None:
    # The integrations use the same public helper (svc_sdk.extras.require).
    done = run("sys.modules['langchain_core'] = None\nimport svc_integrations.langchain")
    assert done.returncode == 1
    assert "SvcToolkit needs the optional dependency 'langchain_core'" in done.stderr
    assert "pip install 'svc-sdk[langchain]'" in done.stderr


def test_unknown_attribute_is_an_attribute_error() -> None:
    import svc_sdk

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        svc_sdk.Nope  # noqa: B018
