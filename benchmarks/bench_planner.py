"""Benchmarks ``donate.planner.assign_offsets``: MiniMalloc, compiler traces, XLA's own programs.

Usage::

  python benchmarks/bench_planner.py [--time-limit S] [--only minimalloc traces synthetic xla]
                                     [--data DIR] [--traces PATH ...]

Every table minimises the height (no capacity) under a time limit per instance (10 s by default),
and every answer is checked by an overlap validator written here. Ratios are against the lower
bound (the most bytes live at one moment) and, for XLA's programs, against XLA's own packing.

1. MiniMalloc "challenging" (``DIR/minimalloc/challenging``, by default the repository's copy in
   ``tests/data/planner-bench``): 11 instances of 150-450 buffers, capacity 1048576 in the paper.
2. Compiler traces (``--traces``: CSV files or folders of them, same format), e.g. ResNet-50 and
   PanGu-2.6B from MindSpore's SOMAS and three auto-sharding search traces (``G_1``, ``S_1``,
   ``Y_1``) from the idealloc repository's ``benchmarks/`` folder. Each runs in a child process
   that reports its peak resident memory and when its first answer was ready.
3. A synthetic 100,000-buffer step-per-op graph, in a child process likewise.
4. The XLA corpus (``benchmarks/corpus``, made by ``xla_corpus.py``): XLA's heap simulator's
   allocation for its temp buffers against ours for the same buffers with XLA's alignment.
5. Deadlines: wall time of whole calls against their ``time_limit``, from 0.5 s to 5 s, on the
   largest instances at hand.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from donate._planner.offsets import assign_offsets  # noqa: E402  (after the path tweak)

CAPACITY = 1048576
FILES = tuple("ABCDEFGHIJK")


def default_data() -> Path:
  return HERE.parent / "tests" / "data" / "planner-bench"


def load(path: Path):
  """Reads a MiniMalloc CSV (``id,lower,upper,size``, half-open ``[lower, upper)``)."""
  with open(path) as f:
    rows = list(csv.DictReader(f))
  return (np.array([int(r["size"]) for r in rows], np.int64),
          np.array([int(r["lower"]) for r in rows], np.int64),
          np.array([int(r["upper"]) for r in rows], np.int64))


def validate(sizes, starts, ends, offsets) -> int:
  """Raises if two buffers that meet in time overlap in memory; returns the height.

  Sorted by start, the buffers that start while buffer k is live are a slice after it, and every
  pair that meets in time has one member starting while the other is live.
  """
  sizes, starts, ends, offsets = (np.asarray(v, np.int64) for v in (sizes, starts, ends, offsets))
  keep = np.flatnonzero(sizes > 0)
  order = keep[np.argsort(starts[keep], kind="stable")]
  low, size, first = offsets[order], sizes[order], starts[order]
  stop = np.searchsorted(first, ends[order], side="left")
  for k in np.flatnonzero(stop > np.arange(len(order)) + 1).tolist():
    j = slice(k + 1, stop[k])
    if np.any((low[j] < low[k] + size[k]) & (low[k] < low[j] + size[j])):
      raise AssertionError(f"buffer {order[k]} overlaps a buffer live with it")
  assert (offsets >= 0).all()
  return int((offsets[keep] + sizes[keep]).max(initial=0))


def synthetic(n: int = 100_000, seed: int = 0):
  """A step-per-op graph: most values die within a few ops, 3% live for 20-300 ops."""
  rng = np.random.default_rng(seed)
  starts = np.arange(n)
  lengths = 1 + rng.geometric(0.3, n)
  long = rng.random(n) < 0.03
  lengths[long] = rng.integers(20, 300, long.sum())
  sizes = 1024 * 2 ** rng.integers(0, 12, n) * rng.integers(1, 4, n)
  return sizes, starts, starts + lengths


def solve(sizes, starts, ends, time_limit, alignment=1) -> dict:
  """One minimising run, validated; the figures of a table row."""
  cpu = time.process_time()
  result = assign_offsets(sizes, starts, ends, time_limit=time_limit, alignment=alignment)
  cpu = time.process_time() - cpu
  height = validate(sizes, starts, ends, result.offsets)
  return {"buffers": len(sizes), "lb": result.lower_bound, "greedy": result.greedy_height,
          "height": height, "padded": result.height, "first": result.first_seconds,
          "seconds": result.seconds, "cpu": cpu, "optimal": result.optimal,
          "method": result.method}


def child(spec: str, time_limit: float) -> None:
  """Runs one instance ("synthetic" or a CSV path) and prints its figures and peak RSS as JSON."""
  base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  data = synthetic() if spec == "synthetic" else load(Path(spec))
  row = solve(*data, time_limit)
  row["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  row["base_mib"] = base / 1024
  print(json.dumps(row))


def in_child(spec: str, time_limit: float) -> dict:
  out = subprocess.run([sys.executable, __file__, "--child", spec, "--time-limit", str(time_limit)],
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def ratio(a, b) -> str:
  return f"{a / b:.4f}" if b else "-"


def print_table(title, columns, rows) -> None:
  print(f"\n#### {title}\n")
  rows = [[str(c) for c in r] for r in rows]
  widths = [max(len(r[k]) for r in [list(columns), *rows]) for k in range(len(columns))]
  line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"
  print(line(columns))
  print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
  for r in rows:
    print(line(r))
  sys.stdout.flush()


def minimalloc_table(folder: Path, time_limit: float) -> None:
  if not folder.is_dir():
    print(f"skipping the MiniMalloc files: {folder} not found (use --data)")
    return
  rows = []
  for name in FILES:
    r = solve(*load(folder / f"{name}.{CAPACITY}.csv"), time_limit)
    rows.append([name, r["buffers"], r["lb"], r["greedy"], ratio(r["greedy"], r["lb"]),
                 r["height"] if not r["optimal"] else f"{r['height']} (optimal)",
                 ratio(r["height"], r["lb"]), "yes" if r["height"] <= CAPACITY else "no",
                 f"{r['seconds']:.2f}"])
  print_table(f"MiniMalloc challenging, minimising, {time_limit:g} s each",
              ("file", "buffers", "lower bound", "greedy", "greedy/LB", "height", "height/LB",
               f"<= {CAPACITY}", "seconds"), rows)


def large_table(specs: list[str], time_limit: float) -> None:
  rows = []
  for spec in specs:
    r = in_child(spec, time_limit)
    name = "synthetic 100k" if spec == "synthetic" else Path(spec).stem
    rows.append([name, r["buffers"], r["lb"], f"{r['first']:.2f}", ratio(r["greedy"], r["lb"]),
                 r["height"], ratio(r["height"], r["lb"]), f"{r['seconds']:.2f}",
                 f"{r['cpu']:.2f}", f"{r['rss_mib']:.0f} ({r['base_mib']:.0f})"])
  print_table(f"Large instances, minimising, {time_limit:g} s each (one child process each)",
              ("instance", "buffers", "lower bound", "first answer s", "greedy/LB", "height",
               "height/LB", "seconds", "CPU s", "peak RSS MiB (after import)"), rows)


def xla_table(corpus: Path, time_limit: float) -> None:
  with open(corpus / "index.csv") as f:
    index = list(csv.DictReader(f))
  rows = []
  for e in index:
    prefix = corpus / f"{e['program']}.{e['platform']}"
    sizes, starts, ends = load(Path(f"{prefix}.csv"))
    with open(f"{prefix}.xla.csv") as f:
      xla_offsets = [int(r["offset"]) for r in csv.DictReader(f)]
    xla_height = validate(sizes, starts, ends, xla_offsets)
    assert xla_height <= int(e["xla_total"])
    raw_lb = assign_offsets(sizes, starts, ends, search=False).lower_bound
    r = solve(sizes, starts, ends, time_limit, alignment=int(e["alignment"]))
    xla = int(e["xla_total"])
    rows.append([e["program"], e["platform"], r["buffers"], raw_lb, xla, r["height"],
                 ratio(r["height"], xla), ratio(xla, raw_lb), ratio(r["height"], raw_lb),
                 f"{r['seconds']:.2f}"])
  print_table(f"XLA's own programs: its temp allocation against ours, {time_limit:g} s each",
              ("program", "platform", "buffers", "lower bound", "XLA", "ours", "ours/XLA",
               "XLA/LB", "ours/LB", "seconds"), rows)


def deadline_table(instances: list[tuple[str, tuple]]) -> None:
  rows = []
  for name, data in instances:
    for limit in (0.5, 2.0, 5.0):
      t = time.perf_counter()
      result = assign_offsets(*data, time_limit=limit)
      wall = time.perf_counter() - t
      validate(*data, result.offsets)
      rows.append([name, len(data[0]), f"{limit:g}", f"{wall:.3f}", f"{wall / limit:.3f}",
                   result.method, ratio(result.height, result.lower_bound)])
  print_table("Deadlines: wall time of the whole call against time_limit",
              ("instance", "buffers", "time_limit s", "wall s", "wall/limit", "method",
               "height/LB"), rows)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per instance")
  parser.add_argument("--only", nargs="*",
                      default=["minimalloc", "traces", "synthetic", "xla", "deadline"])
  parser.add_argument("--data", type=Path, default=default_data())
  parser.add_argument("--traces", nargs="*", type=Path, default=[])
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child(args.child, args.time_limit)
    return 0
  print(f"load average {os.getloadavg()[0]:.2f} at {time.strftime('%H:%M:%S')}, "
        f"{os.cpu_count()} cores")
  if "minimalloc" in args.only:
    minimalloc_table(args.data / "minimalloc" / "challenging", args.time_limit)
  specs = []
  if "traces" in args.only:
    for path in args.traces:
      specs += sorted(map(str, path.glob("*.csv"))) if path.is_dir() else [str(path)]
    if not specs:
      print("no compiler traces given (--traces)")
  if "synthetic" in args.only:
    specs.append("synthetic")
  if specs:
    large_table(specs, args.time_limit)
  if "xla" in args.only:
    xla_table(HERE / "corpus", args.time_limit)
  if "deadline" in args.only:
    instances = [("synthetic 100k", synthetic())]
    instances += [(Path(s).stem, load(Path(s))) for s in specs if s != "synthetic"
                  and Path(s).stem in ("Y_1", "pangu_2.6B")]
    hard = args.data / "minimalloc" / "challenging" / f"D.{CAPACITY}.csv"
    if hard.exists():
      instances.append(("MiniMalloc D", load(hard)))
    deadline_table(instances)
  return 0


if __name__ == "__main__":
  sys.exit(main())
