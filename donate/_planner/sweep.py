"""Offset assignment, pass 1: time compressed into sections, and the parts a packing splits into.

Everything here is numpy over whole arrays, O(n log n) in the number of buffers, with memory linear
in it: no pass enumerates the pairs of buffers that meet in time (a 62k-buffer compiler trace has
180 million such pairs).

A *section* is the set of buffers live just before some buffer dies. Buffer ``i`` spans the
sections ``[a[i], b[i])``, and two buffers meet in time exactly when their section ranges
intersect, so sections carry everything a packing needs to know about time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

INF = 1 << 62


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Instance:
  """Buffers in compressed form (sizes in units of their common factor).

  Attributes:
    sizes, starts, ends: per buffer, int64 arrays; ``ends`` are exclusive.
    a, b: per buffer, the half-open range of sections it spans.
    totals: per section, the total size live in it.
    lower_bound: ``max(totals)``; no packing is lower.
    live: indices of the buffers of positive size (zero-size buffers sit at offset 0).
  """

  sizes: np.ndarray
  starts: np.ndarray
  ends: np.ndarray
  a: np.ndarray
  b: np.ndarray
  totals: np.ndarray
  lower_bound: int
  live: np.ndarray

  @property
  def num_sections(self) -> int:
    return len(self.totals)


def build(sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Instance:
  """Sections and their totals for buffers live on ``[starts[i], ends[i])``."""
  deaths = distinct(ends)
  a = np.searchsorted(deaths, starts, side="right")
  b = np.searchsorted(deaths, ends, side="right")
  live = np.flatnonzero(sizes > 0)
  totals = section_totals(sizes[live], a[live], b[live], len(deaths))
  return Instance(sizes, starts, ends, a, b, totals, int(totals.max(initial=0)), live)


def distinct(values: np.ndarray) -> np.ndarray:
  """The sorted distinct values (``np.unique`` by sorting, which is faster on integers)."""
  ordered = np.sort(values)
  return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])] if len(ordered) else ordered


def section_totals(sizes: np.ndarray, a: np.ndarray, b: np.ndarray, count: int) -> np.ndarray:
  """Per section, the total of ``sizes`` over the buffers spanning it (exact int64)."""
  diff = np.zeros(count + 1, np.int64)
  np.add.at(diff, a, sizes)
  np.add.at(diff, b, -sizes)
  return np.cumsum(diff[:count])


def components(a: np.ndarray, b: np.ndarray, members: np.ndarray) -> list[np.ndarray]:
  """Splits ``members`` into groups that no buffer connects in time, in time order."""
  if len(members) == 0:
    return []
  order = np.argsort(a[members], kind="stable")
  ordered = members[order]
  reach = np.maximum.accumulate(b[ordered])
  cuts = np.flatnonzero(a[ordered][1:] >= reach[:-1]) + 1
  return np.split(ordered, cuts)


def range_max(values: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """``max(values[a[k]:b[k]])`` for every k (each range non-empty), by a sparse table."""
  table = [values]
  length = 1
  while 2 * length <= len(values):
    prev = table[-1]
    table.append(np.maximum(prev[:-length], prev[length:]))
    length *= 2
  level = np.log2(np.maximum(b - a, 1)).astype(np.int64)
  out = np.empty(len(a), values.dtype)
  for k in distinct(level).tolist():
    pick = level == k
    row = table[k]
    out[pick] = np.maximum(row[a[pick]], row[b[pick] - (1 << k)])
  return out


def stack(inst: Instance, offsets: np.ndarray, todo: np.ndarray) -> None:
  """Places the buffers ``todo`` above everything else, in place: the answer of last resort.

  O(n log n) and valid whatever else is placed. Each buffer goes to the smallest node of a binary
  tree over the sections that holds its whole span; the nodes of one level cover disjoint
  sections, so they share one band, as high as their fullest node, and the bands are stacked.
  """
  if len(todo) == 0:
    return
  done = np.ones(len(inst.sizes), bool)
  done[todo] = False
  base = int((offsets[done] + inst.sizes[done]).max(initial=0))
  a, last, sizes = inst.a[todo], inst.b[todo] - 1, inst.sizes[todo]
  level = np.zeros(len(todo), np.int64)  # the bit length of a ^ last: the node's level
  differ = a ^ last
  while differ.any():
    level += differ > 0
    differ >>= 1
  node = a >> level
  order = np.lexsort((node, level))
  level, node, sizes = level[order], node[order], sizes[order]
  new_group = np.concatenate([[True], (level[1:] != level[:-1]) | (node[1:] != node[:-1])])
  below = np.cumsum(sizes) - sizes  # sizes before each buffer, over all groups
  within = below - np.maximum.accumulate(np.where(new_group, below, 0))
  fullest = np.zeros(int(level.max()) + 1, np.int64)
  np.maximum.at(fullest, level, within + sizes)
  bands = np.concatenate([[0], np.cumsum(fullest)[:-1]])
  offsets[todo[order]] = base + bands[level] + within


def cells(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Every section of every range ``[a[k], b[k])``, and the k each one comes from."""
  lengths = (b - a).astype(np.int64)
  owner = np.repeat(np.arange(len(a), dtype=np.int64), lengths)
  first = np.cumsum(lengths) - lengths
  return a.astype(np.int64)[owner] + np.arange(len(owner), dtype=np.int64) - first[owner], owner
