"""The data of a memory profile: entries at the peak, the timeline, groups, comparisons, fits.

Everything here is frozen data with its own text; `MemoryProfile` (the user-facing class) puts
them together. Sizes are per device, in bytes, as XLA assigned them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Generic, TypeVar

from donate._base.text import format_bytes
from donate._profile.limits import Fit as Fit
from donate._xla import frames as _frames

KINDS = ("argument", "output", "temporary", "copy", "loop carry", "collective", "constant")


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
  """One buffer live at the peak.

  Attributes:
    nbytes: its size (per device).
    kind: "argument", "output", "temporary", "copy" (a copy XLA added), "loop carry" (a loop's
      state), "collective" (in collective memory) or "constant" (a literal of the program, kept
      on the device for the whole program).
    value: the HLO value (instruction name, with its tuple index for a part of a tuple).
    shape: its HLO shape, e.g. `f32[1024,512]`.
    source: the user's `file:line` that made it (for a copy or a carry: what it copies or
      carries), or None.
    path: the pytree path of an argument or output leaf, or None.
    scope: the JAX name stack (`jit(step)/layer/mlp/dot_general`), or None.
    live: the schedule steps `[start, end)` it is live.
    aliased: an argument an output reuses (a donation XLA made).
    output: for an aliased argument, the output that reuses it.
    index: the entry parameter or output number, for arguments and outputs.
    category: what it is in the user's terms, one of `categories.CATEGORIES` ("parameters",
      "optimizer state", "gradients", "activations", "state", "inputs", "outputs",
      "collective", "temporaries", "constants"), from the program's dataflow.
    function: the user's function at `source`, where XLA's metadata names it.
    repeat: how many layers' values the buffer holds (a `scan` over layers stacks each layer's
      residual into one buffer: its trip count), else 1.
    library: the library's `file:line` under the user's line, where the innermost frame is an
      installed package's (`flax/linen/linear.py:287`), else None.
  """

  nbytes: int
  kind: str
  value: str
  shape: str
  source: str | None
  path: str | None
  scope: str | None
  live: tuple[int, int]
  aliased: bool = False
  output: str | None = None
  index: int | None = None
  category: str = "temporaries"
  function: str | None = None
  repeat: int = 1
  library: str | None = None

  @property
  def attributed(self) -> bool:
    """True when the buffer has a source line or a pytree path."""
    return self.source is not None or self.path is not None

  @property
  def owner(self) -> str:
    """The path, else the source line, else the value: how the text names the buffer."""
    return self.path or self.source or self.value

  @property
  def bytes(self) -> int:
    """The old name of `nbytes`."""
    return self.nbytes


_PerStep = TypeVar("_PerStep", int, tuple[int, ...])


class _OldFigureNames(Generic[_PerStep]):
  """The earlier names of the figures of a `Step` and a `Timeline` (whose temporaries and
  collective bytes are one count per step)."""

  __slots__ = ()
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: _PerStep
  collective_bytes: _PerStep
  constant_bytes: int

  @property
  def arguments(self) -> int:
    """The old name of `argument_bytes`."""
    return self.argument_bytes

  @property
  def outputs(self) -> int:
    """The old name of `output_bytes`."""
    return self.output_bytes

  @property
  def aliased(self) -> int:
    """The old name of `alias_bytes`."""
    return self.alias_bytes

  @property
  def temporaries(self) -> _PerStep:
    """The old name of `temp_bytes`."""
    return self.temp_bytes

  @property
  def collective(self) -> _PerStep:
    """The old name of `collective_bytes`."""
    return self.collective_bytes

  @property
  def constants(self) -> int:
    """The old name of `constant_bytes`."""
    return self.constant_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Step(_OldFigureNames[int]):
  """Bytes live at one step of the schedule, by kind (`alias_bytes`: arguments an output reuses;
  `constant_bytes`: the program's literals, live for the whole program)."""

  index: int
  instruction: str
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  collective_bytes: int
  constant_bytes: int = 0

  @property
  def total_bytes(self) -> int:
    """Every byte live at this step."""
    return (
      self.argument_bytes
      + self.output_bytes
      + self.alias_bytes
      + self.constant_bytes
      + self.temp_bytes
      + self.collective_bytes
    )

  @property
  def total(self) -> int:
    """The old name of `total_bytes`."""
    return self.total_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Timeline(_OldFigureNames[tuple[int, ...]], Sequence):
  """The program's schedule, one `Step` per instruction (built on access: programs are long).

  The bytes of arguments, outputs, aliased arguments and constants are the same at every step;
  `temp_bytes` and `collective_bytes` hold one count per step.
  """

  instructions: tuple[str, ...]
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: tuple[int, ...]
  collective_bytes: tuple[int, ...]
  constant_bytes: int = 0

  def __len__(self) -> int:
    return len(self.temp_bytes)

  def __getitem__(self, t):
    if isinstance(t, slice):
      return [self[k] for k in range(*t.indices(len(self)))]
    t = range(len(self))[t]
    name = self.instructions[t] if t < len(self.instructions) else "?"
    return Step(
      t,
      name,
      self.argument_bytes,
      self.output_bytes,
      self.alias_bytes,
      self.temp_bytes[t],
      self.collective_bytes[t],
      self.constant_bytes,
    )

  def totals(self) -> list[int]:
    """The total bytes at every step."""
    fixed = self.argument_bytes + self.output_bytes + self.alias_bytes + self.constant_bytes
    return [fixed + a + b for a, b in zip(self.temp_bytes, self.collective_bytes)]


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
  """Bytes at the peak that share a key (a source line, a scope), largest first."""

  key: str
  total_bytes: int
  count: int
  kinds: tuple[str, ...]

  def __str__(self) -> str:
    return f"{self.key}: {format_bytes(self.total_bytes)} at the peak ({self.count} buffers)"

  @property
  def bytes(self) -> int:
    """The old name of `total_bytes`."""
    return self.total_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Line:
  """Bytes of one category at the peak made at one source line: `count` layers' values (a
  scanned layer's stacked residual counts its trip count); `library`: the library's line under
  it that made the most of them (`flax/linen/linear.py:287`), where there is one.

  >>> str(Line("model.py:3", "layer", 32 << 20, 4, "activations"))
  '4 x 8.0 MiB, layer() at model.py:3 (activations)'
  """

  source: str
  function: str | None
  total_bytes: int
  count: int
  category: str
  library: str | None = None

  def __str__(self) -> str:
    import os

    where = os.path.basename(self.source) if ":" in self.source else self.source
    at = f"{self.function.rsplit('.', 1)[-1]}() at {where}" if self.function else where
    each = format_bytes(self.total_bytes // max(self.count, 1))
    return f"{self.count} x {each}, {at} ({self.category})"

  @property
  def bytes(self) -> int:
    """The old name of `total_bytes`."""
    return self.total_bytes


def library(entries) -> str | None:
  """The library's line that made the most bytes of `entries`, or None without one."""
  made: dict[str, int] = {}
  for e in entries:
    if e.library:
      made[e.library] = made.get(e.library, 0) + e.nbytes
  return max(made, key=lambda k: made[k]) if made else None


def lines(entries) -> tuple[Line, ...]:
  """The entries grouped by source line and category (those without a line left out), largest
  first."""
  found: dict[tuple[str, str], list] = {}
  for e in entries:
    if e.source is not None:
      found.setdefault((e.source, e.category), []).append(e)
  rows = [
    Line(
      source,
      next((e.function for e in es if e.function), None),
      sum(e.nbytes for e in es),
      sum(e.repeat for e in es),
      category,
      library(es),
    )
    for (source, category), es in found.items()
  ]
  return tuple(sorted(rows, key=lambda r: (-r.total_bytes, r.source, r.category)))


@dataclasses.dataclass(frozen=True, slots=True)
class Suggestion:
  """An input not donated whose buffer an output of the same shape, dtype and sharding could
  reuse: donating it lowers the peak by its size, `nbytes` (unless XLA then needs a copy).
  `how`: what to write in the user's framework's terms where jax.jit's keywords are not theirs
  (`eqx.filter_jit(donate="all")`)."""

  path: str
  output: str
  nbytes: int
  argnum: int | None
  argname: str
  how: str | None = None

  @property
  def keyword(self) -> str:
    """What to write: `donate_argnums=N` (or `donate_argnames='name'` without a position), or
    the framework's own keyword (`how`)."""
    if self.how is not None:
      return self.how
    if self.argnum is not None:
      return f"donate_argnums={self.argnum}"
    return f"donate_argnames={self.argname!r}"

  def __str__(self) -> str:
    return (
      f"donate {self.path} ({self.keyword}): {self.output} can reuse it, "
      f"-{format_bytes(self.nbytes)} at the peak"
    )

  @property
  def bytes(self) -> int:
    """The old name of `nbytes`."""
    return self.nbytes


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
  """One key's bytes at the peak in two profiles."""

  key: str
  before_bytes: int
  after_bytes: int

  @property
  def delta_bytes(self) -> int:
    """`after_bytes - before_bytes`."""
    return self.after_bytes - self.before_bytes

  @property
  def before(self) -> int:
    """The old name of `before_bytes`."""
    return self.before_bytes

  @property
  def after(self) -> int:
    """The old name of `after_bytes`."""
    return self.after_bytes

  @property
  def delta(self) -> int:
    """The old name of `delta_bytes`."""
    return self.delta_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Comparison:
  """Two profiles' peaks lined up by source line (or path) and by scope: what grew."""

  before_peak_bytes: int
  after_peak_bytes: int
  by_source: tuple[Change, ...]
  by_scope: tuple[Change, ...]
  before_saved_bytes: int | None = None  # what each one's donations saved at its peak (None:
  after_saved_bytes: int | None = None  # not measured; `MemoryProfile.donation_saved_bytes`)

  @property
  def delta_bytes(self) -> int:
    """`after_peak_bytes - before_peak_bytes`."""
    return self.after_peak_bytes - self.before_peak_bytes

  def grew(self) -> list[Change]:
    """The source lines (or paths) with more bytes at the peak after, largest growth first."""
    return [c for c in self.by_source if c.delta_bytes > 0]

  def __str__(self) -> str:
    lines = [
      f"peak {format_bytes(self.before_peak_bytes)} -> {format_bytes(self.after_peak_bytes)} "
      f"({'+' if self.delta_bytes >= 0 else ''}{format_bytes(self.delta_bytes)})"
    ]
    if (self.before_saved_bytes, self.after_saved_bytes) != (None, None):
      saved = [
        format_bytes(b) if b is not None else "not measured"
        for b in (self.before_saved_bytes, self.after_saved_bytes)
      ]
      lines.append(f"  donation saved at the peak: {saved[0]} -> {saved[1]}")
    for title, rows in (("by source line", self.by_source), ("by scope", self.by_scope)):
      changed = [c for c in rows if c.delta_bytes][:10]
      if changed:
        lines.append(f"  {title}:")
        lines += [
          f"    {'+' if c.delta_bytes > 0 else ''}{format_bytes(c.delta_bytes):>10}  "
          f"{_clip(_frames.shown(c.key) or c.key, 80)}"
          for c in changed
        ]
    return "\n".join(lines)

  @property
  def before_peak(self) -> int:
    """The old name of `before_peak_bytes`."""
    return self.before_peak_bytes

  @property
  def after_peak(self) -> int:
    """The old name of `after_peak_bytes`."""
    return self.after_peak_bytes

  @property
  def before_saved(self) -> int | None:
    """The old name of `before_saved_bytes`."""
    return self.before_saved_bytes

  @property
  def after_saved(self) -> int | None:
    """The old name of `after_saved_bytes`."""
    return self.after_saved_bytes

  @property
  def delta(self) -> int:
    """The old name of `delta_bytes`."""
    return self.delta_bytes


def _clip(text: str, width: int) -> str:
  return text if len(text) <= width else "…" + text[-(width - 1) :]


def group(entries, key) -> tuple[Group, ...]:
  """Entries grouped by `key(entry)`, largest total first."""
  found: dict[str, list] = {}
  for e in entries:
    found.setdefault(key(e), []).append(e)
  groups = [
    Group(k, sum(e.nbytes for e in es), len(es), tuple(sorted({e.kind for e in es})))
    for k, es in found.items()
  ]
  return tuple(sorted(groups, key=lambda g: (-g.total_bytes, g.key)))


def changes(before: Sequence[Group], after: Sequence[Group]) -> tuple[Change, ...]:
  """Keys of two groupings lined up, largest change first."""
  a = {g.key: g.total_bytes for g in before}
  b = {g.key: g.total_bytes for g in after}
  rows = [Change(k, a.get(k, 0), b.get(k, 0)) for k in {**a, **b}]
  return tuple(sorted(rows, key=lambda c: (-abs(c.delta_bytes), c.key)))
