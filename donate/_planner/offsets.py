"""Offset assignment: packing buffers with known live ranges into one pool.

This is the dynamic storage allocation problem. Each buffer ``i`` needs ``sizes[i]`` contiguous
bytes while it is live on the half-open interval ``[starts[i], ends[i])``; two buffers whose
intervals overlap must not overlap in memory. The pool's height is the highest byte any buffer
uses, and the lower bound is the largest total size live at one moment.

Sizes are rounded up to the alignment and divided by their common factor (which loses nothing: an
optimal packing can always be pushed down until every offset is a sum of sizes). Then:

1. Sweep (`sweep`): time compressed into sections, O(n log n), linear memory.
2. Greedy (`greedy`): a bottom-up skyline packing under several buffer orders, and best
   fit (as XLA's and TFLite's heap simulators) where the instance is small enough. The first one
   is the first answer; the best one is where the search starts.
3. Search (`packing` drives it; `search` splits parts and runs preorders round robin; `dfs` is
   one descent): without a capacity, bisection on the height between the lower bound and the
   best height found; each probe asks the MiniMalloc-style search to fit a capacity, with a node
   budget that grows by rounds. Instances too large to search whole are improved a *band* at a
   time: the buffers above some offset are re-packed, under the probe's capacity, on the floor
   that the buffers below them leave.

``time_limit`` is a deadline for the whole call: every loop checks the clock, and if even the first
greedy answer is not finished by then, the buffers it has not placed are stacked above the rest.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from donate._base.errors import DonationError, message
from donate._planner import packing, sweep
from donate._planner.text import size_text

__all__ = ["OffsetAssignment", "assign_offsets"]


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetAssignment:
  """Where each buffer lives in the pool, and how good that is.

  Attributes:
    offsets: byte offset of each buffer, in input order; a multiple of the alignment.
    height: pool bytes needed, ``max(offset + aligned size)``.
    lower_bound: the largest total aligned size live at one moment; no assignment is lower.
    greedy_height: the height of the best fast greedy answer, where the search started.
    optimal: ``True`` when ``height`` is proven minimal (it equals the lower bound, or the search
      ruled out every lower height).
    seconds: wall time spent.
    method: ``"greedy"`` or ``"greedy+search"`` (``"empty"`` for no buffers; ``"stacked"`` when
      the time limit ran out before the first greedy answer was complete).
    capacity: the capacity asked for, or ``None`` when the height was minimised.
    first_seconds: wall time until the first valid assignment was ready.

  >>> a = assign_offsets([64, 64, 64, 64], [0, 0, 0, 2], [2, 2, 2, 3])
  >>> a.height, a.lower_bound, a.optimal
  (192, 192, True)
  """

  offsets: tuple[int, ...]
  height: int
  lower_bound: int
  greedy_height: int
  optimal: bool
  seconds: float
  method: str
  capacity: int | None = None
  first_seconds: float = 0.0

  @property
  def fits(self) -> bool:
    """Whether the height is within the capacity (always ``True`` without a capacity)."""
    return self.capacity is None or self.height <= self.capacity

  @property
  def ratio(self) -> float:
    """``height / lower_bound`` (1.0 for an empty pool)."""
    return self.height / self.lower_bound if self.lower_bound else 1.0

  def __str__(self) -> str:
    greedy_ratio = self.greedy_height / self.lower_bound if self.lower_bound else 1.0
    status = "optimal" if self.optimal else "not proven optimal"
    bound = size_text(
      self.height,
      self.lower_bound,
      f"{self.ratio:.3f}x; greedy {self.greedy_height}, {greedy_ratio:.3f}x",
    )
    text = f"OffsetAssignment: {len(self.offsets)} buffers, height {bound}, {status}"
    if self.capacity is not None:
      text += f", {'fits' if self.fits else 'does not fit'} capacity {self.capacity}"
    return text + f", {self.method}, {self.seconds:.2f} s"


def assign_offsets(
  sizes: Sequence[int],
  starts: Sequence[int],
  ends: Sequence[int],
  *,
  alignment: int = 1,
  capacity: int | None = None,
  time_limit: float = 10.0,
  search: bool = True,
) -> OffsetAssignment:
  """Assigns pool offsets to buffers live on half-open intervals ``[start, end)``.

  Two buffers whose intervals overlap never overlap in memory. Fast greedy packings come first;
  the search then starts from the best of them, so the answer is never worse than that, and
  improves it until it is proven optimal, fits ``capacity``, or ``time_limit`` runs out.

  Args:
    sizes: bytes per buffer, non-negative integers (rounded up to ``alignment`` when packing).
    starts: first time step each buffer is live.
    ends: first time step each buffer is dead again; ``ends[i] > starts[i]``.
    alignment: every offset is a multiple of this.
    capacity: if given, stop at the first assignment whose height fits within it; if none is found
      in time, the best one found is returned and its ``fits`` is ``False``. If ``None``, minimise
      the height.
    time_limit: seconds the whole call may take. The best valid assignment found by then is
      returned; if even the first greedy answer is not complete, the buffers it has not placed
      yet are stacked above the others (valid, but loose).
    search: ``False`` returns the best greedy answer without searching.

  Returns:
    An :class:`OffsetAssignment`.

  Raises:
    DonationError: if the lists differ in length, a size is negative, an interval is empty, or
      ``alignment`` is below 1.

  >>> a = assign_offsets([64, 64, 64, 64], [0, 0, 0, 2], [2, 2, 2, 3])
  >>> a.offsets, a.height, a.lower_bound
  ((0, 64, 128, 0), 192, 192)
  >>> assign_offsets([4, 4, 4, 4, 4], [0, 3, 0, 9, 0], [3, 9, 9, 21, 21], capacity=12).height
  12
  """
  t0 = time.perf_counter()
  size_arr, start_arr, end_arr = _check_inputs(sizes, starts, ends, alignment, capacity, time_limit)
  aligned = -(-size_arr // alignment) * alignment
  unit = int(np.gcd.reduce(aligned)) if len(aligned) else 0
  unit = unit or alignment
  inst = sweep.build(aligned // unit, start_arr, end_arr)
  n = len(size_arr)
  if inst.lower_bound == 0:
    return OffsetAssignment((0,) * n, 0, 0, 0, True, time.perf_counter() - t0, "empty", capacity)
  cap = None if capacity is None else capacity // unit
  plan = packing.Packing(inst, cap, t0, t0 + time_limit)
  plan.greedy()
  if search and not plan.done():
    plan.improve()
  return OffsetAssignment(
    offsets=tuple((plan.offsets * unit).tolist()),
    height=int(plan.height) * unit,
    lower_bound=inst.lower_bound * unit,
    greedy_height=int(plan.greedy_height) * unit,
    optimal=plan.proven or plan.height == inst.lower_bound,
    seconds=time.perf_counter() - t0,
    method=plan.method,
    capacity=capacity,
    first_seconds=plan.first_seconds,
  )


def _check_inputs(
  sizes, starts, ends, alignment, capacity, time_limit
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Validates the arguments and returns the three sequences as int64 arrays."""
  sizes, starts, ends = (
    _ints(v, name) for v, name in ((sizes, "sizes"), (starts, "starts"), (ends, "ends"))
  )
  if not len(sizes) == len(starts) == len(ends):
    raise DonationError(
      message(
        "assign_offsets needs one size, start and end per buffer",
        expected="three sequences of equal length",
        got=f"{len(sizes)} sizes, {len(starts)} starts and {len(ends)} ends",
      )
    )
  negative = np.flatnonzero(sizes < 0)
  if len(negative):
    i = int(negative[0])
    raise DonationError(
      message("negative buffer size", path=f"sizes[{i}]", expected="a size >= 0", got=str(sizes[i]))
    )
  empty = np.flatnonzero(ends <= starts)
  if len(empty):
    i = int(empty[0])
    raise DonationError(
      message(
        "empty live range",
        path=f"buffer {i}",
        expected="ends[i] > starts[i]",
        got=f"start {starts[i]}, end {ends[i]}",
        fix="live ranges are half-open, [start, end)",
      )
    )
  if _ints([alignment], "alignment")[0] < 1:
    raise DonationError(
      message("bad alignment", path="alignment", expected="an integer >= 1", got=repr(alignment))
    )
  if capacity is not None and _ints([capacity], "capacity")[0] < 0:
    raise DonationError(
      message(
        "bad capacity", path="capacity", expected="None or an integer >= 0", got=repr(capacity)
      )
    )
  if not time_limit >= 0:
    raise DonationError(
      message("bad time limit", path="time_limit", expected="seconds >= 0", got=repr(time_limit))
    )
  return sizes, starts, ends


def _ints(values, name: str) -> np.ndarray:
  """``values`` as an int64 array, or a DonationError naming the first entry that is not an int."""
  try:
    array = np.asarray(values if isinstance(values, np.ndarray) else list(values))
  except TypeError:
    raise DonationError(
      message(
        "not a sequence", path=name, expected="a sequence of integers", got=type(values).__name__
      )
    ) from None
  if array.dtype.kind in "iu" and array.ndim == 1:
    return array.astype(np.int64)
  items = array.tolist() if array.ndim == 1 else list(values)
  for i, v in enumerate(items):
    if isinstance(v, bool) or not isinstance(v, int):
      path = name if name in ("alignment", "capacity") else f"{name}[{i}]"
      raise DonationError(message("not an integer", path=path, expected="an integer", got=repr(v)))
  return np.asarray(items, np.int64)
