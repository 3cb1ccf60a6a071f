"""Tests for the converter from XLA's buffer-assignment dumps to packing problems
(``benchmarks/xla_dump.py``) and for the corpus made with it (``benchmarks/corpus``)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from donate._planner.offsets import assign_offsets

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for benchmarks/; last, so it never shadows an installed donate

from test_offsets import sweep_check  # noqa: E402

from benchmarks import xla_dump  # noqa: E402

# A training step with a scan: loop carries and in-place updates make XLA share memory.
PROGRAM = """
import jax, jax.numpy as jnp
def step(w, x):
    def loss(w):
        h, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)
        return jnp.mean(h ** 2)
    return w - 0.1 * jax.grad(loss)(w)
jax.jit(step, donate_argnums=0).lower(jax.ShapeDtypeStruct((6, 64, 64), jnp.float32),
                                     jax.ShapeDtypeStruct((32, 64), jnp.float32)).compile()
"""


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
  folder = tmp_path_factory.mktemp("dump")
  env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={folder} --xla_dump_hlo_as_text "
             "--xla_dump_hlo_module_re=jit_step", JAX_PLATFORMS="cpu")
  subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, timeout=300)
  return xla_dump.read(xla_dump.find_module(folder, "jit_step"))


def test_xla_offsets_are_a_valid_packing_of_the_buffers_written(dumped, tmp_path):
  assert len(dumped.sizes) > 5 and dumped.values >= len(dumped.sizes)
  height = sweep_check(dumped.sizes, dumped.lowers, dumped.uppers, dumped.xla_offsets)
  assert 0 < height <= dumped.xla_total
  dumped.write(tmp_path / "p")
  with open(tmp_path / "p.csv") as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0]) == ["id", "lower", "upper", "size"]
  assert [int(r["size"]) for r in rows] == list(dumped.sizes)
  with open(tmp_path / "p.xla.csv") as f:
    assert [int(r["offset"]) for r in csv.DictReader(f)] == list(dumped.xla_offsets)


def test_planner_is_no_worse_than_xla_on_its_own_buffers(dumped):
  result = assign_offsets(dumped.sizes, dumped.lowers, dumped.uppers, alignment=64, time_limit=5)
  ours = sweep_check(dumped.sizes, dumped.lowers, dumped.uppers, result.offsets)
  assert ours <= dumped.xla_total


def test_corpus_files_match_their_index():
  corpus = ROOT / "benchmarks" / "corpus"
  with open(corpus / "index.csv") as f:
    index = list(csv.DictReader(f))
  assert {r["platform"] for r in index} == {"cpu", "h100"}
  assert len({r["program"] for r in index}) >= 8
  for row in index:
    prefix = corpus / f"{row['program']}.{row['platform']}"
    with open(f"{prefix}.csv") as f:
      rows = list(csv.DictReader(f))
    with open(f"{prefix}.xla.csv") as f:
      offsets = [int(r["offset"]) for r in csv.DictReader(f)]
    assert len(rows) == len(offsets) == int(row["buffers"])
    sizes = [int(r["size"]) for r in rows]
    height = sweep_check(sizes, [int(r["lower"]) for r in rows], [int(r["upper"]) for r in rows],
                         offsets)
    assert height <= int(row["xla_total"])
    assert all(o % int(row["alignment"]) == 0 for o in offsets)
