"""Unit tests for the offset engine's passes: `sweep`, `greedy`, `search`, `dfs`, `dfs_array`.

tests/test_offsets.py tests `assign_offsets` as a whole; here each pass is called directly, and
its answers are checked by the validators of tests/test_offsets.py (independent of the engine)
or against brute force.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_offsets import best_fit_offsets, brute_force_height, load, sweep_check, synthetic

from donate._planner import dfs, dfs_array, greedy, search, sweep

ROOT = Path(__file__).resolve().parents[1]


def instance(sizes, starts, ends) -> sweep.Instance:
  return sweep.build(*(np.asarray(v, np.int64) for v in (sizes, starts, ends)))


def whole(inst):
  return search.parts(inst.sizes, inst.starts, inst.ends, inst.live,
                      np.zeros(len(inst.live), np.int64))


def instances(most):
  return st.integers(1, most).flatmap(lambda n: st.tuples(
      st.lists(st.integers(0, 9), min_size=n, max_size=n),
      st.lists(st.integers(0, 6), min_size=n, max_size=n),
      st.lists(st.integers(1, 5), min_size=n, max_size=n)))


small = instances(6)  # small enough for brute force


# sweep -----------------------------------------------------------------------------------------


def test_sections_and_their_totals():
  # Deaths at 2, 3 and 5: section s holds the buffers live just before the s-th death.
  inst = instance([4, 2, 3, 0], [0, 1, 2, 0], [2, 5, 3, 5])
  assert inst.num_sections == 3
  assert (inst.a.tolist(), inst.b.tolist()) == ([0, 0, 1, 0], [1, 3, 2, 3])
  assert inst.totals.tolist() == [6, 5, 2] and inst.lower_bound == 6
  assert inst.live.tolist() == [0, 1, 2]


def test_components_range_max_and_cells():
  a, b = np.array([0, 1, 3, 5, 4]), np.array([2, 3, 4, 6, 5])
  assert [g.tolist() for g in sweep.components(a, b, np.arange(5))] == [[0, 1], [2], [4], [3]]
  values = np.array([3, 1, 4, 1, 5, 9, 2, 6])
  lo, hi = np.array([0, 1, 2, 5, 7, 0]), np.array([1, 4, 7, 8, 8, 8])
  assert sweep.range_max(values, lo, hi).tolist() == [max(values[x:y]) for x, y in zip(lo, hi)]
  cells, owner = sweep.cells(np.array([2, 0]), np.array([4, 1]))
  assert (cells.tolist(), owner.tolist()) == ([2, 3, 0], [0, 0, 1])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 300))
def test_stacking_is_valid_over_anything_placed(seed, n):
  sizes, starts, ends = synthetic(n, seed)
  inst = instance(sizes // 1024, starts, ends)
  offsets = np.zeros(n, np.int64)
  rng = np.random.default_rng(seed)
  keep = rng.random(n) < 0.3  # a few buffers one above the other, the rest stacked
  offsets[keep] = np.cumsum(inst.sizes[keep]) - inst.sizes[keep]
  sweep.stack(inst, offsets, np.flatnonzero(~keep))
  sweep_check(inst.sizes.tolist(), starts.tolist(), ends.tolist(), offsets.tolist())


# greedy ----------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(instances(16))
def test_skyline_places_every_buffer_validly(case):
  sizes, starts, lengths = case
  ends = [s + k for s, k in zip(starts, lengths)]
  inst = instance(sizes, starts, ends)
  keys = greedy.keys(inst)
  for names in greedy.SKYLINE_ORDERS:
    offsets, stacked = greedy.skyline(inst, greedy.preorder(keys, names, inst.live), math.inf,
                                      finish=True)
    assert stacked == 0
    sweep_check(sizes, starts, ends, offsets.tolist())


def test_skyline_past_its_deadline_stacks_or_gives_up():
  sizes, starts, ends = synthetic(5000, 2)
  inst = instance(sizes // 1024, starts, ends)
  order = greedy.preorder(greedy.keys(inst), greedy.SKYLINE_ORDERS[0], inst.live)
  assert greedy.skyline(inst, order, -math.inf, finish=False) is None
  offsets, stacked = greedy.skyline(inst, order, -math.inf, finish=True)
  assert 0 < stacked < len(order)  # stopped at its first look at the clock
  sweep_check(inst.sizes.tolist(), starts.tolist(), ends.tolist(), offsets.tolist())
  full, none = greedy.skyline(inst, order, math.inf, finish=True)
  assert none == 0 and sweep_check(inst.sizes.tolist(), starts.tolist(), ends.tolist(),
                                   full.tolist()) < (offsets + inst.sizes).max()


@settings(max_examples=60, deadline=None)
@given(instances(16))
@example(([1, 6, 5, 3, 5, 6, 3, 6], [0, 5, 0, 2, 2, 0, 2, 3], [1, 1, 1, 1, 4, 1, 3, 4]))
def test_best_fit_is_the_heap_simulators_greedy(case):
  """In the example, buffer 3 fits into two gaps; the smaller one is the higher."""
  sizes, starts, lengths = case
  ends = [s + k for s, k in zip(starts, lengths)]
  inst = instance(sizes, starts, ends)
  order = greedy.preorder(greedy.keys(inst), ("size", "life"), inst.live)
  offsets = greedy.best_fit(inst, order, math.inf)
  sweep_check(sizes, starts, ends, offsets.tolist())
  expected = best_fit_offsets(sizes, starts, ends)
  assert {i: offsets[i] for i in inst.live.tolist()} == {i: expected[i] for i in inst.live.tolist()}


# search and dfs --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(small)
def test_the_search_fits_the_optimum_and_proves_nothing_lower_fits(case):
  sizes, starts, lengths = case
  ends = [s + k for s, k in zip(starts, lengths)]
  inst = instance(sizes, starts, ends)
  best = brute_force_height(sizes, starts, ends)
  offsets = np.zeros(len(sizes), np.int64)
  for part in whole(inst):
    solver = search.Search(part)
    height = brute_force_height(part.size, inst.starts[part.ids].tolist(),
                                inst.ends[part.ids].tolist())
    assert solver.solve(height - 1, None, math.inf) == "infeasible"
    found = solver.solve(height, None, math.inf)
    assert max(o + z for o, z in zip(found, part.size)) <= height <= best
    offsets[part.ids] = found
  assert sweep_check(sizes, starts, ends, offsets.tolist()) == best


def test_a_paused_search_resumes_where_it_stopped():
  # Every greedy order needs 13 here; 12 fits (tests/test_offsets.py).
  inst = instance([4, 5, 3, 4, 3], [2, 3, 3, 5, 4], [4, 6, 5, 7, 6])
  (part,) = whole(inst)
  solver = search.Search(part)
  assert solver.solve(12, 1, math.inf) == "aborted"
  (paused,) = solver._paused.values()
  depths = [len(d.stack) for d in paused]
  assert max(depths) > 1  # stopped below the root
  assert solver.solve(12, 1, -math.inf) == "aborted"  # past the deadline: nothing runs
  assert solver._paused[12] is paused and [len(d.stack) for d in paused] == depths
  found = solver.solve(12, None, math.inf)
  assert solver._paused == {} and min(len(d.stack) for d in paused) == 0
  starts, ends = inst.starts[part.ids].tolist(), inst.ends[part.ids].tolist()
  assert sweep_check(part.size, starts, ends, found) <= 12


def test_a_descent_checks_its_floor_and_sections_before_it_starts():
  (part,) = whole(instance([4, 5, 3], [0, 0, 0], [2, 2, 2]))
  layout = dfs.Layout(part)
  order = layout.order("TWA")
  assert order == [1, 0, 2]  # the same fullest section: longer-lived first, then larger
  assert not dfs.Descent(layout, "TWA", order, 11).feasible()
  descent = dfs.Descent(layout, "TWA", order, 12)
  assert descent.feasible()
  assert descent.resume(1000, math.inf) == [5, 0, 9]  # bottom up, in preorder


def descend(core, part, heuristic: str, cap: int, nodes: int):
  """What one descent of ``core`` answers within ``nodes``, and the nodes it has left."""
  layout = core.Layout(part)
  descent = core.Descent(layout, heuristic, layout.order(heuristic), cap)
  if not descent.feasible():
    return "not feasible", 0
  found = descent.resume(nodes, math.inf)
  return ("paused" if found is core.PAUSED else found), descent.nodes[0]


@pytest.mark.parametrize("seed", range(30))
def test_the_array_descent_is_the_list_descent_node_for_node(seed):
  """`dfs_array` searches large parts; `dfs` small ones. Same answers, same node counts, from
  the same floors, whether the descent completes, proves infeasibility or runs out of nodes."""
  rng = np.random.default_rng(seed)
  n = int(rng.integers(3, 60))
  starts = rng.integers(0, 30, n)
  inst = instance(rng.integers(1, 20, n), starts, starts + rng.integers(1, 15, n))
  floor = rng.integers(0, 3, len(inst.live)) * (seed % 2)
  for part in search.parts(inst.sizes, inst.starts, inst.ends, inst.live, floor):
    low = max(part.totals)
    for heuristic in search.PREORDERS:
      assert dfs_array.Layout(part).order(heuristic) == dfs.Layout(part).order(heuristic)
      for cap in (low, low + 1, int(low * 1.02), int(low * 1.05)):
        listed = descend(dfs, part, heuristic, cap, 3000)
        assert descend(dfs_array, part, heuristic, cap, 3000) == listed, (heuristic, cap)


def test_the_array_descent_matches_on_a_minimalloc_file():
  path = ROOT / "tests" / "data" / "planner-bench" / "minimalloc" / "challenging" / "C.1048576.csv"
  sizes, starts, ends = load(path)
  (part,) = whole(instance(np.asarray(sizes) // 1024, starts, ends))
  for heuristic in search.PREORDERS:
    for cap in (1014, 1015, 1020):  # below, at and above its lower bound (units of 1 KiB)
      listed = descend(dfs, part, heuristic, cap, 3000)
      assert descend(dfs_array, part, heuristic, cap, 3000) == listed
      if isinstance(listed[0], list):
        assert sweep_check(part.size, inst_times(part, starts), inst_times(part, ends),
                           listed[0]) <= cap


def inst_times(part, times):
  return np.asarray(times)[part.ids].tolist()


def test_parts_of_many_buffers_go_to_the_array_descent():
  sizes, starts, ends = synthetic(3000, 4)
  (part,) = whole(instance(sizes // 1024, starts, ends + 400 * (np.arange(3000) % 7 == 0)))
  assert len(part.ids) > search.LIST_BUFFERS and part.searchable and not part.lists
  small = whole(instance([4, 5, 3], [0, 0, 0], [2, 2, 2]))[0]
  assert small.lists and small.setup_seconds < part.setup_seconds
  solver = search.Search(part)
  found = solver.solve(int(max(part.totals) * 1.5), None, math.inf)
  assert isinstance(solver._layout, dfs_array.Layout)
  assert sweep_check(part.size, inst_times(part, starts),
                     inst_times(part, ends + 400 * (np.arange(3000) % 7 == 0)), found)


def test_a_descent_is_as_deep_as_the_part_without_recursion():
  # 600 buffers one above the other: 600 levels on the explicit stack of generators.
  n = 600
  (part,) = whole(instance([1] * n, [0] * n, [1] * n))
  layout = dfs.Layout(part)
  descent = dfs.Descent(layout, "TWA", layout.order("TWA"), n)
  assert descent.feasible()
  found = descent.resume(10 * n, math.inf)
  assert sorted(found) == list(range(n))


def test_no_module_changes_the_recursion_limit():
  sources = [p.read_text() for p in (ROOT / "donate").rglob("*.py")]
  assert sources and not any("setrecursionlimit" in s for s in sources)


@pytest.mark.parametrize("heuristic", search.PREORDERS)
def test_static_preorders_rank_by_their_keys(heuristic):
  (part,) = whole(instance([2, 8, 4, 8], [0, 0, 1, 2], [3, 2, 3, 3]))
  layout = dfs.Layout(part)
  keys = [tuple(layout.keys[c][j] for c in heuristic) for j in range(4)]
  order = layout.order(heuristic)
  assert [keys[j] for j in order] == sorted(keys, reverse=True)
