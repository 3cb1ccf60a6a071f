"""Offset assignment, the search's core for parts of many buffers: `dfs`'s descent over arrays.

The same search as `dfs`, node for node (a test runs both and compares their answers and node
counts), with the same prunings, decomposition, memo and explicit stack. Where `dfs` keeps its
state in Python lists and each buffer's neighbours in a list, which is fastest for a few hundred
buffers but costs a Python loop over the group at every node and memory for every pair of
buffers that meet, here the state lives in numpy arrays indexed by buffer or section, changed in
place on the way down and restored on the way back. A node costs numpy work over its group and
the placed buffer's sections, never a Python loop over either, and memory is linear in the
(buffer, section) cells. `search` picks this one for parts of more than a few hundred buffers.
"""

from __future__ import annotations

import time

import numpy as np

from donate._planner import dfs
from donate._planner.dfs import MEMO_LIMIT, PAUSED
from donate._planner.sweep import INF, range_max

_MEMO_CELLS = 4_000_000  # labels and offsets remembered over all parts, per descent
_HEAD = 64  # candidates put in order at once; the rest only if the search comes back for them


def ranked(labels, heuristic: str, keys) -> np.ndarray:
  """``labels`` sorted by the heuristic's keys (one letter each), largest first, then by label.

  ``keys[c]`` is indexed by label. Keys compare as floats, as they always have: equal beyond
  2**53 is a tie.
  """
  labels = np.asarray(labels, np.int64)
  columns = [labels] + [-np.asarray(keys[c], np.float64)[labels] for c in reversed(heuristic)]
  return labels[np.lexsort(columns)]


class Layout:
  """What every descent over one part shares: sizes, sections, their members, cuts, sort keys.

  ``keys`` holds the static preorder keys by letter: W = lifetime, A = size x lifetime,
  T = fullest section total, Z = size, C = sections spanned, B = sections x size.
  """

  def __init__(self, part):
    self.size, self.lo, self.hi, self.floor = part.size, part.lo, part.hi, part.floor
    m = len(part.size)
    self.size_np = np.asarray(part.size, np.int64)
    self.lo_np = np.asarray(part.lo, np.int64)
    self.hi_np = np.asarray(part.hi, np.int64)
    self.totals = np.asarray(part.totals, np.int64)
    length = np.asarray(part.length, np.int64)
    spans = self.hi_np - self.lo_np
    self.keys = {
      "W": length,
      "A": length * self.size_np,
      "T": range_max(self.totals, self.lo_np, self.hi_np),
      "Z": self.size_np,
      "C": spans,
      "B": spans * self.size_np,
    }
    # Members of section s: members[first[s]:first[s + 1]], by id (int32: it is the largest array).
    owner = np.repeat(np.arange(m, dtype=np.int32), spans)
    section = np.arange(len(owner), dtype=np.int32)
    section += (self.lo_np - (np.cumsum(spans) - spans)).astype(np.int32)[owner]
    self.members = owner[np.argsort(section, kind="stable")]
    del owner, section
    sections = len(self.totals)
    count = np.cumsum(
      np.bincount(self.lo_np, minlength=sections + 1)
      - np.bincount(self.hi_np, minlength=sections + 1)
    )[:sections]
    self.first = np.concatenate([[0], np.cumsum(count)])
    # Per section, the lowest floor among its buffers, and one buffer that has it: what every
    # descent starts from.
    floor = np.append(np.asarray(part.floor, np.int64), INF)
    self.lowest = np.full(len(self.totals), INF, np.int64)
    self.witness = np.full(len(self.totals), m, np.int64)
    held = np.flatnonzero(count)
    if len(held):
      self.lowest[held] = np.minimum.reduceat(floor[self.members], self.first[held])
      self.witness[held] = self.members[self.first[held]]
      other = held[floor[self.witness[held]] != self.lowest[held]]
      self.witness[other] = lowest(self, floor, other)[1]
    cut = np.zeros(len(self.totals) + 1, np.int64)  # cuts[c]: buffers spanning c and c + 1
    np.add.at(cut, self.lo_np, 1)
    np.add.at(cut, np.maximum(self.hi_np - 1, self.lo_np), -1)
    self.cuts = np.cumsum(cut[:-1])
    self.shift = m.bit_length()
    self.max_size = max(part.size)

  def order(self, heuristic: str) -> list[int]:
    """Every buffer in the static preorder of ``heuristic`` (e.g. ``"TWA"``)."""
    return ranked(np.arange(len(self.size)), heuristic, self.keys).tolist()


class Descent(dfs.Resumable):
  """`dfs.Descent` over arrays (`resume` and `feasible` as there, from `dfs.Resumable`).

  The search for a packing of one part under ``cap``, in one preorder, paused between calls.

  A group's buffers are listed in preorder, so that the key ``offset << shift | position``
  orders candidates by offset, then preorder, and names the buffer. Call `feasible` once before
  the first `resume`.
  """

  def __init__(self, layout: Layout, heuristic: str, order: list[int], cap: int):
    self.layout, self.heuristic, self.cap = layout, heuristic, cap
    self.sections = _Sections(layout, cap)
    self.total, self.least = self.sections.total, self.sections.least
    self.cuts = layout.cuts.copy()
    self.solution = np.zeros(len(layout.size), np.int64)
    self.failed: set[bytes] = set()
    self.solved: dict[bytes, np.ndarray] = {}
    self.memo_cells = 0
    self.nodes, self.clock = [0], [0.0]  # nodes left in this budget; the deadline
    self.stack = [self.visit(self.group(order, 0, len(self.total)), -1, 0)]

  def answer(self) -> list[int]:
    """The offsets found, by local id."""
    return self.solution.tolist()

  def group(self, labels, a: int, b: int) -> tuple:
    """A part of the search: its buffers in preorder (a list and an array), their sizes and
    sections, and its sections. A buffer's position in ``labels`` is its rank in the canonical
    order."""
    lay = self.layout
    ids = np.asarray(labels, np.int64)
    labels = labels if isinstance(labels, list) else ids.tolist()
    return labels, ids, lay.size_np[ids], lay.lo_np[ids], lay.hi_np[ids], a, b

  def solve_part(self, labels: np.ndarray, a: int, b: int):
    """Solves a part from scratch, or recalls how an identical part ended before.

    A part is fully described by its buffers and their lowest offsets (the section totals
    follow from them), so different paths that leave the same part behind share one answer.
    Labels are re-sorted by the heuristic with totals as they stand (as MiniMalloc does).
    """
    labels = np.sort(labels)
    state = labels.tobytes() + self.least[labels].tobytes()
    if state in self.failed:
      return False
    known = self.solved.get(state)
    if known is not None:
      self.solution[labels] = known
      return True
    lay = self.layout
    fullest = np.zeros(len(lay.size), np.int64)
    fullest[labels] = range_max(self.total[a:b], lay.lo_np[labels] - a, lay.hi_np[labels] - a)
    order = ranked(labels, self.heuristic, {**lay.keys, "T": fullest})
    done = yield self.visit(self.group(order, a, b), -1, 0)
    if len(self.failed) + len(self.solved) < MEMO_LIMIT and self.memo_cells < _MEMO_CELLS:
      self.memo_cells += 3 * len(labels)
      if done:
        self.solved[state] = self.solution[labels]
      else:
        self.failed.add(state)
    return done

  def decompose(self, grp: tuple, starts: list[int]):
    """Solves the parts of ``grp`` that no unplaced buffer connects, one after the other."""
    ids, lo, a, b = grp[1], grp[3], grp[5], grp[6]
    left = self.least[ids] < INF
    ids, where = ids[left], np.searchsorted(starts, lo[left], side="right")
    bounds = [a] + starts + [b]
    for q in range(len(starts) + 1):
      p = ids[where == q]
      if len(p) and not (yield self.solve_part(p, bounds[q], bounds[q + 1])):
        return False
    return True

  def candidates(self, grp: tuple, parent_offset: int, after: int):
    """The next keys above ``after`` of the buffers worth placing next, in canonical order (up
    to `_HEAD` of them), whether more follow, and ``room``; ``None`` if ``grp`` is complete.

    Monotonic floor: every buffer left goes at or above the one placed now, so a section
    holding ``t`` units still to place after this buffer needs ``o + t <= cap``. Placing
    buffer j only lowers j's own sections, by size[j]: above offset ``room`` a candidate
    must cover the fullest section, and above ``room + max(size)`` none passes. A level asks
    again with its last key when it has tried the first ones: the state is as it was then,
    and no level keeps arrays the size of its group while the levels below it run.
    """
    ids, sizes, los, his, group_lo, group_hi = grp[1:]
    lows = self.least[ids]
    min_top = int((lows + sizes).min())
    if min_top >= INF:
      return None
    totals = self.total[group_lo:group_hi]
    fullest = int(totals.argmax())
    room = self.cap - int(totals[fullest])
    fullest += group_lo
    free = max(room, parent_offset)
    stop = max(parent_offset, room + self.layout.max_size) + 1
    if min_top < stop:
      stop = min_top  # dominance: nothing at or above the lowest top an unplaced buffer has
    rank = np.flatnonzero(lows < stop)
    x = lows[rank]
    keep = (x <= free) | ((los[rank] <= fullest) & (his[rank] > fullest))
    keys, more = _head(x[keep], rank[keep], self.layout.shift, after)
    return keys, more, room

  def visit(self, grp: tuple, parent_key: int, parent_offset: int):
    """Tries each candidate for the next place in ``grp``, and the rest of ``grp`` above it.

    Returns whether ``grp`` was completed (its offsets are then in ``solution``).
    """
    lay, total, least, cuts, cap, nodes, clock = (
      self.layout,
      self.total,
      self.least,
      self.cuts,
      self.cap,
      self.nodes,
      self.clock,
    )
    size, lo, hi, shift = lay.size, lay.lo, lay.hi, lay.shift
    who, ids, _, los, his, group_lo, group_hi = grp
    infer = self.sections.infer
    mask = (1 << shift) - 1
    after, more = parent_key, True
    while more:
      found = self.candidates(grp, parent_offset, after)
      if found is None:
        return True
      keys, more, room = found
      for k in keys:
        j = who[k & mask]
        o = k >> shift
        sz = size[j]
        a, b = lo[j], hi[j]
        mx = int(total[a:b].max())
        if o + mx > cap:
          continue
        if o != parent_offset:
          if o > room + sz:
            continue
          if (
            o > room and o + max(mx - sz, _max(total, group_lo, a), _max(total, b, group_hi)) > cap
          ):
            continue
        nodes[0] -= 1
        if not nodes[0] & 255 and (nodes[0] <= 0 or time.perf_counter() > clock[0]):
          yield PAUSED
        top = o + sz
        least[j] = INF
        current = least[ids]
        low = np.flatnonzero(current < top)
        low = low[(los[low] < b) & (his[low] > a)]
        changed, olds = ids[low], current[low]
        del current, low
        least[changed] = top
        total[a:b] -= sz
        done = False
        if infer(a, b, top, changed):
          spanned = cuts[a : b - 1]
          spanned -= 1
          starts = (np.flatnonzero(spanned == 0) + (a + 1)).tolist()
          done = yield (self.decompose(grp, starts) if starts else self.visit(grp, k, o))
          spanned += 1
        least[changed] = olds
        total[a:b] += sz
        if done:
          least[j] = o
          self.solution[j] = o
          return True
        lonely = not ((los < b) & (his > a) & (least[ids] < INF)).any()
        least[j] = o
        if lonely:
          # Nothing unplaced touches j, so j goes here in every completion: no sibling can work.
          return False
      after = keys[-1] if keys else after
    return False


def _max(values: np.ndarray, a: int, b: int) -> int:
  return int(values[a:b].max()) if b > a else 0


def _head(x: np.ndarray, rank: np.ndarray, shift: int, after: int) -> tuple[list[int], bool]:
  """The smallest `_HEAD` keys ``x << shift | rank`` above ``after`` in ascending order, as
  Python ints, and whether there are more. Keys beyond int64 are built as Python ints."""
  if len(x) and int(x.max()) >= 1 << (62 - shift):
    big = sorted(
      k for k in (int(v) << shift | int(r) for v, r in zip(x.tolist(), rank.tolist())) if k > after
    )
    return big[:_HEAD], len(big) > _HEAD
  keys = x << shift | rank
  keys = keys[keys > after]
  more = len(keys) > _HEAD
  if more:
    keys = np.partition(keys, _HEAD - 1)[:_HEAD]
  keys.sort()
  return keys.tolist(), more


def lowest(layout: Layout, least: np.ndarray, sections: np.ndarray):
  """Per section of ``sections`` (each with members), the lowest ``least`` among its members
  and the first member that has it."""
  if not len(sections):
    return np.zeros(0, np.int64), np.zeros(0, np.int64)
  start, count = layout.first[sections], layout.first[sections + 1] - layout.first[sections]
  offsets = np.cumsum(count) - count
  seg = np.repeat(np.arange(len(sections)), count)
  who = layout.members[start[seg] + np.arange(len(seg)) - offsets[seg]]
  values = least[who]
  low = np.minimum.reduceat(values, offsets) if len(values) else values
  at = np.flatnonzero(values == low[seg])
  at = at[np.concatenate([[True], seg[at[1:]] != seg[at[:-1]]])]  # the first per section
  return low, who[at]


class _Sections:
  """`dfs`'s section inference over arrays: ``total`` per section, ``least`` per buffer (the
  sentinel last), both changed in place by the descent."""

  def __init__(self, layout: Layout, cap: int):
    self.layout, self.cap = layout, cap
    self.total = layout.totals.copy()
    self.least = np.append(np.asarray(layout.floor, np.int64), INF)
    # Per section, a buffer that lately had the lowest offset there: if even it fits, the
    # section does, so only the others are looked at in full.
    self.witness = np.full(len(self.total), len(layout.size), np.int64)

  def feasible(self) -> bool:
    """Whether every buffer fits above its floor, and every section fits, under ``cap``."""
    lay = self.layout
    if (self.least[:-1] + lay.size_np > self.cap).any():
      return False
    self.witness = lay.witness.copy()
    return not ((lay.lowest + self.total > self.cap) & (self.total > 0)).any()

  def fit(self, sections: np.ndarray) -> bool:
    """Whether each of ``sections`` fits: its lowest unplaced offset plus its total is within
    cap. Where they all do, the buffers with those lowest offsets become the witnesses."""
    low, who = lowest(self.layout, self.least, sections)
    if (low + self.total[sections] > self.cap).any():
      return False
    self.witness[sections] = who
    return True

  def infer(self, a: int, b: int, top: int, changed: np.ndarray) -> bool:
    """Section inference after a buffer spanning sections ``[a, b)`` went up to ``top``.

    Whatever is still to place in a section goes above the lowest offset its buffers can take.
    A raised neighbour (``changed``) caps that at top in its own sections, and the placed
    buffer's sections hold at most cap - top (checked before placing it), so of the run of
    sections the raised neighbours span, only the flanks beyond ``[a, b)`` can fail, and only
    where more than cap - top is still to place. In ``[a, b)`` itself everything left goes at
    or above top. A section whose witness still fits is not looked at further.
    """
    x, y = a, b
    t = self.total[a:b]
    check = t > 0
    if len(changed):
      lo, hi = self.layout.lo_np[changed], self.layout.hi_np[changed]
      x, y = min(a, int(lo.min())), max(b, int(hi.max()))
      # In [a, b) a raised neighbour is the lowest at top, and top plus what is left there is
      # within cap (checked before placing), so only the sections it does not span can fail.
      width = b - a + 1
      cover = np.bincount(np.maximum(lo - a, 0), minlength=width) - np.bincount(
        np.minimum(hi - a, b - a), minlength=width
      )
      check &= np.cumsum(cover[:-1]) == 0
      t = self.total[x:y]
      check = np.concatenate([t[: a - x] > self.cap - top, check, t[b - x :] > self.cap - top])
    s = np.flatnonzero(check)
    if not len(s):
      return True
    s = s[self.least[self.witness[s + x]] + t[s] > self.cap]
    return not len(s) or self.fit(s + x)
