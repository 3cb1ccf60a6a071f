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
from donate import _demo  # noqa: E402
from donate import _examples as examples  # noqa: E402
from donate._xla import copies as _copies  # noqa: E402


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


def _timed(fn) -> tuple[float, float]:
  """(wall seconds, CPU seconds of this process, all threads) of one call."""
  w, c = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn())
  return time.perf_counter() - w, time.process_time() - c


def measure(make, args, donate, repeats: int) -> dict:
  """Medians of wall and CPU time of the first call and of as_text + find_copies; records found."""
  first, report, found = [], [], 0
  for k in range(1, repeats + 1):
    g = jax.jit(make(k), donate_argnums=donate)
    real = _concrete(args)
    first.append(_timed(lambda: g(*real)))
    compiled = g.lower(*_abstract(args)).compile()
    jaxpr = jax.make_jaxpr(make(k))(*_abstract(args))
    report.append(_timed(lambda: _copies.find_copies(compiled.as_text(), jaxpr=jaxpr)))
    found = len(_copies.find_copies(compiled.as_text(), jaxpr=jaxpr))
  med = lambda pairs, i: statistics.median(p[i] for p in pairs)
  return {"first": med(first, 0), "first_cpu": med(first, 1), "report": med(report, 0),
          "report_cpu": med(report, 1), "found": found}


def table(quick: bool = False, repeats: int = 9) -> str:
  progs = programs(quick)
  name, sizes = _largest(progs)
  n = 3 if quick else repeats
  m = measure(*progs[name], repeats=n)
  head = ("program", "first call ms (CPU ms)", "as_text + find_copies ms (CPU ms)",
          "added, wall", "added, CPU", "copies >= 64 KiB")
  row = (name, f"{m['first'] * 1e3:.1f} ({m['first_cpu'] * 1e3:.1f})",
         f"{m['report'] * 1e3:.2f} ({m['report_cpu'] * 1e3:.2f})",
         f"{m['report'] / m['first'] * 100:.1f}%", f"{m['report_cpu'] / m['first_cpu'] * 100:.1f}%",
         str(m["found"]))
  return (f"### Copy report cost on the largest program, jax.jit first call vs the report, "
          f"median of {n}\n\n" + bench_donation._table(head, [row])
          + f"\n\nLargest compiled HLO text: {name}, {sizes}. CPU time counts every thread of "
          "this process (XLA compiles on several).")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="small sizes, fewer repeats")
  args = parser.parse_args(argv)
  print(f"Machine: {_demo.machine()}\n")
  print(table(args.quick))


if __name__ == "__main__":
  main()
