"""Offset assignment, pass 3: a MiniMalloc-style search that fits a part under a capacity.

The search (M. D. Moffitt, "MiniMalloc", ASPLOS 2023) builds a packing bottom up, one buffer at a
time, with prunings that keep it small; `dfs` holds one descent of it. Here, buffers are split
into *parts* that no buffer connects in time, and several preorders of a part's buffers run round
robin under a growing node limit; a descent stopped by its budget or the deadline keeps its
place, so asking again for the same capacity continues where it stopped.

A part may start from a *floor*: each buffer's lowest allowed offset (the top of fixed buffers
below it). That is how a band of a large packing is re-packed above the rest of it.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from donate._planner import dfs, dfs_array
from donate._planner.sweep import components, distinct, section_totals

# Static preorders tried round robin (MiniMalloc's defaults): W = longer lifetime first,
# A = larger area (size x lifetime) first, T = larger fullest-section total first,
# C = more sections first, B = sections x size.
PREORDERS = ("TWA", "WAT", "TAW", "BTC")
LIST_BUFFERS = 500  # parts up to this size are searched by `dfs` (lists), larger ones by
LIST_CELLS = 1_000_000  # `dfs_array`; `dfs` also needs at most this many pairs that meet
MAX_BUFFERS = 40_000  # parts larger than this are not searched,
MAX_CELLS = 12_000_000  # nor parts with more (buffer, section) cells


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Part:
  """Buffers that the search packs together, with local ids ``0..m-1``.

  ``lo``/``hi`` are local section ranges; ``floor`` the lowest offset each buffer may take;
  ``ids`` the buffers' indices in the whole instance.
  """

  ids: np.ndarray
  cells: int
  pairs: int
  size: list[int]
  length: list[int]
  lo: list[int]
  hi: list[int]
  totals: list[int]
  floor: list[int]

  @property
  def searchable(self) -> bool:
    return len(self.size) <= MAX_BUFFERS and self.cells <= MAX_CELLS

  @property
  def lists(self) -> bool:
    """Whether `dfs` (Python lists) searches this part rather than `dfs_array`."""
    return len(self.size) <= LIST_BUFFERS and max(self.cells, self.pairs) <= LIST_CELLS

  @property
  def setup_seconds(self) -> float:
    """Roughly (on the slow side), the time to set a search of this part up: per cell, and per
    pair for `dfs`."""
    return 1e-6 * max(self.cells, self.pairs) if self.lists else 3e-7 * self.cells


def parts(sizes, starts, ends, ids: np.ndarray, floor: np.ndarray) -> list[Part]:
  """Splits buffers ``ids`` (with lowest offsets ``floor``) into independent parts."""
  if len(ids) == 0:
    return []
  deaths = distinct(ends[ids])
  a = np.searchsorted(deaths, starts[ids], side="right")
  b = np.searchsorted(deaths, ends[ids], side="right")
  out = []
  for group in components(a, b, np.arange(len(ids))):
    first = int(a[group].min())
    lo, hi = a[group] - first, b[group] - first
    z = sizes[ids[group]]
    # (buffer, section) cells, and pairs: for each buffer, those starting inside its span
    starts_sorted = np.sort(lo)
    pairs = int((np.searchsorted(starts_sorted, hi) - np.searchsorted(starts_sorted, lo)).sum())
    out.append(
      Part(
        ids[group],
        int((hi - lo).sum()),
        pairs,
        z.tolist(),
        (ends[ids[group]] - starts[ids[group]]).tolist(),
        lo.tolist(),
        hi.tolist(),
        section_totals(z, lo, hi, int(hi.max())).tolist(),
        floor[group].tolist(),
      )
    )
  return out


class Search:
  """The search over one part: one resumable search per preorder and capacity, run round robin.

  A search stopped by its node budget or the deadline keeps its place, so asking again for the
  same capacity continues where it stopped instead of starting over.
  """

  _KEEP = 4  # capacities whose paused searches are kept

  def __init__(self, part: Part):
    self.part = part
    self._layout: dfs.Layout | None = None
    self._orders: list[tuple[str, list[int]]] = []  # (heuristic, its static preorder)
    self._paused: dict[int, list[dfs.Resumable]] = {}  # capacity -> descents, most recent last

  @property
  def started(self) -> bool:
    """Whether the search is set up (its layout built, on the first `solve`)."""
    return self._layout is not None

  def solve(self, cap: int, node_limit: int | None, deadline: float):
    """Offsets (a list by local id) fitting ``cap``, or "infeasible" (proven), or "aborted".

    ``node_limit`` bounds the nodes this call may visit, over all preorders (``None``: until the
    deadline).
    """
    descents = self._paused.pop(cap, None)
    if descents is None:
      descents = self._start(cap)
      if descents is None:
        return "infeasible"
    self._paused[cap] = descents
    while len(self._paused) > self._KEEP:
      del self._paused[next(iter(self._paused))]
    result = self._round_robin(descents, node_limit, deadline)
    if result is not dfs.PAUSED:
      del self._paused[cap]
      return result
    return "aborted"

  def _start(self, cap: int) -> list[dfs.Resumable] | None:
    """One new descent per preorder, or ``None`` if nothing can fit under ``cap``."""
    core = dfs if self.part.lists else dfs_array
    if self._layout is None:
      self._layout = core.Layout(self.part)
      self._orders = [(h, self._layout.order(h)) for h in PREORDERS]
    descents = [core.Descent(self._layout, h, order, cap) for h, order in self._orders]
    return descents if all(d.feasible() for d in descents) else None

  def _round_robin(self, descents: list[dfs.Resumable], node_limit: int | None, deadline: float):
    """Resumes the descents in turn, with budgets doubling by round, until one of them ends.

    The first preorder (MiniMalloc's default) gets two shares of each round, the others one.
    Returns what that descent returned, or `dfs.PAUSED` when the nodes or the time run out.
    """
    shares = [2] + [1] * (len(descents) - 1)
    chunk, spent = 2 * len(self.part.size), 0
    while node_limit is None or spent < node_limit:
      if node_limit is not None:
        chunk = min(chunk, -(-(node_limit - spent) // sum(shares)))
      for descent, share in zip(descents, shares):
        if time.perf_counter() >= deadline:
          return dfs.PAUSED
        result = descent.resume(share * chunk, deadline)
        if result is not dfs.PAUSED:
          return result
      spent += chunk * sum(shares)
      if time.perf_counter() >= deadline:
        break
      chunk *= 2
    return dfs.PAUSED
