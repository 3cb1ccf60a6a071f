"""The main job (`python -m donate`) and the benchmark helpers run and report real figures."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

import donate
from donate import __main__ as demo
from donate import _demo, _examples
from donate._base import startup


def test_demo_prints_the_plan_the_table_and_the_doctor(capsys):
  demo.main(["--elements", "16384", "--steps", "2", "--layers", "1", "--width", "32"])  # 64 KiB
  out = capsys.readouterr().out
  assert "DonationPlan for swapped_update" in out
  rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
  assert set(rows) >= {"donate.jit", "jax.jit(donate_argnums=(0, 1))", "jax.jit (no donation)"}
  assert "| 0 B " in rows["donate.jit"] and "0.50x" in rows["donate.jit"]  # no temporaries
  text = " ".join(out.split())
  assert "Why jax.jit copies: it pairs donated inputs with outputs first come, first served" in text
  assert "(a -> out[0], b -> out[1])" in text
  assert "Why no donation can beat jax.jit's donating row" in text
  doctor = out[out.index("2. The memory doctor") :]
  assert "a 1-layer transformer (d_model 32" in doctor and "activations" in doctor
  # The user's own frame: the model's line, or, with donate installed from its wheel (the model's
  # file then in site-packages), the frame that called it: this test's. Its category (the forward's
  # activations or the backward's temporaries) is XLA's schedule's, which jax 0.12.1 changed.
  top = next(line for line in doctor.splitlines() if line.startswith("the line that holds most:"))
  assert re.search(r" at (_examples|test_demo)\.py:\d+ \((activations|temporaries)\)$", top), top
  assert "remedy, measured by a compile: donate_argnums=(0, 1): peak" in doctor


def test_the_doctors_remedy_is_the_peak_of_the_donating_compile():
  found = _demo.doctor(layers=1, d_model=32, batch=2, seq=16)
  p = found.profile
  assert sum(g.total_bytes for g in p.by_category()) == p.peak_bytes
  assert {"activations", "optimizer state", "parameters"} <= {g.key for g in p.by_category()}
  assert p.by_line()[0].total_bytes == max(line.total_bytes for line in p.by_line())
  params = _examples.lm_init(jax.random.key(0), d_model=32, layers=1, d_ff=128)
  opt = _examples.adam_init(params)
  tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, 512)
  donating = jax.jit(_examples.lm_train_step, donate_argnums=(0, 1))
  assert found.remedy.how == "donate_argnums=(0, 1)"
  assert found.remedy.peak_bytes == donate.memory_profile(donating, params, opt, tokens).peak_bytes
  assert found.remedy.peak_bytes < p.peak_bytes
  assert "remedy, measured by a compile: donate_argnums=(0, 1)" in _demo.doctor_text(found)


def test_swapped_rows_come_from_the_compiled_programs():
  rows = {r.name: r for r in _demo.compare_swapped(2**14, steps=1)}
  ours, theirs = rows["donate.jit"], rows["jax.jit(donate_argnums=(0, 1))"]
  assert ours.memory.temp == 0 and theirs.memory.temp == 2 * 2**14 * 4  # both copied
  assert ours.reused == ours.donated == 2 * 2**14 * 4
  assert ours.memory.peak < 0.51 * rows["jax.jit (no donation)"].memory.peak


@pytest.mark.slow
@pytest.mark.skipif(any(os.path.exists(d) for d in startup.NVIDIA_DEVICES),
                    reason="an NVIDIA GPU is visible: JAX's CUDA lines are real")
def test_the_demo_on_a_machine_without_a_gpu_says_nothing_about_cuda(tmp_path):
  # As a user's shell runs it: no JAX_PLATFORMS, nothing the test session set for JAX.
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", startup.SKIP_CHECK)}
  repo = str(pathlib.Path(__file__).resolve().parent.parent)
  env["PYTHONPATH"] = os.pathsep.join([repo, *filter(None, [env.get("PYTHONPATH")])])
  args = ["--elements", "16384", "--steps", "1", "--layers", "1", "--width", "32"]
  ran = subprocess.run([sys.executable, "-m", "donate", *args], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
  assert ran.returncode == 0, ran.stderr
  assert "DonationPlan for swapped_update" in ran.stdout and "2. The memory doctor" in ran.stdout
  assert "cuda" not in (ran.stdout + ran.stderr).lower(), ran.stderr
