"""Runs every notebook source top to bottom in a fresh kernel; any failing cell fails the test.

The sources are notebooks/*.py (jupytext percent format); tests/test_structure.py checks that the
committed .ipynb and docs/notebooks/*.html match them. Each runs as `scripts/notebooks.py` runs it
when it writes the .ipynb: in a new "python3" kernel working in notebooks/, importing this checkout's
`donate` (PYTHONPATH points at the repository root, which also works when the package is installed
with `pip install -e .`). Nothing is written. The cells check the facts their text states, so a
notebook whose text has become false fails here.
"""

import importlib.util
import pathlib

import pytest

pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("notebook_tool", REPO / "scripts" / "notebooks.py")
notebook_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebook_tool)


def test_there_are_notebooks():
  assert len(notebook_tool.sources()) >= 4


@pytest.mark.parametrize("source", notebook_tool.sources(), ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(source):
  nb = notebook_tool.read_source(source)
  try:
    notebook_tool.execute(nb)
  except nbclient.exceptions.CellExecutionError as e:
    pytest.fail(f"{source.name}: a cell failed\n{e}", pytrace=False)
  executed = [c for c in nb.cells if c.cell_type == "code"]
  assert executed and all(c.execution_count is not None for c in executed)
  errors = [o for c in executed for o in c.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors, errors
