"""Offset assignment, pass 2: fast greedy packings.

Two greedy families, each run under several orders (*preorders*) of the buffers:

* **Skyline** (bottom up): repeatedly take the lowest *valley* of the skyline (a run of sections
  lower than both its neighbours) and put into it the first buffer, in preorder, whose span lies
  inside the valley; if none fits, raise the valley to its lower neighbour. This is exactly the
  first descent of the MiniMalloc search (buffers in order of lowest possible offset, then
  preorder), found without looking at pairs of buffers: the candidates of a valley are a slice of
  the buffers sorted by first section. Each step is O(log n) plus the slice, about 2.4 steps per
  buffer on compiler traces.
* **Best fit** (as TFLite's and XLA's heap simulators): buffers one by one in preorder, each into
  the smallest gap left by the placed buffers it meets in time. Its cost is the number of such
  pairs, so it runs only on instances small enough for that.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from donate._planner.sweep import INF, Instance, range_max, stack

# Preorders: keys sorted descending, buffer index last. "area" = size x lifetime, "peak" = the
# largest total live in the buffer's sections (MiniMalloc's "T"), "life" = lifetime in time steps.
SKYLINE_ORDERS = (
  ("area", "size"),
  ("peak", "life"),
  ("size", "life"),
  ("peak", "size"),
  ("life", "size"),
)
BEST_FIT_ORDERS = (("size", "life"), ("start", "size"))
BEST_FIT_MAX_BUFFERS = 5000
ALWAYS_BEST_FIT = 500  # up to this many buffers, best fit by size is part of the first answer
_SMALL_SLICE = 12  # candidate slices up to this long are scanned in Python, longer ones in numpy


def keys(inst: Instance) -> dict[str, np.ndarray]:
  """Per-buffer sort keys, over all buffers (zero-size ones get any value)."""
  life = inst.ends - inst.starts
  peak = np.zeros(len(inst.sizes), np.int64)
  if len(inst.live):
    peak[inst.live] = range_max(inst.totals, inst.a[inst.live], inst.b[inst.live])
  return {
    "size": inst.sizes,
    "life": life,
    "area": inst.sizes * life,
    "peak": peak,
    "start": -inst.starts,
  }


def preorder(keyset: dict[str, np.ndarray], names: tuple[str, ...], members: np.ndarray):
  """``members`` sorted by the named keys, largest first, then by index."""
  columns = [members] + [-keyset[k][members] for k in reversed(names)]
  return members[np.lexsort(columns)]


def skyline(inst: Instance, order: np.ndarray, deadline: float, *, finish: bool):
  """Bottom-up skyline packing of the buffers ``order`` (highest priority first).

  Returns int64 offsets for every buffer and how many buffers were stacked: if ``deadline``
  passes first, with ``finish`` the buffers not yet placed are stacked above the rest (valid,
  loose); without it, returns ``None``.
  """
  offsets = np.zeros(len(inst.sizes), np.int64)
  if len(order) == 0:
    return offsets, 0
  pending = _Candidates(inst, order)
  size_of, a_of, b_of = inst.sizes.tolist(), inst.a.tolist(), inst.b.tolist()
  sky = _Skyline(inst.num_sections)
  out, steps = [0] * len(inst.sizes), 0
  while sky.heap and pending.left:
    h, v = heapq.heappop(sky.heap)
    level = [v]  # valleys at the lowest height h: handled at once, without the heap
    while level:
      v = level.pop()
      if not sky.is_valley(v, h):
        continue
      steps += 1
      if not steps & 2047 and time.perf_counter() > deadline:
        if not finish:
          return None
        sky.heap.clear()
        break
      i = pending.take(sky.start[v], sky.end[v])
      if i < 0:  # nothing fits: raise the valley to its lower neighbour
        sky.raise_valley(v)
        continue
      out[i] = h
      sky.fill(v, a_of[i], b_of[i], h + size_of[i], level)
  offsets[:] = out
  stack(inst, offsets, pending.remaining())
  return offsets, pending.left


class _Skyline:
  """The top of the placed buffers over the sections, and its valleys.

  A doubly linked list of maximal runs of sections at one height (run ``r`` covers sections
  ``[start[r], end[r])``), in flat lists indexed by run. A *valley* is a run lower than both its
  neighbours; valleys wait in ``heap`` by height and are checked when popped, since a run may
  have changed since it was pushed.
  """

  __slots__ = ("start", "end", "height", "prev", "nxt", "alive", "heap")

  def __init__(self, sections: int):
    self.start, self.end, self.height = [0], [sections], [0]
    self.prev, self.nxt, self.alive = [-1], [-1], [True]
    self.heap = [(0, 0)]

  def is_valley(self, v: int, h: int) -> bool:
    """Whether run ``v`` is still there, at height ``h``, lower than both its neighbours."""
    height = self.height
    if not self.alive[v] or height[v] != h:
      return False
    p, q = self.prev[v], self.nxt[v]
    return not ((p >= 0 and height[p] <= h) or (q >= 0 and height[q] <= h))

  def fill(self, v: int, a: int, b: int, top: int, level: list[int]) -> None:
    """Puts a buffer spanning sections ``[a, b)`` into valley ``v``, which rises to ``top``.

    The parts of the valley beside the buffer become runs of their own at the old height:
    valleys still, appended to ``level``.
    """
    x, y, h, p, q = self.start[v], self.end[v], self.height[v], self.prev[v], self.nxt[v]
    if a > x:
      level.append(self._new_run(x, a, h, p, v))
      self.start[v] = a
    if b < y:
      level.append(self._new_run(b, y, h, v, q))
      self.end[v] = b
    self.height[v] = top
    p, q = self._merge(v, top)
    self._push_valley(v)
    if p >= 0:
      self._push_valley(p)
    if q >= 0:
      self._push_valley(q)

  def raise_valley(self, v: int) -> None:
    """Raises valley ``v`` to its lower neighbour (nothing left fits in it)."""
    height, p, q = self.height, self.prev[v], self.nxt[v]
    top = min(height[p] if p >= 0 else INF, height[q] if q >= 0 else INF)
    if top < INF:
      height[v] = top
      self._merge(v, top)
      self._push_valley(v)

  def _new_run(self, x: int, y: int, h: int, p: int, q: int) -> int:
    r = len(self.start)
    self.start.append(x)
    self.end.append(y)
    self.height.append(h)
    self.prev.append(p)
    self.nxt.append(q)
    self.alive.append(True)
    if p >= 0:
      self.nxt[p] = r
    if q >= 0:
      self.prev[q] = r
    return r

  def _absorb(self, v: int, u: int, back: list[int], fwd: list[int]) -> int:
    """Run ``u``, the neighbour of run ``v`` through ``back``, joins ``v``."""
    self.alive[u] = False
    w = back[v] = back[u]
    if w >= 0:
      fwd[w] = v
    return w

  def _merge(self, v: int, h: int) -> tuple[int, int]:
    """Absorbs the neighbours of run ``v`` (at height ``h``) that have its height."""
    p, q = self.prev[v], self.nxt[v]
    if p >= 0 and self.height[p] == h:
      self.start[v] = self.start[p]
      p = self._absorb(v, p, self.prev, self.nxt)
    if q >= 0 and self.height[q] == h:
      self.end[v] = self.end[q]
      q = self._absorb(v, q, self.nxt, self.prev)
    return p, q

  def _push_valley(self, r: int) -> None:
    h, p, q = self.height[r], self.prev[r], self.nxt[r]
    if (p < 0 or self.height[p] > h) and (q < 0 or self.height[q] > h):
      heapq.heappush(self.heap, (h, r))


class _Candidates:
  """The unplaced buffers sorted by first section, to find the first in preorder whose span
  lies inside a valley ``[x, y)``: a slice by first section, filtered by last. Placed buffers
  are marked, and swept out once they are a quarter of the arrays."""

  def __init__(self, inst: Instance, order: np.ndarray):
    rank = np.full(len(inst.sizes), INF, np.int64)
    rank[order] = np.arange(len(order))
    self._sections = inst.num_sections
    self._load(order[np.argsort(inst.a[order], kind="stable")], inst.a, inst.b, rank)
    self._a, self._b, self._rank = inst.a, inst.b, rank
    self.left = len(order)

  def _load(self, who: np.ndarray, a, b, rank) -> None:
    self.who_np = who
    self.first = np.searchsorted(a[who], np.arange(self._sections + 1)).tolist()
    self.ends_np, self.rank_np = b[who], rank[who]
    self.ends, self.ranks, self.who = self.ends_np.tolist(), self.rank_np.tolist(), who.tolist()
    self.swept = 0

  def take(self, x: int, y: int) -> int:
    """Removes and returns the first buffer in preorder spanning inside ``[x, y)``, or -1."""
    pa, pb = self.first[x], self.first[y]
    k = -1
    if pb - pa <= _SMALL_SLICE:
      best, ends, ranks = INF, self.ends, self.ranks
      for p in range(pa, pb):
        if ranks[p] < best and ends[p] <= y:
          best, k = ranks[p], p
    else:
      seg = np.where(self.ends_np[pa:pb] <= y, self.rank_np[pa:pb], INF)
      p = int(seg.argmin())
      if seg[p] < INF:
        k = pa + p
    if k < 0:
      return -1
    i = self.who[k]
    self.ranks[k] = INF
    self.rank_np[k] = INF
    self._rank[i] = INF
    self.left -= 1
    self.swept += 1
    if self.swept > 1024 and 4 * self.swept > len(self.who):
      keep = self.who_np[self.rank_np < INF]
      self._load(keep, self._a, self._b, self._rank)
    return i

  def remaining(self) -> np.ndarray:
    return self.who_np[self.rank_np < INF]


def best_fit(inst: Instance, order: np.ndarray, deadline: float):
  """Each buffer of ``order`` into the smallest gap among placed time neighbours, or on top.

  Returns int64 offsets for every buffer, or ``None`` if ``deadline`` passes first.
  """
  n = len(inst.sizes)
  offsets = np.zeros(n, np.int64)
  placed = np.zeros(n, bool)
  a, b, sizes = inst.a, inst.b, inst.sizes
  for step, i in enumerate(order.tolist()):
    if not step & 255 and time.perf_counter() > deadline:
      return None
    near = np.flatnonzero(placed & (a < b[i]) & (b > a[i]))
    offsets[i] = _smallest_gap(int(sizes[i]), offsets[near], offsets[near] + sizes[near])
    placed[i] = True
  return offsets


def _smallest_gap(size: int, lows: np.ndarray, tops: np.ndarray) -> int:
  """The lowest offset of the smallest gap of at least ``size`` below or between busy ranges."""
  if len(lows) == 0:
    return 0
  order = np.argsort(lows, kind="stable")
  lows = lows[order]
  floors = np.concatenate([[0], np.maximum.accumulate(tops[order])])
  gaps = lows - floors[:-1]
  fits = np.flatnonzero(gaps >= size)
  if len(fits) == 0:
    return int(floors[-1])
  best = fits[np.argmin(gaps[fits])]
  return int(floors[best])
