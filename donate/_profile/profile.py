"""`MemoryProfile`: where the memory of one compiled program goes, from XLA's buffer assignment."""

from __future__ import annotations

import dataclasses
import threading

from donate._profile import advice, errors, fitting, limits, model, views
from donate._profile.model import Entry, Suggestion, Timeline


def _source_key(e: Entry) -> str:
  return e.source or (f"({e.kind}) {e.path}" if e.path else f"({e.kind}) {e.value}")


def _scope_key(e: Entry) -> str:
  from donate._profile.naming import group_scope

  if e.kind in ("argument", "output") and e.path is not None:
    return f"({e.kind}s)"
  return group_scope(e.scope) or f"({e.kind}, no scope)"


class Saving:
  """What the donations saved at the peak: `(peak without them, why not measured)`, measured by
  `measure()` the first time `result()` is asked (building a profile compiles nothing more)."""

  __slots__ = ("_measure", "_result", "_lock")

  def __init__(self, measure=None, result: tuple[int | None, str] | None = None):
    self._measure, self._result, self._lock = measure, result, threading.Lock()

  def known(self) -> tuple[int | None, str] | None:
    """The result if it was measured (or needs no compile), else None: compiles nothing."""
    return self._result

  def result(self) -> tuple[int | None, str]:
    with self._lock:
      if self._result is None:
        self._result, self._measure = self._measure(), None
      return self._result


class Remedies:
  """What a profile measures by compiling its program again: whether it fits, what would lower
  its peak, a plan to fit, the largest batch (`MemoryProfile`'s methods)."""

  __slots__ = ()

  @property
  def needed_bytes(self) -> int:
    """What the program holds on the device while it runs: `fits` compares it."""
    raise NotImplementedError

  @property
  def collective_peak_bytes(self) -> int:
    """The most collective memory the program holds at once (in `needed_bytes` too)."""
    return 0

  def fits(self, device, fraction: float | None = None) -> model.Fit:
    """Whether `reserved_bytes` fit what JAX's allocator gives a program on `device` (`"h100"`,
    `"b200"`, or a byte count as it is), read from the environment as the installed JAX does
    (75% of the card by default; `limits.usable`), or `fraction` of the card. Truthy when it
    fits, with `usable_bytes`, `headroom_bytes`; `str()` says which limit and why. Collective
    memory is checked against its own region where it has one (`limits.collective`).

    Raises:
      DonationError: an unknown device name (the message lists the known ones).
    """
    try:
      return limits.fit(self.needed_bytes, device, fraction, None, self.collective_peak_bytes)
    except KeyError:
      errors.unknown_device(device)
      raise

  def advice(self, candidates=None, *, progress=None, max_workers=None) -> tuple:
    """What would lower the peak, each compiled here (`advice.advise`): donation, XLA options,
    checkpoint policies; `candidates` limits them (by their `change` or `how`). The compiles
    are announced on stderr and run `max_workers` at a time (default 1), with a progress bar
    on a terminal (`progress=True`: anywhere; False: nothing printed)."""
    return advice.advise(self, candidates, progress=progress, max_workers=max_workers)

  def fit(
    self, device, fraction: float | None = None, candidates=None, *, progress=None, max_workers=None
  ) -> fitting.Plan:
    """A plan of measured changes, composed, that makes it fit `device` (`fitting.fit`);
    `progress` and `max_workers` as for `advice`."""
    return fitting.fit(
      self, device, fraction, candidates, progress=progress, max_workers=max_workers
    )

  def largest_batch(
    self, device, argnum: int | None = None, axis: int = 0, fraction=None, *, progress=None
  ):
    """The largest batch that fits `device`, found by compiling (`fitting.largest_batch`);
    `progress` as for `advice`."""
    return fitting.largest_batch(self, device, argnum, axis, fraction, progress=progress)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class MemoryProfile(Remedies):
  """Where the memory of one compiled program goes, per device, from XLA's buffer assignment.

  The argument, output, aliased and temporary figures are XLA's allocations, summed as
  `memory_analysis()` sums them (equal byte for byte); `constant_bytes` are the program's
  literals, which none of those four counts. The `timeline` has one step per instruction of XLA's
  schedule: arguments, outputs, aliased buffers and constants are allocated for the whole
  program, temporaries (and collective memory) as XLA's live ranges say. `peak_bytes` is its
  highest point, `at_peak` every buffer live there, largest first; it lies between
  `memory_analysis().peak_memory_in_bytes` and `reserved_bytes`. `explain()` says in words what
  XLA's own figures count and why they differ. `donation_saved_bytes` is what the donations
  saved at the peak, measured by compiling the program again without them when first asked
  (where the profile has the program: a function with its arguments, its `donate.jit` stages).
  `shadowed` names
  the aliased arguments with a temporary of about their size live beside them at the peak;
  `not_lowered` the aliased arguments when the peak is not lower than without the donations.

  >>> import jax, jax.numpy as jnp, donate
  >>> def step(w, x):
  ...   h = jnp.tanh(x @ w)          # a temporary
  ...   return w - 0.1 * (x.T @ h)   # same shape as w: could reuse w's buffer
  >>> p = donate.memory_profile(jax.jit(step), jnp.ones((256, 256)), jnp.ones((256, 256)))
  >>> p.argument_bytes == p.memory_analysis_figures()["argument"], p.peak_bytes <= p.reserved_bytes
  (True, True)
  >>> [(s.path, s.keyword) for s in p.could_donate]
  [('w', 'donate_argnums=0')]
  >>> bool(p.fits("h100")), p.attributed_fraction() >= 0.95
  (True, True)
  """

  function: str
  platform: str
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  xla_peak_bytes: int | None
  timeline: Timeline
  peak_step: int
  at_peak: tuple[Entry, ...]
  could_donate: tuple[Suggestion, ...]
  shadowed: tuple = ()  # aliased, a temporary of their size beside them (`shadow.Shadow`)
  constant_bytes: int = 0
  saving: Saving | None = dataclasses.field(default=None, compare=False)  # measured on demand
  program: object = dataclasses.field(default=None, compare=False)  # `variants.Program` or None
  layout: tuple = dataclasses.field(default=(), compare=False)  # `treemap.packing`'s buffers
  # the opcodes of the entry's instructions that compute (a fusion is one): one for an operation
  # run eagerly, which JAX compiles alone as a program named after it (`broadcast_in_dim`)
  operations: tuple[str, ...] = dataclasses.field(default=(), compare=False)
  host_bytes: int = 0  # what it keeps in host memory (offload): `memory_analysis()`'s host fields

  @property
  def peak_without_donation_bytes(self) -> int | None:
    """The peak of the same program compiled without its donations (one more compile, made the
    first time this, `donation_saved_bytes`, `not_lowered` or a view asks); None when not
    measured (`saving_not_measured` says why)."""
    return self.saving.result()[0] if self.saving is not None else None

  @property
  def saving_not_measured(self) -> str:
    """Why `peak_without_donation_bytes` is None ("" when it is measured)."""
    return self.saving.result()[1] if self.saving is not None else "no baseline was given"

  @property
  def peak_bytes(self) -> int:
    """The timeline's highest point: arguments, outputs, constants and the temporaries live at
    the peak."""
    return self.timeline[self.peak_step].total_bytes

  @property
  def reserved_bytes(self) -> int:
    """Arguments + outputs - aliased + temporaries + constants: what the program holds on the
    device while it runs (its temporaries are one block, sized for the most XLA packs at once,
    gaps included)."""
    held = self.argument_bytes + self.output_bytes - self.alias_bytes
    return held + self.temp_bytes + self.constant_bytes

  @property
  def needed_bytes(self) -> int:
    """What the program holds on the device while it runs: `fits` compares it."""
    return max(self.reserved_bytes, self.peak_bytes)

  @property
  def collective_peak_bytes(self) -> int:
    """The most collective memory live at one step of the schedule (`timeline`)."""
    return max(self.timeline.collective_bytes, default=0)

  @property
  def free_at_peak_bytes(self) -> int:
    """Bytes of the temp block not live at the peak (alignment, gaps XLA's packing leaves)."""
    step = self.timeline[self.peak_step]
    return self.temp_bytes - step.temp_bytes - step.collective_bytes

  @property
  def donation_saved_bytes(self) -> int | None:
    """What the donations saved at the peak, measured: `peak_without_donation_bytes` (the same
    program compiled again without its donations: the same jaxpr, shardings and compiler
    options) minus `peak_bytes`; None when not measured (`saving_not_measured` says why: a
    `jax.stages.Compiled` alone keeps no program to compile again). It can be far less than
    `alias_bytes`: XLA often reuses buffers without a donation too (an SGD step peaks as high
    either way)."""
    without = self.peak_without_donation_bytes
    return None if without is None else without - self.peak_bytes

  @property
  def not_lowered(self) -> tuple[Entry, ...]:
    """The aliased arguments when the donations were measured not to lower the peak
    (`donation_saved_bytes <= 0`), largest first; empty when they did, or were not measured."""
    saved = self.donation_saved_bytes
    if saved is None or saved > 0:
      return ()
    return tuple(e for e in self.at_peak if e.kind == "argument" and e.aliased and e.nbytes)

  @property
  def peak_instruction(self) -> str:
    return self.timeline[self.peak_step].instruction

  def memory_analysis_figures(self) -> dict[str, int]:
    """The profile's figures under `memory_analysis()`'s names (without `_size_in_bytes`)."""
    figures = (self.argument_bytes, self.output_bytes, self.alias_bytes, self.temp_bytes)
    return dict(zip(("argument", "output", "alias", "temp"), figures))

  def attributed_fraction(self) -> float:
    """The share of the bytes at the peak that carry a source line or a pytree path."""
    total = sum(e.nbytes for e in self.at_peak)
    return sum(e.nbytes for e in self.at_peak if e.attributed) / total if total else 1.0

  def by_source(self) -> tuple[model.Group, ...]:
    """The bytes at the peak grouped by the user's source line (arguments and outputs without
    one by their path), largest first."""
    return model.group(self.at_peak, _source_key)

  def by_category(self) -> tuple[model.Group, ...]:
    """The bytes at the peak by category (`Entry.category`): rows with `key`, `total_bytes`
    and `count`, largest first; their bytes sum to `peak_bytes`."""
    return model.group(self.at_peak, lambda e: e.category)

  def by_line(self) -> tuple[model.Line, ...]:
    """The bytes at the peak by the user's source line and category, with how many layers'
    values each holds (`str()`: "6 x 96.0 KiB, layer() at model.py:3 (activations)"), largest
    first."""
    return model.lines(self.at_peak)

  def measure(self) -> MemoryProfile:
    """Measures what the donations saved (one compile without them, the first time) and returns
    the profile, so that `print(profile.measure())` shows it; printing alone compiles nothing."""
    if self.saving is not None:
      self.saving.result()
    return self

  @property
  def saving_measured(self) -> bool:
    """Whether the donation saving is known without a compile (`measure()` makes it so)."""
    return self.saving is None or self.saving.known() is not None

  def by_scope(self) -> tuple[model.Group, ...]:
    """The bytes at the peak grouped by JAX name-stack scope (the `op_name` without its
    primitive; arguments and outputs as `(arguments)`, `(outputs)`), largest first."""
    return model.group(self.at_peak, _scope_key)

  def compare(self, other: MemoryProfile) -> model.Comparison:
    """Lines up this profile's peak (before) with `other`'s (after) by source line and scope.

    `.grew()` lists the source lines with more bytes at the peak in `other`; `str()` prints the
    changes, and what each one's donations saved at its peak where measured.
    """
    by_source = model.changes(self.by_source(), other.by_source())
    by_scope = model.changes(self.by_scope(), other.by_scope())
    saved = (self.donation_saved_bytes, other.donation_saved_bytes)
    return model.Comparison(self.peak_bytes, other.peak_bytes, by_source, by_scope, *saved)

  def explain(self) -> str:
    """What XLA's figures count, and why they differ for this program, in words."""
    return views.explain(self)

  def __str__(self) -> str:
    return views.text(self)

  def __repr__(self) -> str:
    peak = views.size(self.peak_bytes)
    return (
      f"<MemoryProfile of {self.function}: peak {peak}, {len(self.at_peak)} buffers at the peak>"
    )

  def _repr_html_(self) -> str:
    return views.html(self)

  def plot(self, ax=None):
    """The timeline as stacked areas with the peak marked, and the peak by category as bars.

    Needs matplotlib. Returns the matplotlib figure.
    """
    return views.plot(self, ax)
