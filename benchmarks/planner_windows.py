"""Where a MiniMalloc file's gap above its lower bound comes from: its time windows, packed alone.

Usage::

  python benchmarks/planner_windows.py FILE [--widths 8,16,24,32,48] [--step 1] [--time-limit S]
                                       [--meet A,B ...]

A window is a run of the file's time sections (between consecutive distinct event times); each
buffer that meets it is clipped to it, which can only make packing easier, so a window that cannot
pack at some height proves the whole file cannot either. For each width the table gives how many
windows reach their own lower bound (proven, or found) and the largest gap among those that do
not within the time limit. ``--meet A,B`` packs the buffers that meet sections ``[A, B)`` kept
whole (a subset of the file, so again never harder than it). ``--grow A,B --capacity C`` starts
from those buffers and adds the others one at a time, each time the one whose addition is fitted
under ``C`` soonest (a search from scratch per try, the time limit per try growing 4x, to 16 s,
when none fits): how much of the file fits under ``C``. Every answer is checked by the overlap
validator of ``bench_planner``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_planner import load, validate  # noqa: E402  (after the path tweak)
from donate import planner  # noqa: E402


def pack(sizes, starts, ends, limit: float, capacity: int | None = None):
  r = planner.assign_offsets(sizes.tolist(), starts.tolist(), ends.tolist(), capacity=capacity,
                             time_limit=limit)
  assert validate(sizes, starts, ends, r.offsets) == r.height
  return r


def grow(sizes, starts, ends, pick: np.ndarray, capacity: int, limit: float) -> None:
  """Adds buffers to ``pick`` while some addition still fits under ``capacity`` (see above)."""
  chosen, left = list(np.flatnonzero(pick)), list(np.flatnonzero(~pick))
  began = time.perf_counter()
  while left:
    found = None
    for i in left:
      ids = np.array(chosen + [i])
      r = pack(sizes[ids], starts[ids], ends[ids], limit, capacity)
      if r.height <= capacity and (found is None or r.seconds < found[1]):
        found = (i, r.seconds)
        if r.seconds < 0.05:
          break
    if found is None:
      if limit >= 16:
        break
      limit *= 4
      continue
    chosen.append(found[0])
    left.remove(found[0])
  print(f"\ngrown under {capacity}: {len(chosen)} of {len(sizes)} buffers fit "
        f"({time.perf_counter() - began:.0f} s); not placed: {sorted(int(i) for i in left)}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("file", type=Path)
  ap.add_argument("--widths", default="8,16,24,32,48")
  ap.add_argument("--step", type=int, default=1)
  ap.add_argument("--time-limit", type=float, default=2.0)
  ap.add_argument("--meet", nargs="*", default=[])
  ap.add_argument("--grow")
  ap.add_argument("--capacity", type=int)
  args = ap.parse_args()
  sizes, starts, ends = load(args.file)
  times = np.unique(np.concatenate([starts, ends]))
  lo, hi = np.searchsorted(times, starts), np.searchsorted(times, ends)
  sections = len(times) - 1
  whole = pack(sizes, starts, ends, args.time_limit)
  print(f"{args.file.name}: {len(sizes)} buffers, {sections} sections, lower bound "
        f"{whole.lower_bound}, packed at {whole.height} in {args.time_limit:g} s\n")
  print("| width | windows | at their bound | largest gap found (bytes) | largest window |")
  print("|-------|---------|----------------|---------------------------|----------------|")
  for width in (int(w) for w in args.widths.split(",")):
    at_bound, gap, most = 0, 0, 0
    firsts = range(0, sections - width + 1, args.step)
    for a in firsts:
      b = a + width
      pick = (lo < b) & (hi > a)
      most = max(most, int(pick.sum()))
      r = pack(sizes[pick], np.maximum(starts[pick], times[a]), np.minimum(ends[pick], times[b]),
               args.time_limit)
      at_bound += r.height == r.lower_bound
      gap = max(gap, r.height - r.lower_bound)
    print(f"| {width:5d} | {len(firsts):7d} | {at_bound:14d} | {gap:25d} | {most:14d} |")
  for spec in args.meet:
    a, b = (int(x) for x in spec.split(","))
    pick = (lo < b) & (hi > a)
    r = pack(sizes[pick], starts[pick], ends[pick], args.time_limit)
    print(f"\nbuffers meeting sections [{a}, {b}) kept whole: {int(pick.sum())} buffers, lower bound "
          f"{r.lower_bound}, packed at {r.height} in {r.seconds:.2f} s")
  if args.grow:
    a, b = (int(x) for x in args.grow.split(","))
    grow(sizes, starts, ends, (lo < b) & (hi > a), args.capacity or whole.lower_bound, 1.0)


if __name__ == "__main__":
  main()
