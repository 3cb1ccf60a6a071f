"""Donation benchmarks: every row is measured against `jax.jit` in the same run.

  python benchmarks/bench_donation.py [--quick]

1. swapped update, two float32[2**26] arrays: step time, temporaries and peak bytes;
2. per-call dispatch overhead of a cached call with a 10-leaf pytree;
3. first call (trace + plan + compile);
4. gradient accumulation over micro-batches (scan), donated by argnums and by donate_buffer;
5. a [T, ...] output filled slice by slice into a preallocated buffer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import donate  # noqa: E402
from benchmarks import workloads  # noqa: E402
from donate import _demo  # noqa: E402


def _table(head, rows) -> str:
  widths = [max(len(str(r[k])) for r in [head, *rows]) for k in range(len(head))]
  line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
  return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                    *map(line, rows)])


def swapped(n: int, steps: int) -> str:
  rows = _demo.compare_swapped(n, steps)
  return (f"### 1. Swapped update, two float32[{n}] arrays, {steps} timed steps\n\n"
          + _demo.table(rows, reference="jax.jit(donate_argnums=(0, 1))"))


def _per_call(fn, state, calls: int) -> float:
  for _ in range(100):
    state = fn(state)
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for _ in range(calls):
    state = fn(state)
  jax.block_until_ready(state)
  return (time.perf_counter() - t0) / calls


def dispatch(calls: int, repeats: int) -> str:
  """Per-call time of a cached call; the ratio is the median of the ratios of paired runs (one of
  each, back to back), which cancels the drift of a shared machine better than a ratio of medians."""
  step = lambda p: jax.tree.map(lambda x: x + 1.0, p)
  make = lambda: {f"w{i}": jnp.zeros(16) for i in range(10)}
  rows = []
  for donated in (True, False):
    kw = {"donate_argnums": 0} if donated else {}
    ours, theirs = donate.jit(step, **kw), jax.jit(step, **kw)
    t_ours, t_jax = [], []
    for k in range(repeats):  # interleaved, alternating which goes first
      pair = [(theirs, t_jax), (ours, t_ours)]
      for fn, times in (pair if k % 2 == 0 else pair[::-1]):
        times.append(_per_call(fn, make(), calls))
    ratio = statistics.median(a / b for a, b in zip(t_ours, t_jax))
    rows.append(("donated" if donated else "not donated",
                 f"{statistics.median(t_ours) * 1e6:.1f}", f"{statistics.median(t_jax) * 1e6:.1f}",
                 f"{ratio:.2f}x"))
  return ("### 2. Per-call dispatch, cached call, 10-leaf pytree (median of "
          f"{repeats} paired runs of {calls} calls)\n\n"
          + _table(("call", "donate.jit us", "jax.jit us", "ratio"), rows))


def _mlp_step_factory(layers: int, k: float):
  """A fresh `layers`-deep MLP training step (a new function each time, so nothing is cached)."""
  def mlp_step(params, x):
    def loss(p):
      h = x
      for w, b in p:
        h = jnp.tanh(h @ w + b)
      return jnp.mean((h + k) ** 2)
    g = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, g)
  return mlp_step


def _mlp_args(layers: int, width: int = 128):
  params = [(jnp.ones((width, width)) * 0.01, jnp.zeros(width)) for _ in range(layers)]
  return params, jnp.ones((32, width))


def _time(fn) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def first_call(repeats: int, layers: int = 8) -> str:
  """lower() and the first call (trace + plan + compile + run), against jax.jit's."""
  rows = []
  for what in ("lower()", "first call"):
    t_ours, t_jax = [], []
    for k in range(repeats):  # interleaved, fresh functions: no cache helps either side
      for jit, times, shift in ((jax.jit, t_jax, 0.0), (donate.jit, t_ours, 0.5)):
        g = jit(_mlp_step_factory(layers, float(k) + shift), donate_argnums=0)
        params, x = _mlp_args(layers)
        if what == "lower()":
          times.append(_time(lambda: (g.lower(params, x), params)[1]))
        else:
          times.append(_time(lambda: g(params, x)))
    a, b = statistics.median(t_ours), statistics.median(t_jax)
    rows.append((what, f"{a * 1e3:.1f}", f"{b * 1e3:.1f}", f"{a / b:.2f}x"))
  return (f"### 3. lower() and first call, {layers}-layer 128-wide MLP training step, "
          f"median of {repeats}\n\n"
          + _table(("stage", "donate.jit ms", "jax.jit ms", "ratio"), rows))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
  args = parser.parse_args(argv)
  quick = args.quick
  print(f"Machine: {_demo.machine()}\n")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    print(swapped(2**20 if quick else 2**26, 3 if quick else 10), "\n")
    print(dispatch(200 if quick else 2000, 3 if quick else 15), "\n")
    print(first_call(3 if quick else 9), "\n")
    print(workloads.grad_accum_table(), "\n")
    print(workloads.prealloc_slices_table(quick), "\n")


if __name__ == "__main__":
  main()
