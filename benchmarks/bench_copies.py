"""What the copy report costs: `find_copies` on the benchmark suite's largest program, against
that program's `jax.jit` first call (trace + compile + run), measured in the same run.

  python benchmarks/bench_copies.py [--quick]

"Largest" is the program of `bench_donation.py` / `workloads.py` with the longest compiled HLO
text. The report reads the text `Compiled.as_text()` returns (which `donate.jit` already reads
for its alias check) and the traced jaxpr; both timings are medians of interleaved repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks import bench_donation  # noqa: E402
from donate import _copies  # noqa: E402
from donate import _demo  # noqa: E402
from donate import examples  # noqa: E402


def programs(quick: bool) -> dict:
  """name -> (function factory, arguments, donate_argnums) for each program of the suite."""
  n = 2**20 if quick else 2**26
  big = jax.ShapeDtypeStruct((n,), jnp.float32)
  params = examples.mlp_init(jax.random.key(0))
  acc = jax.tree.map(jnp.zeros_like, params)
  batches = examples.micro_batches(jax.random.key(1))
  mlp_params, mlp_x = bench_donation._mlp_args(8)
  T, D = (64, 1024) if quick else (256, 16384)
  xs = jax.ShapeDtypeStruct((T, D), jnp.float32)
  return {
      "swapped update": (lambda k: _fresh(_demo.swapped_update, k), (big, big), (0, 1)),
      "8-layer MLP step": (lambda k: bench_donation._mlp_step_factory(8, float(k)),
                           (mlp_params, mlp_x), 0),
      "gradient accumulation (scan)": (lambda k: _fresh(examples.grad_accum_step, k),
                                       (params, acc, batches), (0, 1)),
      "fill_fori": (lambda k: _fresh(examples.fill_fori, k), (xs,), ()),
      "fill_map": (lambda k: _fresh(examples.fill_map, k), (xs,), ()),
  }


def _fresh(fn, k):
  """A new function object each time, so no jit cache serves a repeat."""
  def f(*args):
    return fn(*args)
  f.__name__ = f"{fn.__name__}_{k}"
  return f


def _largest(progs: dict) -> tuple[str, str]:
  sizes = {}
  for name, (make, args, donate) in progs.items():
    sizes[name] = len(jax.jit(make(0), donate_argnums=donate).lower(*_abstract(args))
                      .compile().as_text())
  name = max(sizes, key=sizes.get)
  return name, f"{sizes[name]:,} characters (others: " + ", ".join(
      f"{k} {v:,}" for k, v in sizes.items() if k != name) + ")"


def _concrete(args):
  """Fresh arrays for one call (donation consumes them)."""
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype)
                      if isinstance(x, jax.ShapeDtypeStruct) else jnp.copy(x), args)


def _abstract(args):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)


def measure(make, args, donate, repeats: int) -> tuple[float, float, float, int]:
  """Medians (first call s, find_copies s, as_text + find_copies s) and the records found."""
  t_first, t_find, t_text, found = [], [], [], 0
  for k in range(1, repeats + 1):
    g = jax.jit(make(k), donate_argnums=donate)
    real = _concrete(args)
    t0 = time.perf_counter()
    jax.block_until_ready(g(*real))
    t_first.append(time.perf_counter() - t0)
    compiled = g.lower(*_abstract(args)).compile()
    jaxpr = jax.make_jaxpr(make(k))(*_abstract(args))
    text = compiled.as_text()
    t0 = time.perf_counter()
    found = len(_copies.find_copies(text, jaxpr=jaxpr))
    t_find.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _copies.find_copies(compiled.as_text(), jaxpr=jaxpr)
    t_text.append(time.perf_counter() - t0)
  return (statistics.median(t_first), statistics.median(t_find), statistics.median(t_text),
          found)


def table(quick: bool = False, repeats: int = 9) -> str:
  progs = programs(quick)
  name, sizes = _largest(progs)
  first, find, text, found = measure(*progs[name], repeats=3 if quick else repeats)
  head = ("program", "jax.jit first call ms", "find_copies ms", "as_text + find_copies ms",
          "added", "copies >= 64 KiB")
  row = (name, f"{first * 1e3:.1f}", f"{find * 1e3:.2f}", f"{text * 1e3:.2f}",
         f"{text / first * 100:.1f}%", str(found))
  return (f"### Copy report cost on the largest program, median of {3 if quick else repeats}\n\n"
          + bench_donation._table(head, [row])
          + f"\n\nLargest compiled HLO text: {name}, {sizes}.")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="small sizes, fewer repeats")
  args = parser.parse_args(argv)
  print(f"Machine: {_demo.machine()}\n")
  print(table(args.quick))


if __name__ == "__main__":
  main()
