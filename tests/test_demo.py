"""The main job (`python -m donate`) and the benchmark helpers run and report real figures."""

from donate import __main__ as demo
from donate import _demo


def test_demo_prints_the_plan_and_the_table(capsys):
  demo.main(["--elements", "16384", "--steps", "2"])  # 64 KiB: copy_threshold
  out = capsys.readouterr().out
  assert "DonationPlan for swapped_update" in out
  rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
  assert set(rows) >= {"donate.jit", "jax.jit(donate_argnums=(0, 1))", "jax.jit (no donation)"}
  assert "| 0 B " in rows["donate.jit"] and "0.50x" in rows["donate.jit"]  # no temporaries
  why = [line for line in out.splitlines() if line.startswith("Why jax.jit copies:")]
  assert len(why) == 1 and "first come, first served (a -> out[0], b -> out[1])" in why[0]


def test_swapped_rows_come_from_the_compiled_programs():
  rows = {r.name: r for r in _demo.compare_swapped(2**14, steps=1)}
  ours, theirs = rows["donate.jit"], rows["jax.jit(donate_argnums=(0, 1))"]
  assert ours.memory.temp == 0 and theirs.memory.temp == 2 * 2**14 * 4  # both copied
  assert ours.reused == ours.donated == 2 * 2**14 * 4
  assert ours.memory.peak < 0.51 * rows["jax.jit (no donation)"].memory.peak
