"""Packaging: what lands in site-packages, and the command line."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import svc_sdk

ROOT = Path(__file__).resolve().parent.parent


def test_import_names_are_prefixed() -> None:
    for name in ("svc_sdk", "svc_server", "svc_integrations", "svc_cli", "svc_sdk._native"):
        assert importlib.util.find_spec(name) is not None, name


def test_wheel_holds_only_prefixed_packages_and_every_module(tmp_path: Path) -> None:
    """The built wheel: nothing generic at the top level, the extension inside svc_sdk,
    and every source module of the three folders (a subpackage missing from the explicit
    package list in pyproject.toml would silently drop out)."""
    # Built from a copy of the source: an in-tree build reuses build/, whose stale files
    # would hide a package that the list no longer names. The cargo target dir is shared.
    source, out = tmp_path / "src", tmp_path / "wheel"
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        target = source / name.decode()
        if (ROOT / name.decode()).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name.decode(), target)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(out)],
        check=True,
        capture_output=True,
        timeout=900,
        env={**os.environ, "CARGO_TARGET_DIR": str(ROOT / "target")},
    )
    (wheel,) = out.glob("svc_sdk-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/")[0] for n in names}
    assert top == {
        "svc_sdk",
        "svc_server",
        "svc_integrations",
        "svc_cli",
        wheel.name.split("-cp")[0] + ".dist-info",
    }
    assert any(n.startswith("svc_sdk/_native.") and n.endswith(".so") for n in names)
    for folder, package in (
        ("src/svc_sdk", "svc_sdk"),
        ("server", "svc_server"),
        ("integrations", "svc_integrations"),
        ("cli", "svc_cli"),
    ):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".pyi", ".mako") or path.name == "py.typed":
                wanted = f"{package}/{path.relative_to(ROOT / folder).as_posix()}"
                assert wanted in names, f"{wanted} is missing from the wheel"


def imported_modules(folder: Path) -> list[tuple[str, str]]:
    """(file, module) for every absolute import under ``folder``, those inside functions
    and ``if TYPE_CHECKING:`` included. ``from a import b`` counts as ``a.b``: b may be a
    module."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(where, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found += [(where, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_the_servers_use_only_the_shared_protocol_module() -> None:
    """The servers depend on the library only through ``svc_sdk.protocol``: the rest of
    the library, private modules above all, may change without them."""
    wrong = [
        (where, module)
        for where, module in imported_modules(ROOT / "server")
        if module.split(".")[0] == "svc_sdk"
        and module != "svc_sdk.protocol"
        and not module.startswith("svc_sdk.protocol.")
    ]
    assert wrong == []


def test_the_library_never_imports_what_is_built_on_it() -> None:
    """svc_sdk is the bottom layer: the servers, the integrations and the ``svc`` command
    import it, never the other way round (which was an import cycle through ``svc``)."""
    above = {"svc_server", "server", "svc_integrations", "integrations", "svc_cli", "cli"}
    wrong = [
        (where, module)
        for where, module in imported_modules(ROOT / "src" / "svc_sdk")
        if module.split(".")[0] in above
    ]
    assert wrong == []


def test_a_relay_process_loads_none_of_the_client() -> None:
    """``svc relay`` imports ``svc_sdk.protocol``; that must not drag in the client (its
    HTTP stack, relay link and asyncio API), which cost every relay ~7 MiB of RSS.
    Checked in a fresh interpreter: this one has the whole library loaded already."""
    code = (
        "import sys, svc_cli, svc_server.relay.server\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('svc_sdk', 'httpx')))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(done.stdout.split())
    assert "svc_sdk.protocol" in loaded
    assert loaded.isdisjoint({"httpx", "svc_sdk.client", "svc_sdk.aio", "svc_sdk.relay_link"})


def test_native_module_lives_inside_svc_sdk() -> None:
    from svc_sdk import _native

    assert Path(_native.__file__).parent == Path(svc_sdk.__file__).parent


def test_public_api() -> None:
    # One hierarchy: the engine raises the library's own classes (svc_sdk/errors.py).
    assert issubclass(svc_sdk.PolicyError, svc_sdk.MlsError)
    assert issubclass(svc_sdk.MlsError, svc_sdk.SvcError)
    assert issubclass(svc_sdk.SvcError, RuntimeError)
    assert set(svc_sdk.__all__) <= set(dir(svc_sdk))
    # Each name loads its module on first use (svc_sdk/__init__.py): each must resolve.
    for name in svc_sdk.__all__:
        assert getattr(svc_sdk, name) is not None, name


def test_svc_demo_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "svc_cli", "demo", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "alice | received 'hello alice #1'" in out
    assert "bob | received 're: hello alice #1', round trip" in out
    assert "alice | members: alice, bob" in out
    assert out.rstrip().endswith("every message crossed the relay as MLS ciphertext")


def test_cli_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "svc_cli", "no-such-command"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr


def test_api_reference_is_current() -> None:
    """docs/reference.md is generated from the docstrings; regenerate it after changes."""
    done = subprocess.run(
        [sys.executable, "scripts/gen_reference.py", "--check"],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _requirements(extra: str) -> set[str]:
    """Distribution names that ``svc-sdk[extra]`` installs directly, extras followed."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    names: set[str] = set()
    for text in requires("svc-sdk") or []:
        req = Requirement(text)
        if req.marker is None:
            names.add(req.name)
        elif req.marker.evaluate({"extra": extra}):
            if req.name == "svc-sdk":
                for nested in req.extras:
                    names |= _requirements(nested)
            else:
                names.add(req.name)
    return names


def test_notebooks_extra_installs_what_the_notebooks_import() -> None:
    import ast
    import json
    from importlib.metadata import packages_distributions

    wanted = _requirements("notebooks")
    assert {"jupyterlab", "nbclient", "ipykernel"} <= wanted
    owners = packages_distributions()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                # The standard library, svc itself, and langchain_openai (used only when
                # installed and an OpenAI key is set).
                optional = top == "langchain_openai"
                if top in sys.stdlib_module_names or top.startswith("svc_") or optional:
                    continue
                dists = {d.lower() for d in owners.get(top, [])}
                assert dists & wanted, f"{notebook.name} imports {top}, not in [notebooks]"
