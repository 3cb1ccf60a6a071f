"""Donations that left the peak high: an aliased argument with a temporary of about its size live
beside it at the peak (the pattern of openxla/xla #45912), or a peak that is not lower than
without the donations.

XLA made the alias, so the output costs no buffer of its own; but the peak can still hold a
temporary the donated buffer could have held instead: the output that reuses the buffer is
computed from that temporary (`y + s` from `y = exp(x)`; `w - lr * g` from the gradient `g`), so
the donated buffer (idle at the peak, or still read) and the temporary are live together
(`shadows`). Only the dataflow names the temporary: one that merely has the buffer's size is
never blamed. That is
read from the one profile; what the donation saved is measured by compiling the program again
without it (`baseline`, `MemoryProfile.donation_saved_bytes`). For the #45912 pattern on jaxlib
0.10 the donation does lower the peak (48 to 32 MiB for 16 MiB donated) but leaves it at twice
the working set, a temporary of `exp` beside the donated buffer; for an SGD step, a scan over
layers and a transformer step the peak is the same either way (`MemoryProfile.not_lowered`: XLA
reuses buffers without the donation too).

`shadows(dump, module, params, live, peak, peak_bytes)` is pure: the dump and module of one
compile, the argument entries and the temporaries live at the peak in, `Shadow`s out;
`strict_problems(profile, ...)` words both cases for `strict="copies"`.
"""

from __future__ import annotations

import dataclasses
import os

from donate._base.errors import message
from donate._base.text import format_bytes
from donate._profile import naming, reading
from donate._profile.model import Entry
from donate._xla import hlo as _hlo

# "About the same size": the temporary is within this fraction of the donated buffer.
TOLERANCE = 0.125
# A donated buffer below this fraction of the peak is not what keeps the peak high: its shadow
# is not listed (a transformer step's 64 KiB and 512 B temporaries at a 190 MiB peak).
SMALL = 0.01
_FORWARD = ("bitcast", "copy", "get-tuple-element", "tuple", "reshape")


@dataclasses.dataclass(frozen=True, slots=True)
class Shadow:
  """An aliased argument with a temporary of about its size live beside it at the peak.

  Attributes:
    path: the donated argument leaf.
    output: the output that reuses its buffer.
    nbytes: the donated buffer's size (per device).
    temporary: the temporary of about that size live beside it at the peak.
    peak_bytes: the program's peak (`MemoryProfile.peak_bytes`).
    idle: True when the donated buffer holds nothing live at the peak (the temporary could have
      lived in it); False when the output is computed from the temporary.
  """

  path: str
  output: str | None
  nbytes: int
  temporary: Entry
  peak_bytes: int
  idle: bool

  @property
  def operation(self) -> str:
    """The JAX primitive that made the temporary (`exp`), else its HLO value."""
    scope = self.temporary.scope
    return scope.rsplit("/", 1)[-1] if scope else self.temporary.value

  @property
  def where(self) -> str:
    """`file.py:line` of the temporary, or "an unknown line"."""
    source = self.temporary.source
    return os.path.basename(source) if source else "an unknown line"

  @property
  def bytes(self) -> int:
    """The old name of `nbytes`."""
    return self.nbytes

  def __str__(self) -> str:
    return (
      f"aliased, but a {format_bytes(self.temporary.nbytes)} {self.temporary.kind} of "
      f"{self.operation} at {self.where} is live with it: peak "
      f"{format_bytes(self.peak_bytes)}"
    )


def about_the_same(a: int, b: int) -> bool:
  """Whether sizes `a` and `b` differ by at most `TOLERANCE` of the larger."""
  return abs(a - b) <= TOLERANCE * max(a, b)


def shadows(
  dump: reading.Dump, module: _hlo.Module, params, live, peak: int, peak_bytes: int
) -> tuple[Shadow, ...]:
  """The aliased arguments with a temporary of about their size live beside them at the peak
  from which their output is computed (the dataflow: a temporary that merely has their size is
  never named), each temporary named once, largest buffers first; an argument of less than
  `SMALL` (1%) of the peak is left out.

  `params` are the argument entries; `live` pairs each temporary entry at the peak with its
  `reading.Buffer` (whose values may feed the output under other names: a loop's carry).
  """
  by_number = {e.index: e for e in params if e.aliased and e.nbytes}
  candidates = sorted(
    (
      (e, {naming.instruction_name(v[0]) for v in b.values})
      for e, b in live
      if e.kind in ("temporary", "loop carry")
    ),
    key=lambda c: -c[0].nbytes,
  )
  found, used = [], set()
  for a in sorted(filter(reading.on_device, dump.allocations), key=lambda a: -a.nbytes):
    entry = by_number.get(reading.parameter_number(a))
    if entry is None or entry.nbytes < SMALL * peak_bytes:
      continue
    written = [v[0] for v in a.values if 2 * v[1] >= a.nbytes]  # full-size values in the buffer
    idle = not any(_live_at(dump, name, peak) for name in written)
    mine = [n for n in written if n != entry.value and naming.instruction_name(n) != entry.value]
    final = [n for n in mine if (reading.live_range(dump, n) or (0, 0))[1] >= len(dump.sequence)]
    feeds = _operands(module, final or mine)  # what the output (live to the end) is made from
    for t, names in candidates:
      if id(t) in used or not about_the_same(t.nbytes, entry.nbytes):
        continue
      if names & feeds:  # the output is computed from it: the dataflow, not a size alone
        used.add(id(t))
        found.append(
          Shadow(entry.path or entry.value, entry.output, entry.nbytes, t, peak_bytes, idle)
        )
        break
  return tuple(found)


def _live_at(dump: reading.Dump, name: str, step: int) -> bool:
  found = reading.live_range(dump, name)
  return found is not None and found[0] <= step < found[1]


def _operands(module: _hlo.Module, values) -> set[str]:
  """The instructions whose results the instructions defining `values` read (through tuples,
  bitcasts and copies)."""
  found: set[str] = set()
  todo = []
  for value in values:
    instr = module.find(naming.instruction_name(value))
    if instr is not None:
      todo += [(op, instr.computation, 0) for op in instr.operands]
  while todo:
    name, computation, depth = todo.pop()
    if name in found:
      continue
    found.add(name)
    base, k = _hlo.tuple_element(name)  # an operand `while.3#2` (XLA 0.12's dump)
    if k is not None:
      todo.append((base, computation, depth + 1))
    instr = module.find(name, computation)
    if instr is not None and instr.opcode in _FORWARD and depth < 4:
      todo += [(op, instr.computation, depth + 1) for op in instr.operands]
  return found


def not_lowered_reason(peak_bytes: int, without_bytes: int) -> str:
  """The plan's words for an aliased leaf when the peak is not lower than without the donations
  (measured: `MemoryProfile.peak_without_donation_bytes`).

  >>> not_lowered_reason(5 << 19, 5 << 19)
  'aliased, but the peak is 2.5 MiB either way: XLA reuses buffers without the donation too'
  """
  if peak_bytes == without_bytes:
    return (
      f"aliased, but the peak is {format_bytes(peak_bytes)} either way: XLA reuses buffers "
      "without the donation too"
    )
  return (
    f"aliased, but the peak is {format_bytes(peak_bytes)} with the donation and "
    f"{format_bytes(without_bytes)} without it"
  )


def strict_problems(profile, function: str, threshold: int = 0) -> list[str]:
  """For `strict="copies"`, which treats them like copies: one message (the library's shape) per
  aliased leaf of at least `threshold` bytes with a temporary of about its size live beside it
  at the peak (`profile.shadowed`), then one per other aliased leaf of that size when the peak is
  not lower than without the donations (`profile.not_lowered`).

  >>> from donate._profile.model import Entry
  >>> t = Entry(16 << 20, "temporary", "exp", "f32[4194304]", "/src/f.py:6", None, "jit(f)/exp",
  ...           (3, 25))
  >>> print(strict_problems_of([Shadow("x", "out", 16 << 20, t, 32 << 20, True)], (), 0, "f")[0])
  donate: f: at the peak, a temporary of about its size is live beside the donated buffer at x: \
expected the output computed in the donated buffer, nothing of its size beside it, got aliased, \
but a 16.0 MiB temporary of exp at f.py:6 is live with it: peak 32.0 MiB. Fix: \
print(donate.memory_profile(f, *args)) shows the buffers at the peak; compute the value in place \
(or change the code at f.py:6), or leave strict="copies" off to accept it.
  """
  without = profile.peak_without_donation_bytes
  return strict_problems_of(
    profile.shadowed, profile.not_lowered, threshold, function, profile.peak_bytes, without
  )


def strict_problems_of(
  shadowed,
  not_lowered_entries,
  threshold: int,
  function: str,
  peak_bytes: int = 0,
  without_bytes: int | None = None,
) -> list[str]:
  """`strict_problems` of the profile's `shadowed` and `not_lowered` (see there)."""
  found = [
    message(
      f"{function}: at the peak, a temporary of about its size is live beside the donated buffer",
      path=s.path,
      expected="the output computed in the donated buffer, nothing of its size beside it",
      got=str(s),
      fix="print(donate.memory_profile(f, *args)) shows the buffers at the peak; "
      f"compute the value in place (or change the code at {s.where}), or leave "
      "strict=\"copies\" off to accept it",
    )
    for s in shadowed
    if s.nbytes >= threshold
  ]
  named = {s.path for s in shadowed if s.nbytes >= threshold}
  for e in not_lowered_entries:
    path = e.path or e.value
    if e.nbytes < threshold or path in named or without_bytes is None:
      continue
    found.append(
      message(
        f"{function}: the peak is not lower than without the donation",
        path=path,
        expected="a lower peak with the donation than without it",
        got=f"peak {format_bytes(peak_bytes)} with it, {format_bytes(without_bytes)} without it "
        "(XLA reuses buffers without the donation too)",
        fix="print(donate.memory_profile(f, *args)) shows the buffers at the peak; leave "
        "strict=\"copies\" off to accept it",
      )
    )
  return found
