"""Runs every notebook source top to bottom in a fresh kernel; any failing cell fails the test.

The sources are notebooks/*.py (jupytext percent format); tests/test_structure.py checks that the
committed .ipynb and docs/notebooks/*.html match them. Each runs as `scripts/notebooks.py` runs it
when it writes the .ipynb: in a new "python3" kernel working in notebooks/, importing the `donate`
the tests import (this checkout's, put first on PYTHONPATH, or the installed wheel's when
`scripts/wheel.sh` runs the tests against it). Nothing is written. The cells check the facts their text states, so a
notebook whose text has become false fails here; a notebook that reads as a user's story keeps its
checks here instead (`CHECKS`: a last cell run in the same kernel, after the notebook's own).
"""

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("notebook_tool", REPO / "scripts" / "notebooks.py")
notebook_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebook_tool)


# Notebook stem -> a cell run after the notebook's last one, in its kernel: the facts its text states.
CHECKS = {
    "01_donation_from_warning_to_plan": """
assert sum(d.action == "aliased" for d in plan.decisions) == 5 and len(plan.unusable) == 2
assert (plan.requested_bytes, plan.reused_bytes) == (172_164, 32_900)  # 168.1 KiB, 32.1 KiB
mib = [(round(temp / MiB), round(peak / MiB)) for temp, peak, _ in rows.values()]
assert mib == [(0, 32), (32, 64), (0, 64)]  # (temporaries, peak) in MiB, as the text says
""",
    "02_training_loop": """
plain, jax_donated, ignored, donated, annotated = (peak / MiB for peak in peaks.values())
assert ignored == plain and jax_donated == donated == annotated  # the claims of the text
assert abs(plain - 9.83) < 0.05 and abs(donated - 7.83) < 0.05 and abs(floor / MiB - 6.51) < 0.01
assert loss_addresses == {loss_address} and w1_addresses == {w1_address}
assert losses_per_step[0] > 0.9 and losses_per_step[-1] < 0.3
body = next(p for name, p in plans.items() if name.endswith("donate_buffer in body"))
requested = [d.source for d in body.decisions if d.requested]
assert requested and all(s.startswith("donate_buffer at In[") for s in requested), requested
copied = [line for r in REPORTS["decode_copying"] for line in (r.value, *r.lines)]
assert copied and all("In[" in s and "ipykernel" not in s for s in copied), copied
""",
    "03_collectives_and_symmetric_memory": """
assert same and bool(jnp.allclose(out, reference)) and x.is_deleted()
assert len(buffers) == 4 and sum(b.over_allocated_bytes for b in buffers) == 2048
assert plan.collective_memory_bytes == 8192 and len(plan.notes) == 2
assert pool.nbytes == pool.lower_bound_bytes == 4096 and len(pool.allocations) == 4
if GPU_AOT:
    records = checks["h100"].report.records
    assert len(records) == 8 and all(r.placed for r in records)
    assert len({r.instruction for r in records}) == 1  # one all-reduce, the combiner's
    assert all(c.planned_bytes == 256 * 1024 < c.memory.nbytes / 30 for c in checks.values())
    assert all(8 * 2**20 <= c.memory.nbytes <= 10 * 2**20 for c in checks.values())
""",
    "04_planner": """
assert (pool.nbytes, pool.lower_bound_bytes, plan.arena.nbytes) == (192, 192, 256)
assert [pool.offsets[n] for n in ("buf1", "buf2", "buf3", "buf8")] == [0, 64, 128, 0]
if capacity:  # the text is about instance K
    assert round(greedy.ratio, 3) == 1.189 and searched.optimal and searched.height == capacity
assert all(ours <= xla for *_, xla, ours, _ in rows)
assert len(rows) == 16 and sum(ours < xla for *_, xla, ours, _ in rows) == 9
assert best[:2] == ("prefill", "h100")
assert (round(best[3] / 2**20, 1), round(best[4] / 2**20, 1)) == (108, 100)
""",
    "05_where_the_memory_goes": """
stats = step.lower(params, momentum, tokens).compile().memory_analysis()
assert profile.temp_bytes == stats.temp_size_in_bytes
assert profile.alias_bytes == stats.alias_size_in_bytes > 0
assert profile.attributed_fraction() >= 0.95
cells = [line.source for line in profile.by_line()]
assert cells and all(s.startswith("In[") and "ipykernel" not in s for s in cells), cells
measured = [a for a in remedies if a.measured]
assert measured and all(a.saving_bytes == profile.peak_bytes - a.peak_bytes for a in measured)
if GPU_AOT:
    assert on_h100.platform == "gpu" and on_h100.fits("h100")
    assert on_h100.argument_bytes < profile.argument_bytes  # a shard per device
assert comparison.delta == nnx_profile.peak_bytes - plain_profile.peak_bytes
assert (advice[0].path, advice[0].keyword) == ("cache", "donate_argnums=0")
assert before.peak_bytes - after.peak_bytes == advice[0].nbytes
assert ("temporary of exp" in plan.decisions[0].reason) == bool(temporary)
assert plan.profile.donation_saved_bytes == x.nbytes  # measured: compiled without the donation
""",
}


def test_there_are_notebooks():
  assert len(notebook_tool.sources()) >= 4


@pytest.mark.parametrize("source", notebook_tool.sources(), ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(source):
  nb = notebook_tool.read_source(source)
  if source.stem in CHECKS:
    nbformat = pytest.importorskip("nbformat")
    nb.cells.append(nbformat.v4.new_code_cell(CHECKS[source.stem]))
  try:
    notebook_tool.execute(nb)
  except nbclient.exceptions.CellExecutionError as e:
    pytest.fail(f"{source.name}: a cell failed\n{e}", pytrace=False)
  executed = [c for c in nb.cells if c.cell_type == "code"]
  assert executed and all(c.execution_count is not None for c in executed)
  errors = [o for c in executed for o in c.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors, errors


def test_notebook_03_without_the_gpu_aot_extra_says_what_to_install_and_skips_its_gpu_cells():
  nbformat = pytest.importorskip("nbformat")
  source = next(s for s in notebook_tool.sources() if s.name.startswith("03_"))
  nb = notebook_tool.read_source(source)
  at = next(i for i, c in enumerate(nb.cells) if "GPU_AOT = targets.available()" in c.source)
  nb.cells.insert(at, nbformat.v4.new_code_cell(
      "from donate import targets\ntargets.available = lambda: False  # as without the extra"))
  notebook_tool.execute(nb)
  said = [o.get("text", "") for o in nb.cells[at + 1].outputs]
  assert any('pip install "jax-donate[gpu-aot]"' in text for text in said), said
  gpu_cells = [c for c in nb.cells[at + 2:] if c.cell_type == "code"]
  assert len(gpu_cells) >= 5 and all(c.source.startswith("if GPU_AOT:") for c in gpu_cells)
  assert not [o for c in gpu_cells for o in c.outputs]  # skipped: nothing ran, nothing failed
