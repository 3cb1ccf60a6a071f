"""Offset assignment, the search's core: one depth-first descent, for one part and one capacity.

Buffers are placed one by one at the lowest offset their placed neighbours (and the part's floor)
allow, in canonical order (non-decreasing offset, then a fixed preorder), with three prunings: a
section's lowest free offset plus the sizes still to place in it must fit (section inference), a
buffer is never placed at or above the top of a buffer that could still go under it (dominance),
and offsets never go down (symmetry). Parts that no unplaced buffer connects are solved one after
the other, and how each ended is remembered.

The depth of the search is the number of buffers. Each level is a generator that ``yield``s the
level below it, and `Descent.resume` runs them on an explicit stack, so the search needs no deep
Python recursion; one that runs out of nodes or time keeps its stack and resumes where it stopped.
The state lives in flat lists indexed by buffer or section, changed in place on the way down and
restored on the way back.
"""

from __future__ import annotations

import bisect
import operator
import time
from typing import Any

import numpy as np

from donate._planner.sweep import INF

MEMO_LIMIT = 200_000  # parts of the search remembered per descent
PAUSED = object()  # what a descent yields and returns when it stops for its budget or deadline


def _neighbours(lo: list[int], hi: list[int]) -> list[list[int]]:
  """For each buffer, the others it meets in time (pairs found from sorted first sections)."""
  m = len(lo)
  lo_a, hi_a = np.asarray(lo), np.asarray(hi)
  order = np.lexsort((np.arange(m), lo_a))
  lo_s, hi_s = lo_a[order], hi_a[order]
  stop = np.searchsorted(lo_s, hi_s, side="left")
  count = stop - np.arange(m) - 1
  first = np.repeat(np.arange(m), count)
  second = first + 1 + np.arange(len(first)) - np.repeat(np.cumsum(count) - count, count)
  x = np.concatenate([order[first], order[second]])
  y = np.concatenate([order[second], order[first]])
  pick = np.argsort(x, kind="stable")
  y = y[pick].tolist()
  bounds = np.searchsorted(x[pick], np.arange(m + 1)).tolist()
  return [y[bounds[i] : bounds[i + 1]] for i in range(m)]


def ranked(labels, heuristic: str, keys) -> list[int]:
  """``labels`` sorted by the heuristic's keys (one letter each), largest first, then by label.

  Keys compare as floats, as they always have: equal beyond 2**53 is a tie.
  """
  return sorted(labels, key=lambda j: tuple(-float(keys[c][j]) for c in heuristic) + (j,))


class Layout:
  """What every descent over one part shares: sizes, sections, neighbours, cuts, sort keys.

  ``keys`` holds the static preorder keys by letter: W = lifetime, A = size x lifetime,
  T = fullest section total, Z = size, C = sections spanned, B = sections x size.
  """

  def __init__(self, part):
    size, lo, hi, totals = part.size, part.lo, part.hi, part.totals
    m = len(size)
    self.size, self.lo, self.hi, self.floor, self.totals = size, lo, hi, part.floor, totals
    spans = [h - low for low, h in zip(lo, hi)]
    self.keys = {
      "W": part.length,
      "A": [w * z for w, z in zip(part.length, size)],
      "T": [max(totals[lo[i] : hi[i]]) for i in range(m)],
      "Z": size,
      "C": spans,
      "B": [w * z for w, z in zip(spans, size)],
    }
    self.neighbours = _neighbours(lo, hi)
    section_members = [[m] for _ in totals]  # id m is a sentinel, always unplaced-INF
    self.cuts = [0] * len(totals)  # cuts[c]: buffers spanning sections c and c + 1
    for j in range(m):
      for s in range(lo[j], hi[j]):
        section_members[s].append(j)
      for c in range(lo[j], hi[j] - 1):
        self.cuts[c] += 1
    self.getters = [operator.itemgetter(*ms) for ms in section_members]
    self.section_members = section_members
    self.around = [operator.itemgetter(*nb, m, m) for nb in self.neighbours]
    self.shift = m.bit_length()
    self.max_size = max(size)

  def order(self, heuristic: str) -> list[int]:
    """Every buffer in the static preorder of ``heuristic`` (e.g. ``"TWA"``)."""
    return ranked(range(len(self.size)), heuristic, self.keys)


class Resumable:
  """What the two descents share, this module's over lists and `dfs_array`'s over arrays: a
  search on an explicit stack of generators, paused between calls. Each sets these in its
  `__init__` (their types differ: lists and dicts here, numpy arrays there)."""

  sections: Any
  stack: list
  nodes: list[int]
  clock: list[float]

  def answer(self) -> list[int]:
    raise NotImplementedError

  def feasible(self) -> bool:
    """Whether every buffer fits above its floor, and every section fits, under ``cap``."""
    return self.sections.feasible()

  def resume(self, budget: int, deadline: float):
    """Runs up to about ``budget`` more nodes: the offsets, "infeasible", or `PAUSED`."""
    self.nodes[0] += budget
    self.clock[0] = deadline
    stack, value = self.stack, None
    while stack:
      try:
        sub = stack[-1].send(value)
      except StopIteration as stop:
        stack.pop()
        value = stop.value
        continue
      if sub is PAUSED:
        return PAUSED
      stack.append(sub)
      value = None
    return self.answer() if value else "infeasible"


class Descent(Resumable):
  """The search for a packing of one part under ``cap``, in one preorder, paused between calls.

  A group's buffers are listed in preorder, so that the key ``offset << shift | position``
  orders candidates by offset, then preorder, and names the buffer. Call `feasible` once before
  the first `resume`.
  """

  def __init__(self, layout: Layout, heuristic: str, order: list[int], cap: int):
    self.layout, self.heuristic, self.cap = layout, heuristic, cap
    size = layout.size
    self.sections = _Sections(layout, cap)
    self.total, self.least = self.sections.total, self.sections.least
    self.solution: dict[int, int] = {}
    self.failed: set[tuple] = set()
    self.solved: dict[tuple, dict[int, int]] = {}
    self.nodes, self.clock = [0], [0.0]  # nodes left in this budget; the deadline
    self.padded = (size + [0], layout.lo + [0], layout.hi + [0])
    hot = (size, layout.lo, layout.hi, layout.neighbours, layout.around, self.total, self.least)
    self.hot = (*hot, list(layout.cuts), cap, self.nodes, self.clock, layout.shift)
    self.stack = [self.visit(self.group(order, 0, len(self.total)), -1, 0)]

  def answer(self) -> list[int]:
    """The offsets found, by local id."""
    return [self.solution[i] for i in range(len(self.layout.size))]

  def group(self, labels: list[int], a: int, b: int) -> tuple:
    """A part of the search: its buffers in preorder, a getter over them, their sizes, and
    its sections. A buffer's position in ``labels`` is its rank in the canonical order."""
    pick = operator.itemgetter(*labels, len(self.layout.size))
    size_x, lo_x, hi_x = self.padded
    return labels, pick, pick(size_x), pick(lo_x), pick(hi_x), a, b

  def solve_part(self, labels: list[int], a: int, b: int):
    """Solves a part from scratch, or recalls how an identical part ended before.

    A part is fully described by its buffers and their lowest offsets (the section totals
    follow from them), so different paths that leave the same part behind share one answer.
    Labels are re-sorted by the heuristic with totals as they stand (as MiniMalloc does).
    """
    labels.sort()
    least, lo, hi, total = self.least, self.layout.lo, self.layout.hi, self.total
    state = (*labels, -1, *[least[j] for j in labels])
    if state in self.failed:
      return False
    known = self.solved.get(state)
    if known is not None:
      self.solution.update(known)
      return True
    fullest = {j: max(total[lo[j] : hi[j]]) for j in labels}
    labels = ranked(labels, self.heuristic, {**self.layout.keys, "T": fullest})
    done = yield self.visit(self.group(labels, a, b), -1, 0)
    if len(self.failed) + len(self.solved) < MEMO_LIMIT:
      if done:
        self.solved[state] = {j: self.solution[j] for j in labels}
      else:
        self.failed.add(state)
    return done

  def decompose(self, grp: tuple, starts: list[int]):
    """Solves the parts of ``grp`` that no unplaced buffer connects, one after the other."""
    labels, a, b = grp[0], grp[5], grp[6]
    parts: list[list[int]] = [[] for _ in range(len(starts) + 1)]
    lo, least = self.layout.lo, self.least
    for j in labels:
      if least[j] < INF:
        parts[bisect.bisect_right(starts, lo[j])].append(j)
    bounds = [a] + starts + [b]
    for q, p in enumerate(parts):
      if p and not (yield self.solve_part(p, bounds[q], bounds[q + 1])):
        return False
    return True

  def candidates(
    self, grp: tuple, lows: tuple, min_top: int, parent_key: int, parent_offset: int
  ) -> tuple[list[int], int]:
    """The keys of the buffers worth placing next, in canonical order, and ``room``.

    Monotonic floor: every buffer left goes at or above the one placed now, so a section
    holding ``t`` units still to place after this buffer needs ``o + t <= cap``. Placing
    buffer j only lowers j's own sections, by size[j]: above offset ``room`` a candidate
    must cover the fullest section, and above ``room + max(size)`` none passes.
    """
    los, his, group_lo, group_hi = grp[3], grp[4], grp[5], grp[6]
    total, shift = self.total, self.layout.shift
    peak = max(total[group_lo:group_hi])
    room = self.cap - peak
    free = max(room, parent_offset)
    stop = max(parent_offset, room + self.layout.max_size) + 1
    if min_top < stop:
      stop = min_top  # dominance: nothing at or above the lowest top an unplaced buffer has
    fullest = total.index(peak, group_lo, group_hi)
    # Canonical order: candidates by (lowest offset, rank), after the parent's.
    keys = sorted(
      [
        x << shift | r
        for r, x in enumerate(lows)
        if x < stop and (x <= free or los[r] <= fullest < his[r])
      ]
    )
    if parent_key >= 0:
      keys = keys[bisect.bisect_right(keys, parent_key) :]
    return keys, room

  def visit(self, grp: tuple, parent_key: int, parent_offset: int):
    """Tries each candidate for the next place in ``grp``, and the rest of ``grp`` above it.

    Returns whether ``grp`` was completed (its offsets are then in ``solution``).
    """
    size, lo, hi, nbrs, around, total, least, cuts, cap, nodes, clock, shift = self.hot
    who, group_lo, group_hi = grp[0], grp[5], grp[6]
    lows = grp[1](least)
    min_top = min(map(operator.add, lows, grp[2]))
    if min_top >= INF:
      return True
    keys, room = self.candidates(grp, lows, min_top, parent_key, parent_offset)
    infer = self.sections.infer
    mask = (1 << shift) - 1
    for k in keys:
      j = who[k & mask]
      o = k >> shift
      sz = size[j]
      a, b = lo[j], hi[j]
      if o != parent_offset:
        if o > room + sz:
          continue
        mx = max(total[a:b])
        if o + mx > cap:
          continue
        if (
          o > room
          and o + max(mx - sz, max(total[group_lo:a], default=0), max(total[b:group_hi], default=0))
          > cap
        ):
          continue
      elif o + max(total[a:b]) > cap:
        continue
      nodes[0] -= 1
      if not nodes[0] & 255 and (nodes[0] <= 0 or time.perf_counter() > clock[0]):
        yield PAUSED
      top = o + sz
      least[j] = INF
      changed = [i for i in nbrs[j] if least[i] < top]
      olds = [least[i] for i in changed]
      for i in changed:
        least[i] = top
      old_total = total[a:b]
      total[a:b] = [t - sz for t in old_total]
      done = False
      if infer(a, b, top, changed):
        starts = []
        for c in range(a, b - 1):
          cuts[c] -= 1
          if not cuts[c]:
            starts.append(c + 1)
        done = yield (self.decompose(grp, starts) if starts else self.visit(grp, k, o))
        for c in range(a, b - 1):
          cuts[c] += 1
      for i, v in zip(changed, olds):
        least[i] = v
      total[a:b] = old_total
      least[j] = o
      if done:
        self.solution[j] = o
        return True
      if min(around[j](least)) >= INF:
        # Nothing unplaced touches j, so j goes here in every completion: no sibling can work.
        return False
    return False


class _Sections:
  """Section inference: in every section, what is still to place goes above the lowest offset
  its unplaced buffers can take, and must fit under ``cap``.

  ``total`` and ``least`` are the descent's state (changed by it in place): per section the size
  still to place, per buffer its lowest offset (``INF`` once placed, and for the sentinel).
  """

  def __init__(self, layout: Layout, cap: int):
    self.layout, self.cap = layout, cap
    self.total = list(layout.totals)
    self.least = list(layout.floor) + [INF]
    # Per section, a buffer that lately had the lowest offset there: checked first.
    self.witness = [len(layout.size)] * len(self.total)

  def feasible(self) -> bool:
    """Whether every buffer fits above its floor, and every section fits, under ``cap``."""
    if any(f + z > self.cap for f, z in zip(self.layout.floor, self.layout.size)):
      return False
    return all(self.fits(s, t) for s, t in enumerate(self.total) if t)

  def fits(self, s: int, t: int) -> bool:
    """Whether section s's lowest unplaced offset plus its total ``t`` is within cap."""
    values = self.layout.getters[s](self.least)
    f = min(values)
    if f + t > self.cap:
      return False
    self.witness[s] = self.layout.section_members[s][values.index(f)]
    return True

  def infer(self, a: int, b: int, top: int, changed: list[int]) -> bool:
    """Section inference after a buffer spanning sections ``[a, b)`` went up to ``top``.

    Whatever is still to place in a section goes above the lowest offset its buffers can take.
    A raised neighbour (``changed``) caps that at top in its own sections, and the placed
    buffer's sections hold at most cap - top (checked before placing it), so of the run of
    sections the raised neighbours span, only the flanks beyond ``[a, b)`` can fail; the fullest
    section of each flank is the likeliest to, so it goes first. In ``[a, b)`` itself
    everything left goes at or above top.
    """
    total, least, witness, cap, fits = self.total, self.least, self.witness, self.cap, self.fits
    if changed:
      spare = cap - top
      left = min(map(self.layout.lo.__getitem__, changed))
      right = max(map(self.layout.hi.__getitem__, changed))
      for x, y in ((left, a), (b, right)):
        if x < y:
          t = max(total[x:y])
          if t > spare:
            s = total.index(t, x, y)
            if least[witness[s]] + t > cap and not fits(s, t):
              return False
            for s in range(x, y):
              t = total[s]
              if t > spare and least[witness[s]] + t > cap and not fits(s, t):
                return False
    for s in range(a, b):
      t = total[s]
      if t and least[witness[s]] + t > cap and not fits(s, t):
        return False
    return True
