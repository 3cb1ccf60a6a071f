"""Tests for offset assignment (``donate._planner.offsets.assign_offsets``).

Every answer is checked by validators written here, independently of the engine: no two buffers
that are live at the same time share a byte, offsets are aligned, and the reported height and
lower bound are what they claim to be. Small answers are checked pair by pair; large ones by a
sweep over time that keeps the live buffers sorted by offset.
"""

from __future__ import annotations

import bisect
import csv
import inspect
import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from donate._base.errors import DonationError
from donate._planner import packing, search
from donate._planner.offsets import OffsetAssignment, assign_offsets

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

BENCH = Path(__file__).resolve().parent / "data" / "planner-bench" / "minimalloc"  # see SOURCE.md
ROOT = Path(__file__).resolve().parents[1]


def aligned(size: int, alignment: int) -> int:
  return -(-size // alignment) * alignment


def check(result: OffsetAssignment, sizes, starts, ends, alignment=1) -> None:
  """The independent validator for small answers: every pair, and the bound by brute force."""
  n = len(sizes)
  assert len(result.offsets) == n
  padded = [aligned(s, alignment) for s in sizes]
  for i in range(n):
    assert result.offsets[i] >= 0 and result.offsets[i] % alignment == 0
  for i, j in itertools.combinations(range(n), 2):
    meet_in_time = starts[i] < ends[j] and starts[j] < ends[i]
    meet_in_memory = (result.offsets[i] < result.offsets[j] + padded[j]
                      and result.offsets[j] < result.offsets[i] + padded[i])
    assert not (meet_in_time and meet_in_memory and padded[i] and padded[j]), (i, j)
  assert result.height == max((o + p for o, p in zip(result.offsets, padded) if p), default=0)
  # The most memory is live at some moment when a buffer starts.
  live = [sum(p for p, s, e in zip(padded, starts, ends) if s <= t < e) for t in set(starts)]
  assert result.lower_bound == max(live, default=0)
  assert result.lower_bound <= result.height <= result.greedy_height
  if result.optimal and n <= 6:
    assert result.height == brute_force_height(padded, starts, ends)


def sweep_check(sizes, starts, ends, offsets) -> int:
  """The independent validator for large answers; returns the height.

  Walks the start and end events in time order (ends first at equal times), keeping the live
  buffers sorted by offset: a new buffer overlaps one of them exactly when it overlaps its
  neighbour below or above in that order, since the live ones are disjoint.
  """
  events = sorted([(e, 0, i) for i, e in enumerate(ends)] + [(s, 1, i) for i, s in enumerate(starts)])
  lows, tops = [], []
  for _, kind, i in events:
    if sizes[i] == 0:
      continue
    low, top = offsets[i], offsets[i] + sizes[i]
    k = bisect.bisect_left(lows, low)
    if kind == 0:
      while lows[k] != low or tops[k] != top:
        k += 1
      del lows[k], tops[k]
      continue
    assert low >= 0
    assert k == 0 or tops[k - 1] <= low, f"buffer {i} overlaps a live buffer below it"
    assert k == len(lows) or top <= lows[k], f"buffer {i} overlaps a live buffer above it"
    lows.insert(k, low)
    tops.insert(k, top)
  return max((o + s for o, s in zip(offsets, sizes) if s), default=0)


def brute_force_height(sizes, starts, ends) -> int:
  """The optimum, by trying every placement order (each buffer on top of its placed neighbours)."""
  n = len(sizes)
  best = math.inf
  for order in itertools.permutations(range(n)):
    offsets: dict[int, int] = {}
    for i in order:
      offsets[i] = max((offsets[j] + sizes[j] for j in offsets
                        if starts[i] < ends[j] and starts[j] < ends[i]), default=0)
    best = min(best, max((offsets[i] + sizes[i] for i in range(n) if sizes[i]), default=0))
  return best


def best_fit_height(sizes, starts, ends) -> int:
  """The height of `best_fit_offsets`."""
  offsets = best_fit_offsets(sizes, starts, ends)
  return max((offsets[i] + sizes[i] for i in offsets if sizes[i]), default=0)


def best_fit_offsets(sizes, starts, ends) -> dict[int, int]:
  """XLA's and TFLite's heap-simulator greedy, written here: largest first (then longest lived),
  each at the start of the smallest gap among placed buffers it meets in time, else on top."""
  order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], -(ends[i] - starts[i]), i))
  offsets: dict[int, int] = {}
  for i in order:
    busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in offsets
                  if sizes[j] and starts[i] < ends[j] and starts[j] < ends[i])
    floor, best, best_gap = 0, None, math.inf
    for low, top in busy:
      if sizes[i] <= low - floor < best_gap:
        best, best_gap = floor, low - floor
      floor = max(floor, top)
    offsets[i] = floor if best is None else best
  return offsets


def load(path: Path):
  with path.open() as f:
    rows = list(csv.DictReader(f))
  return ([int(r["size"]) for r in rows], [int(r["lower"]) for r in rows],
          [int(r["upper"]) for r in rows])


def synthetic(n: int, seed: int = 0):
  """A step-per-op graph: most values die within a few ops, 3% live for 20-300 ops."""
  rng = np.random.default_rng(seed)
  starts = np.arange(n)
  lengths = 1 + rng.geometric(0.3, n)
  long = rng.random(n) < 0.03
  lengths[long] = rng.integers(20, 300, long.sum())
  sizes = 1024 * 2 ** rng.integers(0, 12, n) * rng.integers(1, 4, n)
  return sizes, starts, starts + lengths


# ---------------------------------------------------------------------------------------------
# The seed's example (PyTorch PR 138519): three 64-byte comm buffers live together, a fourth after.


@pytest.mark.parametrize("alignment", [1, 64])
def test_seed_example_packs_into_192_bytes_and_reuses_a_dead_offset(alignment):
  sizes, starts, ends = [64, 64, 64, 64], [0, 0, 0, 2], [2, 2, 2, 3]
  result = assign_offsets(sizes, starts, ends, alignment=alignment)
  check(result, sizes, starts, ends, alignment)
  assert result.height == result.lower_bound == 192
  assert sorted(result.offsets[:3]) == [0, 64, 128]
  assert result.offsets[3] in result.offsets[:3]
  assert result.optimal and result.method == "greedy"


def test_alignment_pads_sizes():
  result = assign_offsets([10, 10], [0, 0], [1, 1], alignment=16)
  assert result.height == result.lower_bound == 32
  assert sorted(result.offsets) == [0, 16]


# ---------------------------------------------------------------------------------------------
# Random instances.

instances = st.integers(0, 7).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 40), min_size=n, max_size=n),
    st.lists(st.integers(0, 12), min_size=n, max_size=n),
    st.lists(st.integers(1, 8), min_size=n, max_size=n),
    st.sampled_from([1, 1, 4, 16])))


@settings(max_examples=50, deadline=None)
@given(instances)
def test_random_instances_are_valid_and_optimal_when_small(instance):
  sizes, starts, lengths, alignment = instance
  ends = [s + k for s, k in zip(starts, lengths)]
  result = assign_offsets(sizes, starts, ends, alignment=alignment, time_limit=20)
  check(result, sizes, starts, ends, alignment)
  if len(sizes) <= 6:
    # Tiny instances are solved exactly well within the limit.
    assert result.optimal
    assert result.height == brute_force_height([aligned(s, alignment) for s in sizes], starts, ends)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(10, 60), st.sampled_from([0.0, 0.05, 0.3]))
def test_never_worse_than_greedy(seed, n, time_limit):
  rng = np.random.default_rng(seed)
  sizes = (rng.integers(1, 9, n) * 1024 * rng.integers(1, 3, n) ** 4).tolist()
  starts = rng.integers(0, 40, n).tolist()
  ends = [s + int(k) for s, k in zip(starts, rng.integers(1, 15, n))]
  result = assign_offsets(sizes, starts, ends, time_limit=time_limit)
  check(result, sizes, starts, ends)
  assert result.height <= result.greedy_height
  assert result.height <= best_fit_height(sizes, starts, ends)
  if time_limit >= 0.3:  # time enough for every greedy order
    assert result.height <= assign_offsets(sizes, starts, ends, search=False).height


def test_greedy_is_improved_by_the_search():
  # Every greedy order needs 13 here; the lower bound, 12, is reachable.
  sizes, starts, ends = [4, 5, 3, 4, 3], [2, 3, 3, 5, 4], [4, 6, 5, 7, 6]
  greedy = assign_offsets(sizes, starts, ends, search=False)
  check(greedy, sizes, starts, ends)
  assert greedy.height == greedy.greedy_height == 13 and greedy.method == "greedy"
  result = assign_offsets(sizes, starts, ends)
  check(result, sizes, starts, ends)
  assert result.greedy_height == 13
  assert result.height == result.lower_bound == 12 == brute_force_height(sizes, starts, ends)
  assert result.optimal and result.method == "greedy+search"


def test_capacity_mode_stops_at_the_first_fit():
  sizes, starts, ends = [4, 4, 4, 4, 4], [0, 3, 0, 9, 0], [3, 9, 9, 21, 21]
  roomy = assign_offsets(sizes, starts, ends, capacity=100)
  check(roomy, sizes, starts, ends)
  assert roomy.fits and roomy.method == "greedy"
  tight = assign_offsets(sizes, starts, ends, capacity=8, time_limit=2)
  check(tight, sizes, starts, ends)
  assert not tight.fits and tight.capacity == 8
  assert "does not fit capacity 8" in str(tight)


def test_empty_and_zero_size_buffers():
  empty = assign_offsets([], [], [])
  assert (empty.offsets, empty.height, empty.lower_bound, empty.optimal) == ((), 0, 0, True)
  sizes, starts, ends = [0, 8, 0], [0, 0, 1], [2, 2, 3]
  result = assign_offsets(sizes, starts, ends)
  check(result, sizes, starts, ends)
  assert result.height == 8


def test_accepts_numpy_integers_and_prints_a_summary():
  result = assign_offsets(np.array([64, 64]), np.array([0, 1]), np.array([2, 3]))
  assert result.offsets == (0, 64) or result.offsets == (64, 0)
  assert all(type(o) is int for o in result.offsets)
  text = str(result)
  assert text.startswith("OffsetAssignment: 2 buffers, height 128 bytes (lower bound 128, 1.000x")
  assert "optimal" in text


def test_search_needs_no_deep_recursion():
  # A tight capacity makes the search place all 454 buffers of K one below the other: with a
  # recursion limit only a little above the current depth, a recursive search would fail.
  path = BENCH / "challenging" / "K.1048576.csv"
  sizes, starts, ends = load(path)
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(len(inspect.stack()) + 80)
  try:
    result = assign_offsets(sizes, starts, ends, capacity=1048576, time_limit=30)
  finally:
    assert sys.getrecursionlimit() == len(inspect.stack()) + 80  # the engine never changed it
    sys.setrecursionlimit(old)
  check(result, sizes, starts, ends)
  assert result.fits and result.method == "greedy+search"


# ---------------------------------------------------------------------------------------------
# MiniMalloc benchmark files.


def test_minimalloc_example_fits_in_12():
  path = BENCH / "examples" / "input.12.csv"
  sizes, starts, ends = load(path)
  result = assign_offsets(sizes, starts, ends, capacity=12)
  check(result, sizes, starts, ends)
  assert result.height == result.lower_bound == 12 and result.fits
  assert assign_offsets(sizes, starts, ends).height == 12


@pytest.mark.parametrize("name", ["B", "C"])
def test_challenging_files_reach_their_lower_bound_without_a_capacity(name):
  path = BENCH / "challenging" / f"{name}.1048576.csv"
  sizes, starts, ends = load(path)
  result = assign_offsets(sizes, starts, ends, time_limit=30)
  check(result, sizes, starts, ends)
  assert result.height == result.lower_bound and result.optimal
  assert result.greedy_height > result.lower_bound  # the greedy alone does not: the search did
  assert result.method == "greedy+search"


# ---------------------------------------------------------------------------------------------
# Large instances.


def fourteen_a(tiny: int = 0):
  """Fourteen copies of MiniMalloc A side by side in time, tied together by one small buffer
  live throughout (one part of 2157 buffers), and ``tiny`` 64-byte buffers here and there."""
  path = BENCH / "challenging" / "A.1048576.csv"
  sizes, starts, ends = load(path)
  span, k = max(ends), 14
  rng = np.random.default_rng(0)
  first = rng.integers(0, k * span - 50, tiny).tolist()
  return (sizes * k + [1024] + [64] * tiny,
          [s + c * span for c in range(k) for s in starts] + [0] + first,
          [e + c * span for c in range(k) for e in ends] + [k * span] +
          [f + int(rng.integers(1, 50)) for f in first])


def test_large_part_is_searched_whole_by_the_array_descent():
  sizes, starts, ends = fourteen_a()
  result = assign_offsets(sizes, starts, ends, time_limit=5)
  assert sweep_check(sizes, starts, ends, result.offsets) == result.height
  assert result.lower_bound <= result.height < result.greedy_height
  assert result.method == "greedy+search"


def test_large_instance_is_repacked_a_band_at_a_time(monkeypatch):
  # Parts beyond what the search takes whole (made small here) are re-packed a band at a time.
  monkeypatch.setattr(search, "MAX_BUFFERS", 2000)
  sizes, starts, ends = fourteen_a()
  bands = []
  real = packing.Packing._fit_bands
  monkeypatch.setattr(packing.Packing, "_fit_bands",
                      lambda self, *a: bands.append(a) or real(self, *a))
  result = assign_offsets(sizes, starts, ends, time_limit=5)
  assert bands and sweep_check(sizes, starts, ends, result.offsets) == result.height
  assert result.lower_bound <= result.height < result.greedy_height


def test_smallest_buffers_of_a_large_part_are_packed_apart(monkeypatch):
  # 300 buffers of 64 bytes, well under 1e-4 of the lower bound: the search packs the rest
  # under the probe less their own height, and puts them right above it.
  sizes, starts, ends = fourteen_a(tiny=300)
  placed = []
  real = packing.Packing._fit_split

  def spy(self, split, target, node_limit):
    status = real(self, split, target, node_limit)
    if status == "ok":  # the small ones right above the large ones, all under the probe
      tops = self.offsets + self.inst.sizes
      assert self.offsets[split.small].min() >= tops[split.large].max()
      assert tops.max() == self.height <= target
      placed.append(len(split.small))
    return status

  monkeypatch.setattr(packing.Packing, "_fit_split", spy)
  result = assign_offsets(sizes, starts, ends, time_limit=5)
  assert sweep_check(sizes, starts, ends, result.offsets) == result.height
  assert result.height < result.greedy_height
  assert placed and set(placed) == {300}


LIMITED = """
import math, resource, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_offsets import synthetic, sweep_check
from donate._planner import search, sweep
from donate._planner.offsets import assign_offsets
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
"""


def run_limited(code: str) -> str:
  """Runs ``code`` in a fresh process whose address space may grow by at most 1 GiB once the
  engine is imported; returns what it printed."""
  out = subprocess.run([sys.executable, "-c", LIMITED.format(tests=str(ROOT / "tests")) + code],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def test_budget_and_memory_kept_on_100k_buffers():
  first, second = run_limited("""
sizes, starts, ends = synthetic(100_000, seed=1)
for limit in (1.0, 0.01):
    r = assign_offsets(sizes, starts, ends, time_limit=limit)
    assert sweep_check(sizes.tolist(), starts.tolist(), ends.tolist(), list(r.offsets)) == r.height
    print(limit, r.method, r.height >= r.lower_bound, 20 * r.height < sizes.sum())
""").split("\n")[:2]
  assert first.split()[2] == second.split()[2] == "True"
  assert second.split()[1] == "stacked"  # 10 ms is too short even for the first answer
  assert second.split()[3] == "True"  # and even that is far below one stack of every buffer


def test_a_wide_part_is_searched_over_arrays_within_a_memory_limit():
  # 10,000 buffers live for up to 3,000 steps: one part of about 8.7 million (buffer, section)
  # cells, beyond the lists' search, searched whole under the same memory limit.
  cells, lists, module, fits = run_limited("""
rng = np.random.default_rng(3)
starts = np.arange(10_000)
ends = starts + rng.integers(1, 3000, 10_000)
sizes = rng.integers(1, 64, 10_000)
inst = sweep.build(sizes, starts, ends)
(part,) = search.parts(inst.sizes, inst.starts, inst.ends, inst.live, np.zeros(10_000, np.int64))
solver = search.Search(part)
found = solver.solve(2 * inst.lower_bound, None, math.inf)
height = sweep_check(sizes.tolist(), starts.tolist(), ends.tolist(), found)
print(part.cells, part.lists, type(solver._layout).__module__, height <= 2 * inst.lower_bound)
""").split()
  assert int(cells) > 8_000_000 and lists == "False" and fits == "True"
  assert module == "donate._planner.dfs_array"


# ---------------------------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize("args, kwargs, words", [
    (([1, 2], [0], [1]), {}, "equal length"),
    (([1, -2], [0, 0], [1, 1]), {}, "sizes[1]"),
    (([1, 2], [0, 5], [1, 5]), {}, "buffer 1"),
    (([1], [3], [2]), {}, "ends[i] > starts[i]"),
    (([1], [0], [1]), {"alignment": 0}, "alignment"),
    (([1.5], [0], [1]), {}, "sizes[0]"),
    (([1], [0], [True]), {}, "ends[0]"),
    ((iter([1]), [0], [1]), {}, None),
    (([1], [0], [1]), {"capacity": -1}, "capacity"),
])
def test_bad_input_raises_donation_error(args, kwargs, words):
  if words is None:  # any iterable is accepted
    assert assign_offsets(*args, **kwargs).height == 1
    return
  with pytest.raises(DonationError, match="donate: ") as info:
    assign_offsets(*args, **kwargs)
  assert words in str(info.value)
