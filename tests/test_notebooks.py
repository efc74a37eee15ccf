"""Every notebook runs top to bottom against its own LocalStack, from a copy outside
the repository (as a reader who downloaded it runs it), and the repository keeps them
without outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_the_four_notebooks_exist() -> None:
    assert [p.stem for p in NOTEBOOKS] == [
        "01-quickstart",
        "02-langchain-tools",
        "03-mcp-over-encrypted-channels",
        "04-a2a-agent-cards",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_outputs_are_stripped(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    # Run in a directory of its own: nothing of the clone (examples/, relative paths)
    # can be reached from there, only the installed packages.
    copy = Path(shutil.copy(path, tmp_path))
    notebook = nbformat.read(copy, as_version=4)  # type: ignore[no-untyped-call]
    # A per-cell limit turns a hang into a failure; how long they take is in the docs.
    client = NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on failure
    text = "".join(
        out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", [])
    )
    assert "Traceback" not in text
