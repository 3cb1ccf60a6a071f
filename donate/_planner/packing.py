"""Offset assignment, the driver: the packing of one instance as it improves.

Greedy orders first (`greedy`): the first answer, then others while they are cheap enough. Then
the search (`search`): in capacity mode one long probe at the capacity; otherwise bisection on the
height between the lower bound and the best height found, each probe asking the search to fit a
capacity, with a node budget that grows by rounds. Instances too large to search whole are
improved a *band* at a time: the buffers above some offset are re-packed, under the probe's
capacity, on the floor that the buffers below them leave.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from donate._planner import greedy, search, sweep

_PORTFOLIO_SHARE = 0.4  # of the time limit, at most, for greedy orders after the first
_SMALL_BUDGET = 2000  # a probe's nodes per buffer, up to this many, when every part is small
_SMALL_SHARE = 1e-4  # of a wide part's lower bound: buffers this small are packed apart
_BAND_START = 256  # buffers in the first band re-packed on a large instance
_PROBES_PER_ROUND = 3  # bisection probes per round
_LOWER_BOUND_SHARE = 8  # the probe at the lower bound gets this many times their node budget


@dataclasses.dataclass(frozen=True, slots=True)
class _Split:
  """A part searched without its smallest buffers: ``parts`` (with their searches) hold the
  large buffers ``large``; the small ones ``small`` keep the offsets ``packed`` they have when
  packed on their own, ``reserve`` high, and go right above the large ones."""

  parts: list
  large: np.ndarray
  small: np.ndarray
  packed: np.ndarray
  reserve: int


_UNSPLIT = object()  # a part whose split is not worked out yet


class Packing:
  """The packing of one instance as it improves: greedy orders first, then the search."""

  def __init__(self, inst: sweep.Instance, cap: int | None, t0: float, deadline: float):
    self.inst, self.cap, self.t0, self.deadline = inst, cap, t0, deadline
    self.offsets = np.zeros(len(inst.sizes), np.int64)
    self.height: float = math.inf  # an int from the first answer on
    self.greedy_height: float = 0
    self.first_seconds = 0.0
    self.proven, self.method = False, "greedy"
    self._whole: list | None = None  # searches over the parts of the whole instance, built once

  def done(self) -> bool:
    target = self.inst.lower_bound if self.cap is None else max(self.cap, self.inst.lower_bound)
    return self.height <= target or self.proven

  def _max_top(self, offsets: np.ndarray) -> int:
    live = self.inst.live
    return int((offsets[live] + self.inst.sizes[live]).max())

  def _offer(self, offsets) -> None:
    if offsets is not None and self._max_top(offsets) < self.height:
      self.offsets, self.height = offsets, self._max_top(offsets)

  def greedy(self) -> None:
    """The first answer (always complete), then other orders while they are cheap enough."""
    keys = greedy.keys(self.inst)
    early = len(self.inst.live) <= greedy.ALWAYS_BEST_FIT
    self._first_answer(keys, early)
    self.first_seconds = time.perf_counter() - self.t0
    stop = min(self.deadline, self.t0 + _PORTFOLIO_SHARE * (self.deadline - self.t0))
    stop = max(stop, self.t0 + 2 * self.first_seconds)  # small instances try every order
    self._other_orders(keys, early, min(stop, self.deadline))
    self.greedy_height = self.height

  def _first_answer(self, keys, early: bool) -> None:
    """The skyline in the first order, finished by stacking if the deadline comes first; on a
    small instance also best fit by size (then the first answer is never worse than XLA's)."""
    inst, live = self.inst, self.inst.live
    order = greedy.preorder(keys, greedy.SKYLINE_ORDERS[0], live)
    first, stacked = greedy.skyline(inst, order, self.deadline, finish=True)
    if stacked:
      self.method = "stacked"
    self._offer(first)
    if early:
      order = greedy.preorder(keys, greedy.BEST_FIT_ORDERS[0], live)
      self._offer(greedy.best_fit(inst, order, math.inf))

  def _other_orders(self, keys, early: bool, stop: float) -> None:
    """The other skyline orders, then best fit where the instance is small enough, until
    ``stop`` or until nothing better can be found."""
    inst, live = self.inst, self.inst.live
    runs = [("skyline", names) for names in greedy.SKYLINE_ORDERS[1:]]
    if len(live) <= greedy.BEST_FIT_MAX_BUFFERS:
      runs += [("best fit", names) for names in greedy.BEST_FIT_ORDERS]
    for kind, names in runs:
      if self.done() or time.perf_counter() > stop:
        break
      if early and names == greedy.BEST_FIT_ORDERS[0]:
        continue  # already part of the first answer
      order = greedy.preorder(keys, names, live)
      if kind == "skyline":
        self._offer((greedy.skyline(inst, order, stop, finish=False) or (None,))[0])
      else:
        self._offer(greedy.best_fit(inst, order, stop))

  def improve(self) -> None:
    """Capacity mode: one long probe at the capacity. Otherwise rounds of probes, each round
    with four times the node budget of the last: first the lower bound (tight capacities prune
    best, so it is often the quickest to fit), then bisection between it and the best height.
    Stops early when a round neither improved nor ran out of budget anywhere.

    An instance with a part too large for `dfs`'s lists skips the lower-bound probe (one node
    there costs a pass over the part, and a descent takes at least one node per buffer) and
    bisects with a budget of ten descents of that part."""
    if self.cap is not None:
      if self.cap >= self.inst.lower_bound:
        self._probe(self.cap, None)
      return
    if time.perf_counter() >= self.deadline:
      return
    low = self.inst.lower_bound
    largest = max(len(entry[0].ids) for entry in self._parts())
    wide = largest > search.LIST_BUFFERS
    budget = 10 * largest if wide else 4 * min(len(self.inst.live), _SMALL_BUDGET)
    while low < self.height and time.perf_counter() < self.deadline:
      statuses = [] if wide else [self._probe(low, _LOWER_BOUND_SHARE * budget)]
      if statuses and statuses[0] == "proof":
        low += 1
        continue
      soft_low = low + (not wide)
      for _ in range(_PROBES_PER_ROUND):
        if soft_low >= self.height or time.perf_counter() > self.deadline:
          break
        target = int((soft_low + self.height) // 2)
        statuses.append(self._probe(target, budget))
        if statuses[-1] == "proof":
          low = target + 1
        if statuses[-1] != "ok":
          soft_low = target + 1
      if "ok" not in statuses and "aborted" not in statuses:
        break  # nothing a larger budget could change
      budget *= 4
    self.proven = low >= self.height

  def _parts(self) -> list:
    """The parts of the whole instance, each with its search once it has one (built once)."""
    if self._whole is None:
      inst = self.inst
      zeros = np.zeros(len(inst.live), np.int64)
      whole = search.parts(inst.sizes, inst.starts, inst.ends, inst.live, zeros)
      self._whole = [[p, None, _UNSPLIT] for p in whole]
    return self._whole

  def _probe(self, target: int, node_limit: int | None) -> str:
    """Tries to fit everything under ``target``, one independent part at a time.

    Returns "ok", "proof" (impossible), "aborted" (out of nodes or time) or "stuck" (not with
    this method, whatever the budget). Parts small enough are searched whole, so an exhausted
    search is a proof (not when a wide part is searched without its smallest buffers). Larger
    ones re-pack the band of their buffers above some offset, on the floor those below it leave;
    when a band is shown not to fit on its floor, a band twice as large is tried.
    """
    if time.perf_counter() >= self.deadline:
      return "aborted"
    self.method = "greedy+search"
    proof = True
    for entry in self._parts():
      part = entry[0]
      if self._part_height(part) <= target:
        continue
      split = self._split(entry, target) if part.searchable else None
      if split is not None:
        proof, status = False, self._fit_split(split, target, node_limit)
      elif part.searchable:
        entry[1] = entry[1] or search.Search(part)
        status = self._fit([(part, entry[1])], target, node_limit)
      else:
        proof, status = False, self._fit_bands(part.ids, target, node_limit)
      if status == "infeasible" and proof:
        return "proof"
      if status != "ok":
        return "stuck" if status == "infeasible" else status
    return "ok" if self.height <= target else "stuck"

  def _part_height(self, part: search.Part) -> int:
    return int((self.offsets[part.ids] + self.inst.sizes[part.ids]).max())

  def _fit_bands(self, ids: np.ndarray, target: int, node_limit: int | None) -> str:
    count = _BAND_START
    while True:
      band = _band(self.inst, self.offsets, ids, target, count)
      if band is None:
        return "stuck"
      status = self._fit([(p, None) for p in band], target, node_limit)
      if status != "infeasible":
        return status
      count *= 2

  def _split(self, entry: list, target: int) -> _Split | None:
    """How a part too large for `dfs`'s lists is searched without its smallest buffers, if
    that leaves them room under ``target`` (worked out once per part)."""
    part, _, split = entry
    if split is _UNSPLIT:
      split = entry[2] = _make_split(self.inst, part)
    return None if split is None or 2 * split.reserve > target - max(part.totals) else split

  def _fit_split(self, split: _Split, target: int, node_limit: int | None) -> str:
    """Searches the large buffers of a part under ``target`` less the small ones' own height,
    then puts the small ones, as packed on their own, right above them."""
    for entry in split.parts:
      entry[1] = entry[1] or search.Search(entry[0])

    def lift(offsets: np.ndarray) -> None:
      base = int((offsets[split.large] + self.inst.sizes[split.large]).max())
      offsets[split.small] = base + split.packed

    return self._fit([tuple(e) for e in split.parts], target - split.reserve, node_limit, lift)

  def _fit(self, parts, target: int, node_limit: int | None, then=None) -> str:
    """Searches every part above ``target``: "ok", "infeasible", "aborted" or "stuck" (a part
    too large to search); keeps what fits, after ``then(offsets)`` if given."""
    offsets = self.offsets.copy()
    for part, solver in parts:
      if max(o + z for o, z in zip(offsets[part.ids].tolist(), part.size)) <= target:
        continue
      if not part.searchable:
        return "stuck"
      fresh = solver is None or not solver.started
      if fresh and part.setup_seconds > self.deadline - time.perf_counter():
        return "aborted"  # no time left to set its search up
      result = (solver or search.Search(part)).solve(target, node_limit, self.deadline)
      if isinstance(result, str):
        return result
      offsets[part.ids] = result
    if then is not None:
      then(offsets)
    # Each part now lies under target (below the height), so this is never worse.
    self.offsets, self.height = offsets, self._max_top(offsets)
    return "ok"


def _make_split(inst: sweep.Instance, part: search.Part) -> _Split | None:
  """The part's buffers of at most `_SMALL_SHARE` of its lower bound, packed on their own by
  the first greedy order, and the parts of the others; ``None`` if there is nothing to
  split (a part `dfs` searches, or none or all of its buffers small)."""
  small = np.asarray(part.size) <= _SMALL_SHARE * max(part.totals)
  if part.lists or small.all() or not small.any():
    return None
  ids = part.ids[small]
  alone = sweep.build(inst.sizes[ids], inst.starts[ids], inst.ends[ids])
  order = greedy.preorder(greedy.keys(alone), greedy.SKYLINE_ORDERS[0], alone.live)
  packed = greedy.skyline(alone, order, math.inf, finish=True)[0]
  large = part.ids[~small]
  parts = search.parts(inst.sizes, inst.starts, inst.ends, large, np.zeros(len(large), np.int64))
  return _Split([[p, None] for p in parts], large, ids, packed, int((packed + alone.sizes).max()))


def _band(inst: sweep.Instance, offsets_all: np.ndarray, ids: np.ndarray, target: int, count: int):
  """The parts of the band of at least ``count`` of the buffers ``ids``, including every one
  that reaches above ``target``, each with its floor; ``None`` if too large to search."""
  offsets = offsets_all[ids]
  tops = offsets + inst.sizes[ids]
  ranked = np.sort(offsets)[::-1]
  highest = int(offsets[tops > target].min())
  count = max(count, int(np.searchsorted(-ranked, -highest, side="right")))
  if count > search.MAX_BUFFERS or count > 2 * len(ids):
    return None
  level = int(ranked[min(count, len(ranked)) - 1])
  band = ids[offsets >= level]
  crossing = ids[(offsets < level) & (tops > level)]
  floor = np.full(inst.num_sections, level, np.int64)
  # At most one buffer crosses ``level`` in each section, so these cells are distinct.
  cells, owner = sweep.cells(inst.a[crossing], inst.b[crossing])
  floor[cells] = offsets_all[crossing][owner] + inst.sizes[crossing][owner]
  lowest = sweep.range_max(floor, inst.a[band], inst.b[band])
  return search.parts(inst.sizes, inst.starts, inst.ends, band, lowest)
