"""A cached call of donate.jit against jax.jit's, timed in many fresh processes.

On this 2-core machine the same C++ dispatch times 0.81x to 1.08x of `jax.jit`'s from one process
to the next, however many interleaved rounds one process runs: where each side's arrays, programs
and Python objects landed in memory decides a few percent, and a process keeps its placement for
all its rounds. Rounds within one process cannot average that away; processes can (each starts
from a fresh address space), if they also vary what the machine cannot: the order in which the
two sides are made, compiled and given their arrays, which decides where each side's memory
lands relative to the other's (every process of one order lays out its heap alike). So each of
`--processes` K fresh processes (every other one making donate's side first) warms one `jax.jit`
and one donate.jit function of the step and times `--rounds` R interleaved rounds of cached calls
(`bench_pytree_cost._cached_rounds`: the order reversed every other round, each round after
`gc.collect()`), and reports the median ratio of its rounds; the table gives the median of the K
processes' ratios, their quartiles and range, and `jax.jit`'s median time. The processes run one
after another, nothing else running beside them. The step and its paths are
`bench_pytree_cost.py`'s (a dict of N float32[64] leaves, all donated; "native": outputs in input
order, `jax.jit`'s own program; "re-paired": output k from input N-1-k, donate's in-place program
with `copy_threshold=0` against `jax.jit`'s copying one; "reversed-small": the same step at the
default `copy_threshold`, `jax.jit`'s own program); "undonated" is the native step donating
nothing (no frame of donate's before its dispatch); "split" times the native step called four ways
in each process (`bench_pytree_cost.call_variants`): donate.jit's call (its dispatch behind the
`__call__` property and the one frame that names an array passed twice), its C++ dispatch alone,
and `jax.jit`'s behind one Python frame. Run:
  python benchmarks/bench_cached_call.py [--sizes 10,100,1000] [--processes 16] [--rounds 41]
      [--paths native,re-paired[,reversed-small,undonated,split]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import bench_pytree_cost as b  # beside this script, first on its path
import jax

PATHS = ("native", "re-paired", "reversed-small", "undonated", "split")


def _worker(n: int, path: str, rounds: int, donate_first: bool) -> None:
  """In a fresh process: `rounds` interleaved rounds, printed as one JSON line of seconds a call
  for each function timed. Functions are made, compiled and given their parameters `jax.jit`'s
  first, or donate's first (`donate_first`)."""
  if path == "split":  # the four ways of calling the native step, each warm and compiled
    funs = b.call_variants(n, donate_first=donate_first)
    if donate_first:
      funs = dict(reversed(funs.items()))
    times = b._interleaved(funs, b._warm(funs, n, 64), rounds, b._cached_calls(n))
  else:
    step_path, donated = ("native", None) if path == "undonated" else (path, 0)
    theirs, ours = b._cached_rounds(n, rounds, step_path, donated, donate_first)
    times = {"jax.jit": theirs, "donate.jit": ours}
  print(json.dumps(times), flush=True)


def process(n: int, path: str, rounds: int, donate_first: bool) -> dict[str, float]:
  """One fresh process: the median ratio of its rounds for each function against `jax.jit`,
  and `jax.jit`'s median seconds a call (key "jax.jit")."""
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(n), path, str(rounds),
         str(int(donate_first))]  # fmt: skip
  out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
  times = json.loads(out.strip().splitlines()[-1])
  theirs = times.pop("jax.jit")
  ratios = {k: statistics.median(o / t for o, t in zip(v, theirs)) for k, v in times.items()}
  return {"jax.jit": statistics.median(theirs), **ratios}


def rows(n: int, path: str, processes: int, rounds: int) -> list[str]:
  """A row for each function timed against `jax.jit` (donate.jit's; "split": each of
  `bench_pytree_cost.CALLS`)."""
  measured = [process(n, path, rounds, donate_first=k % 2 == 1) for k in range(processes)]
  jax_us = statistics.median(m["jax.jit"] for m in measured) * 1e6
  out = []
  for k in (k for k in measured[0] if k != "jax.jit"):
    ratios = [m[k] for m in measured]
    q1, q3 = b._quartiles(ratios)
    name = path if path != "split" else f"native: {k}"
    out.append(f"| {n} | {name} | {processes} x {rounds} | {jax_us:.1f} | "
               f"**{statistics.median(ratios):.3f}x** | {q1:.3f}-{q3:.3f} | "
               f"{min(ratios):.3f}-{max(ratios):.3f} |")  # fmt: skip
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="10,100,1000")
  parser.add_argument("--processes", type=int, default=16)
  parser.add_argument("--rounds", type=int, default=41)
  parser.add_argument("--paths", default="native,re-paired", help=", ".join(PATHS))
  parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    n, path, rounds, donate_first = args.worker
    _worker(int(n), path, int(rounds), donate_first == "1")
    return
  print(f"Machine: Python {sys.version.split()[0]}, jax {jax.__version__}, "
        f"{os.cpu_count()} cores\n")  # fmt: skip
  table: list[str] = []
  for n in (int(s) for s in args.sizes.split(",")):
    for path in args.paths.split(","):
      measured = rows(n, path, args.processes, args.rounds)
      print("\n".join(measured), file=sys.stderr, flush=True)
      table += measured
  print(f"Cached call, {args.processes} fresh processes of {args.rounds} interleaved rounds each: "
        f"ratio against `jax.jit`, median of the processes' medians\n")  # fmt: skip
  head = ("| leaves | path | processes x rounds | `jax.jit` us | ratio | quartiles of processes "
          "| range |")  # fmt: skip
  print("\n".join([head, "|---|---|---|---|---|---|---|", *table]))


if __name__ == "__main__":
  main()
