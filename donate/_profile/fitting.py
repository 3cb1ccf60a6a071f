"""A plan that makes a program fit a device, and the largest batch that fits: both thin clients
of `variants.Program.measure` (every figure they give comes from a compile they made).

`fit` composes the measured remedies of `advice.changes` cumulatively: each round compiles every
candidate left with every step taken so far applied, takes the one that saves the most bytes
per FLOP it adds (a change that adds none first), and stops when the program fits the usable
limit (`limits.usable`), or when no candidate left lowers the peak. Changes of one kind
replace one another (one checkpoint policy, one value per compiler option): a candidate of a
kind already taken is measured in its place, so a policy that saves more (at more FLOPs) can
take over from a cheaper one that did not make the program fit.

`largest_batch` searches the batch axis of one argument by compiling the program with
`jax.ShapeDtypeStruct`s of each size tried: doubling from the profiled size while it fits, then
bisecting, in steps of the number of shards the axis is split into. A step can take its batch
from elsewhere (a config value) and slice or ignore the rows past it (MaxText's train step keeps
`micro_batch_size_to_train_on` rows): then only the input grows, and the search would end where
the input alone fills the device. So the second size compiled is compared with the first: when
the step's FLOPs (XLA's and its traced matmuls', each where known) are the same at both, the
search stops there and says so.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax import tree_util

from donate._base.text import format_bytes
from donate._profile import advice, errors, limits, schedule
from donate._profile.variants import Change


@dataclasses.dataclass(frozen=True, slots=True)
class PlanStep:
  """One change of a plan, measured with every earlier step applied.

  Attributes:
    change: the change in words.
    how: the code, keyword or compiler option to write.
    peak_bytes: the peak with this and every earlier step applied (one compile).
    saving_bytes: what this step saved against the previous one's peak.
    flops_ratio: XLA's FLOPs with every step so far against the original's (None: unknown).
    needed_bytes: the bytes the program holds then (what `fits` compares).
    host_bytes: the bytes it keeps in host memory then (offload).
  """

  change: str
  how: str
  peak_bytes: int
  saving_bytes: int
  flops_ratio: float | None
  needed_bytes: int
  host_bytes: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
  """The changes that make a program fit a device (`steps`, in order, cumulative), whether it
  then `fits`, its `peak_bytes` (the last step's; the original's without steps), the `limit`
  compared with, the original's peak and the `compiles` made. Truthy when it fits."""

  steps: tuple[PlanStep, ...]
  fits: bool
  peak_bytes: int
  needed_bytes: int
  limit: limits.Limit
  original_peak_bytes: int
  compiles: int
  same_values: str | None = None
  flops_from: str = "XLA's cost analysis"

  def __bool__(self) -> bool:
    return self.fits

  @property
  def changes(self) -> tuple[str, ...]:
    return tuple(s.how for s in self.steps)

  def __str__(self) -> str:
    limit = self.limit
    head = f"plan to fit {limit}: peak {format_bytes(self.original_peak_bytes)} to start"
    lines = [head]
    for n, s in enumerate(self.steps, 1):
      flops = "" if s.flops_ratio is None else f", {s.flops_ratio:.2f}x FLOPs"
      flops += f", {format_bytes(s.host_bytes)} on the host" if s.host_bytes else ""
      lines.append(
        f"  {n}. {s.change}: peak {format_bytes(s.peak_bytes)} "
        f"(-{format_bytes(s.saving_bytes)}{flops})\n     {s.how}"
      )
    needed = format_bytes(self.needed_bytes)
    if self.fits and not self.steps:
      lines.append(f"  it fits as it is: needs {needed}")
    elif self.fits:
      lines.append(f"  it fits after {_count(len(self.steps), 'step')}: needs {needed}")
    else:
      lines.append(
        f"  nothing measured makes it fit: the closest plan needs {needed}, "
        f"{format_bytes(self.needed_bytes - limit.usable_bytes)} over"
      )
    if self.same_values is not None:
      lines.append(f"  outputs against the original's: {self.same_values}")
    lines.append(f"  ({_count(self.compiles, 'compile')}; FLOPs from {self.flops_from})")
    return "\n".join(lines)


def _kind(c: Change) -> tuple:
  if c.policy is not None or c.loop_policy is not None or c.call_policy is not None:
    return ("checkpoint",)
  if c.host is not None:
    return ("host",)
  if c.options:
    return tuple(k for k, _ in c.options)
  return ("donate", c.donate)


def _with(taken, c: Change) -> tuple[Change, ...]:
  """The steps taken with `c` applied: in place of a taken change of its kind, else after."""
  return (*(t for t in taken if _kind(t) != _kind(c)), c)


def _replacing(steps, taken, c: Change) -> str:
  """ " (in place of step N)" when `c` replaces a taken change of its kind."""
  for t in taken:
    if _kind(t) == _kind(c):
      n = next(i for i, s in enumerate(steps) if s.how == t.how) + 1
      return f" (in place of step {n})"
  return ""


def _limit(device, fraction) -> limits.Limit:
  try:
    return limits.usable(device, fraction)
  except KeyError:
    errors.unknown_device(device)
    raise


def _pick(measured: list, prev_peak: int, program, taken: list):
  """The candidate saving the most bytes per FLOP added (one adding none first); None when
  none lowers the peak."""
  best, best_key = None, None
  for c, m in measured:
    saving = prev_peak - m.peak_bytes
    if saving <= 0:
      continue
    ratio = program.flops_ratio(_with(taken, c)) or 1.0
    added = max(ratio - 1.0, 0.0)
    key = (added <= 1e-9, saving / added if added > 1e-9 else saving)
    if best_key is None or key > best_key:
      best, best_key = (c, m), key
  return best


def _round(profile, lists: list, rounds: int, progress, max_workers) -> list:
  """A round of `fit`: each list of changes measured (`schedule.measure`), announced."""
  who = f"fit: round {rounds}"
  return schedule.measure(profile.program, lists, who, profile.platform, progress, max_workers)


def fit(
  profile,
  device,
  fraction=None,
  candidates=None,
  check_values: bool = True,
  progress: bool | None = None,
  max_workers: int | None = None,
) -> Plan:
  """The plan that makes `profile`'s program fit `device` (see the module docstring). Each
  round's compiles are announced on stderr and run `max_workers` at a time, with a bar on a
  terminal (`progress`: see `schedule`).

  Raises:
    DonationError: an unknown device, or a profile without a program to compile again.
  """
  limit = _limit(device, fraction)
  program = profile.program
  if program is None:
    errors.no_program_for_advice()
  before = program.compiles
  left = list(advice.changes(profile, candidates))
  # The candidates compile with the program itself when the profile says it does not fit.
  first = left if profile.needed_bytes > limit.usable_bytes else []
  base = _round(profile, [(), *((c,) for c in first)], 1, progress, max_workers)[0]
  taken: list[Change] = []
  steps: list[PlanStep] = []
  current = base
  while current.needed_bytes > limit.usable_bytes and left:
    lists = [_with(taken, c) for c in left]
    found = _round(profile, lists, len(steps) + 1, progress, max_workers)
    best = _pick(list(zip(left, found)), current.peak_bytes, program, taken)
    if best is None:
      break
    c, m = best
    ratio = program.flops_ratio(_with(taken, c))
    saving = current.peak_bytes - m.peak_bytes
    change = c.change + _replacing(steps, taken, c)
    step = PlanStep(change, c.how, m.peak_bytes, saving, ratio, m.needed_bytes, m.host_bytes)
    steps.append(step)
    taken = list(_with(taken, c))
    left = [x for x in left if x is not c]
    current = m
  same = None
  if check_values and any(c.retraces for c in taken):
    same = program.same_values(tuple(taken))
  fits = current.needed_bytes <= limit.usable_bytes
  return Plan(
    tuple(steps),
    fits,
    current.peak_bytes,
    current.needed_bytes,
    limit,
    base.peak_bytes,
    program.compiles - before,
    same,
    program.flops_from,
  )


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
  """The largest batch that fits (`batch`; 0 when none does), its `peak_bytes` and
  `needed_bytes`, the `limit` compared with and the `compiles` the search made. `scales`:
  whether the step's FLOPs grow with the axis, from the first two `sizes` compiled (False: they
  do not, the step slices or ignores the rows, and `batch` is the profiled size if it fits;
  None: not known)."""

  batch: int
  peak_bytes: int | None
  needed_bytes: int | None
  limit: limits.Limit
  compiles: int
  argnum: int
  axis: int
  scales: bool | None = None
  sizes: tuple[int, ...] = ()

  def __str__(self) -> str:
    compiles = _count(self.compiles, "compile")
    if self.scales is False:
      first, second = self.sizes[:2]
      verdict = (
        f"batch {self.batch} fits {self.limit}: needs {format_bytes(self.needed_bytes or 0)}"
        if self.batch
        else f"batch {first} does not fit {format_bytes(self.limit.usable_bytes)}"
      )
      return (
        f"axis {self.axis} of argument {self.argnum} does not scale the step: its FLOPs are the"
        f" same at batch {first} and {second} (the step slices or ignores the rows; set its"
        f" batch where it takes it from and profile again); {verdict} ({compiles})"
      )
    if not self.batch:
      return f"no batch fits {format_bytes(self.limit.usable_bytes)} ({compiles})"
    return (
      f"batch {self.batch} (argument {self.argnum}, axis {self.axis}) fits {self.limit}:"
      f" needs {format_bytes(self.needed_bytes or 0)} ({compiles})"
    )


def _step_of(arg, axis: int) -> tuple[int, int]:
  """`(size, step)`: the axis's size in `arg`'s leaves and the number of shards it is split
  into (sizes tried are multiples of it)."""
  leaves = [x for x in tree_util.tree_leaves(arg) if len(np.shape(x)) > axis]
  if not leaves:
    raise ValueError(f"the argument has no leaf with an axis {axis}")
  size, step = np.shape(leaves[0])[axis], 1
  for x in leaves:
    sharding = getattr(x, "sharding", None)
    if sharding is not None and hasattr(sharding, "shard_shape"):
      shard = sharding.shard_shape(np.shape(x))[axis]
      step = max(step, np.shape(x)[axis] // max(shard, 1))
  return int(size), int(step)


def largest_batch(
  profile, device, argnum=None, axis: int = 0, fraction=None, progress: bool | None = None
) -> Batch:
  """The largest size of axis `axis` of positional argument `argnum` (default: the last) at
  which the program fits `device` (see the module docstring). The search is announced on
  stderr, with a bar counting its compiles on a terminal (`progress`: see `schedule`).

  Raises:
    DonationError: an unknown device, or a profile without a function to trace again.
  """
  limit = _limit(device, fraction)
  program = profile.program
  if program is None or not program.can_retrace:
    errors.no_program_for_advice()
  argnum = len(program.args) - 1 if argnum is None else argnum
  size, step = _step_of(program.args[argnum], axis)
  found: dict[int, object] = {}
  what = (
    f"largest_batch: searching axis {axis} of argument {argnum} from {size}, one compile per "
    "size: doubling while it fits, then bisecting"
  )
  with schedule.searching(program, what, profile.platform, progress) as measure:

    def fits(n: int) -> bool:
      if n not in found:
        found[n] = measure((Change("", "", batch=(argnum, axis, n)),))
        if len(found) == 2 and _grows(*found.values()) is False:
          raise _NotScaling
      return found[n].needed_bytes <= limit.usable_bytes  # type: ignore[attr-defined]

    low, high = 0, size // step  # in steps: low fits (0: none), high unknown
    try:
      if fits(high * step):
        low, high = high, high * 2
        while fits(high * step) and high < (size // step) << 24:
          low, high = high, high * 2
      while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    except _NotScaling:
      low = size // step if fits(size // step * step) else 0
  compiles = len(found)
  best = found.get(low * step)
  return Batch(
    low * step,
    getattr(best, "peak_bytes", None),
    getattr(best, "needed_bytes", None),
    limit,
    compiles,
    argnum,
    axis,
    _grows(*list(found.values())[:2]) if len(found) > 1 else None,
    tuple(found),
  )


class _NotScaling(Exception):
  """The step's FLOPs did not change with the batch: the search stops."""


def _grows(a, b) -> bool | None:
  """Whether two compiles of the step at different batch sizes compute different amounts: XLA's
  cost analysis and the traced matmuls' FLOPs, each where known; False only when every one
  known is the same at both; None when neither is known."""
  known = [(x, y) for x, y in ((a.flops, b.flops), (a.dot_flops, b.dot_flops)) if x and y]
  return any(x != y for x, y in known) if known else None


def _count(n: int, noun: str) -> str:
  """`n` and the noun, plural unless `n` is 1: "1 compile", "8 compiles"."""
  return f"{n} {noun}{'s' * (n != 1)}"
