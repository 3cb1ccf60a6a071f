"""Offset assignment, pass 3: a MiniMalloc-style search that fits a part under a capacity.

The search (M. D. Moffitt, "MiniMalloc", ASPLOS 2023) builds a packing bottom up: buffers are placed
one by one at the lowest offset their placed neighbours (and the part's floor) allow, in canonical
order (non-decreasing offset, then a fixed preorder), with three prunings: a section's lowest free
offset plus the sizes still to place in it must fit (section inference), a buffer is never placed
at or above the top of a buffer that could still go under it (dominance), and offsets never go
down (symmetry). Parts that no unplaced buffer connects are solved one after the other, and how
each ended is remembered. Several preorders run round robin under a growing node limit.

A part may start from a *floor*: each buffer's lowest allowed offset (the top of fixed buffers
below it). That is how a band of a large packing is re-packed above the rest of it.

The depth of the search is the number of buffers; it runs on an explicit stack of generators
(each level ``yield``s the level below it), so it needs no deep Python recursion, and a search that
runs out of nodes or time keeps its stack and resumes where it stopped when asked again.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import time

import numpy as np

from donate._planner.sweep import INF, components, distinct, section_totals

# Static preorders tried round robin (MiniMalloc's defaults): W = longer lifetime first,
# A = larger area (size x lifetime) first, T = larger fullest-section total first,
# C = more sections first, B = sections x size.
PREORDERS = ("TWA", "WAT", "TAW", "BTC")
MAX_BUFFERS = 2000  # parts larger than this are not searched,
MAX_CELLS = 1_000_000  # nor parts with more (buffer, section) cells or pairs of buffers that meet
_MEMO_LIMIT = 200_000  # parts of the search remembered per run


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Part:
  """Buffers that the search packs together, with local ids ``0..m-1``.

  ``lo``/``hi`` are local section ranges; ``floor`` the lowest offset each buffer may take;
  ``ids`` the buffers' indices in the whole instance.
  """

  ids: np.ndarray
  cells: int
  size: list[int]
  length: list[int]
  lo: list[int]
  hi: list[int]
  totals: list[int]
  floor: list[int]

  @property
  def searchable(self) -> bool:
    return len(self.size) <= MAX_BUFFERS and self.cells <= MAX_CELLS


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
    cells = max(int((hi - lo).sum()), pairs)
    out.append(Part(ids[group], cells, z.tolist(), (ends[ids[group]] - starts[ids[group]]).tolist(),
                    lo.tolist(), hi.tolist(), section_totals(z, lo, hi, int(hi.max())).tolist(),
                    floor[group].tolist()))
  return out


class Search:
  """The search over one part: one resumable search per preorder and capacity, run round robin.

  A search stopped by its node budget or the deadline keeps its place, so asking again for the
  same capacity continues where it stopped instead of starting over.
  """

  _KEEP = 4  # capacities whose paused searches are kept

  def __init__(self, part: Part):
    self.part = part
    self._orders = None
    self._paused: dict[int, list] = {}  # capacity -> paused searches, most recent last

  def solve(self, cap: int, node_limit: int | None, deadline: float):
    """Offsets (a list by local id) fitting ``cap``, or "infeasible" (proven), or "aborted".

    ``node_limit`` bounds the nodes this call may visit, over all preorders (``None``: until the
    deadline).
    """
    if self._orders is None:
      layout = _Layout(self.part)
      self._orders = [_Dfs(layout, h) for h in PREORDERS]
    sessions = self._paused.pop(cap, None)
    if sessions is None:
      sessions = [dfs.session(cap) for dfs in self._orders]
      if None in sessions:
        return "infeasible"
    self._paused[cap] = sessions
    while len(self._paused) > self._KEEP:
      del self._paused[next(iter(self._paused))]
    # The first preorder (MiniMalloc's default) gets two shares of each round, the others one.
    shares = [2] + [1] * (len(sessions) - 1)
    chunk, spent = 2 * len(self.part.size), 0
    while node_limit is None or spent < node_limit:
      if node_limit is not None:
        chunk = min(chunk, -(-(node_limit - spent) // sum(shares)))
      for session, share in zip(sessions, shares):
        if time.perf_counter() >= deadline:
          return "aborted"
        result = session.resume(share * chunk, deadline)
        if result is not _PAUSED:
          del self._paused[cap]
          return result
      spent += chunk * sum(shares)
      if time.perf_counter() >= deadline:
        break
      chunk *= 2
    return "aborted"


_PAUSED = object()  # what a search yields when it stops for its node budget or the deadline


class _Session:
  """One search in progress: its stack of generators (one per level) and its budget."""

  def __init__(self, root, nodes, clock, finish):
    self._stack, self._nodes, self._clock, self._finish = [root], nodes, clock, finish

  def resume(self, budget: int, deadline: float):
    """Runs up to about ``budget`` more nodes: the offsets, "infeasible", or ``_PAUSED``."""
    self._nodes[0] += budget
    self._clock[0] = deadline
    stack, value = self._stack, None
    while stack:
      try:
        sub = stack[-1].send(value)
      except StopIteration as stop:
        stack.pop()
        value = stop.value
        continue
      if sub is _PAUSED:
        return _PAUSED
      stack.append(sub)
      value = None
    return self._finish() if value else "infeasible"


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
  return [y[bounds[i]:bounds[i + 1]] for i in range(m)]


class _Layout:
  """What every preorder's search over one part shares: neighbours, section members, cuts."""

  def __init__(self, part: Part):
    size, lo, hi, totals = part.size, part.lo, part.hi, part.totals
    m = len(size)
    self.size, self.lo, self.hi, self.floor, self.totals = size, lo, hi, part.floor, totals
    self.widths = part.length
    self.spans = [h - l for l, h in zip(lo, hi)]
    self.fullest = [max(totals[lo[i]:hi[i]]) for i in range(m)]
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


class _Dfs:
  """The depth-first search for one part under one static preorder.

  A group's buffers are listed in preorder, so that the key ``offset << shift | position``
  orders candidates by offset, then preorder, and names the buffer.
  """

  def __init__(self, layout: _Layout, heuristic: str, seed: int | None = None):
    self.layout = layout
    m = len(layout.size)
    # A seeded run perturbs every key by a random factor per buffer: a different first descent.
    self.jitter = ([1.0] * m if seed is None else
                   np.exp(np.random.default_rng(seed).normal(0.0, 0.25, m)).tolist())
    self.heuristic = heuristic
    keys = {"W": layout.widths, "A": [w * z for w, z in zip(layout.widths, layout.size)],
            "T": layout.fullest, "Z": layout.size, "C": layout.spans,
            "B": [w * z for w, z in zip(layout.spans, layout.size)]}
    jitter = self.jitter
    self.order = sorted(range(m), key=lambda i: tuple(-keys[c][i] * jitter[i] for c in heuristic)
                        + (i,))

  def session(self, cap: int):
    """A paused search for a packing under ``cap``, or ``None`` if none can exist.

    The search state lives in flat lists indexed by label or section, changed in place and
    restored on the way back; this loop is the hot path, hence one long function.
    """
    layout = self.layout
    total = list(layout.totals)
    size, lo, hi, nbrs, getters = layout.size, layout.lo, layout.hi, layout.neighbours, layout.getters
    around = layout.around
    m, shift = len(size), layout.shift
    if any(f + z > cap for f, z in zip(layout.floor, size)):
      return None
    max_size = max(size)
    mask = (1 << shift) - 1
    least = list(layout.floor) + [INF]  # lowest offset each unplaced buffer can take; INF if placed
    size_x, lo_x, hi_x = size + [0], lo + [0], hi + [0]
    widths, heuristic, spans, jitter = layout.widths, self.heuristic, layout.spans, self.jitter
    cuts = list(layout.cuts)
    nodes, clock = [0], [0.0]
    solution = {}
    failed, solved = set(), {}
    add = operator.add

    witness = [m] * len(total)  # per section, a buffer that recently had its lowest offset
    members = layout.section_members

    def fits(s, t):
      """Whether section s's lowest unplaced offset plus its total ``t`` is within cap."""
      values = getters[s](least)
      f = min(values)
      if f + t > cap:
        return False
      witness[s] = members[s][values.index(f)]
      return True

    if not all(fits(s, t) for s, t in enumerate(total) if t):
      return None

    def group(labels, a, b):
      """A part of the search: its buffers in preorder, a getter over them, their sizes, and
      its sections. A buffer's position in ``labels`` is its rank in the canonical order."""
      pick = operator.itemgetter(*labels, m)
      return labels, pick, pick(size_x), pick(lo_x), pick(hi_x), a, b

    def preorder(labels):
      """Re-sorts a new part by the heuristic, with totals as they stand (as MiniMalloc does)."""
      fields = {"W": widths, "A": [w * z for w, z in zip(widths, size)], "C": spans,
                "B": [w * z for w, z in zip(spans, size)],
                "T": [max(total[lo[j]:hi[j]]) if j in labels else 0 for j in range(m)],
                "Z": size}
      return sorted(labels, key=lambda j: tuple(-fields[c][j] * jitter[j] for c in heuristic) + (j,))

    def solve_part(labels, a, b):
      """Solves a part from scratch, or recalls how an identical part ended before.

      A part is fully described by its buffers and their lowest offsets (the section totals
      follow from them), so different paths that leave the same part behind share one answer.
      """
      labels.sort()
      state = (*labels, -1, *[least[j] for j in labels])
      if state in failed:
        return False
      known = solved.get(state)
      if known is not None:
        solution.update(known)
        return True
      labels = preorder(labels)
      done = yield visit(group(labels, a, b), -1, 0)
      if len(failed) + len(solved) < _MEMO_LIMIT:
        if done:
          solved[state] = {j: solution[j] for j in labels}
        else:
          failed.add(state)
      return done

    def decompose(grp, starts):
      """Solves the parts of ``grp`` that no unplaced buffer connects, one after the other."""
      labels, a, b = grp[0], grp[5], grp[6]
      parts = [[] for _ in range(len(starts) + 1)]
      for j in labels:
        if least[j] < INF:
          parts[bisect.bisect_right(starts, lo[j])].append(j)
      bounds = [a] + starts + [b]
      for q, p in enumerate(parts):
        if p and not (yield solve_part(p, bounds[q], bounds[q + 1])):
          return False
      return True

    def visit(grp, parent_key, parent_offset):
      who, pick, sizes_here, los, his, group_lo, group_hi = grp
      lows = pick(least)
      min_top = min(map(add, lows, sizes_here))
      if min_top >= INF:
        return True
      # Monotonic floor: every buffer left goes at or above the one placed now, so a section
      # holding ``t`` units still to place after this buffer needs ``o + t <= cap``. Placing
      # buffer j only lowers j's own sections, by size[j]: above offset ``room`` a candidate
      # must cover the fullest section, and above ``room + max_size`` none passes.
      peak = max(total[group_lo:group_hi])
      room = cap - peak
      free = max(room, parent_offset)
      stop = max(parent_offset, room + max_size) + 1
      if min_top < stop:
        stop = min_top  # dominance: nothing at or above the lowest top an unplaced buffer has
      fullest = total.index(peak, group_lo, group_hi)
      # Canonical order: candidates by (lowest offset, rank), after the parent's.
      candidates = sorted([x << shift | r for r, x in enumerate(lows) if x < stop and (
          x <= free or los[r] <= fullest < his[r])])
      if parent_key >= 0:
        candidates = candidates[bisect.bisect_right(candidates, parent_key):]
      for k in candidates:
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
          if o > room and o + max(mx - sz, max(total[group_lo:a], default=0),
                                  max(total[b:group_hi], default=0)) > cap:
            continue
        elif o + max(total[a:b]) > cap:
          continue
        nodes[0] -= 1
        if not nodes[0] & 255 and (nodes[0] <= 0 or time.perf_counter() > clock[0]):
          yield _PAUSED
        top = o + sz
        least[j] = INF
        changed = [i for i in nbrs[j] if least[i] < top]
        olds = [least[i] for i in changed]
        for i in changed:
          least[i] = top
        old_total = total[a:b]
        total[a:b] = [t - sz for t in old_total]
        done = False
        ok = True
        # Section inference: whatever is still to place in a section goes above the lowest
        # offset its buffers can take. A raised neighbour caps that at top in its own sections,
        # and j's sections hold at most cap - top (checked above), so of the run of sections
        # the raised neighbours span, only the flanks beyond j's can fail; the fullest section
        # of each flank is the likeliest to, so it goes first.
        if changed:
          spare = cap - top
          left = min(map(lo.__getitem__, changed))
          right = max(map(hi.__getitem__, changed))
          for x, y in ((left, a), (b, right)):
            if x < y:
              t = max(total[x:y])
              if t > spare:
                s = total.index(t, x, y)
                if least[witness[s]] + t > cap and not fits(s, t):
                  ok = False
                  break
                for s in range(x, y):
                  t = total[s]
                  if t > spare and least[witness[s]] + t > cap and not fits(s, t):
                    ok = False
                    break
                if not ok:
                  break
        if ok:
          # In j's own sections everything left goes at or above top.
          for s in range(a, b):
            t = total[s]
            if t and least[witness[s]] + t > cap and not fits(s, t):
              ok = False
              break
        if ok:
          starts = []
          for c in range(a, b - 1):
            cuts[c] -= 1
            if not cuts[c]:
              starts.append(c + 1)
          done = yield (decompose(grp, starts) if starts else visit(grp, k, o))
          for c in range(a, b - 1):
            cuts[c] += 1
        for i, v in zip(changed, olds):
          least[i] = v
        total[a:b] = old_total
        least[j] = o
        if done:
          solution[j] = o
          return True
        if min(around[j](least)) >= INF:
          # Nothing unplaced touches j, so j goes here in every completion: no sibling can work.
          return False
      return False

    return _Session(visit(group(self.order, 0, len(total)), -1, 0), nodes, clock,
                    lambda: [solution[i] for i in range(m)])
