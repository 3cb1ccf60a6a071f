"""The records of the copies report: `CopyRecord`, one copy XLA inserted, and its `Loop`s.

`donate._xla.copies.find_copies` makes them; a plan lists them (`DonationPlan.copies`).
"""

from __future__ import annotations

import dataclasses

from donate._base.text import notebook_cell


@dataclasses.dataclass(frozen=True, slots=True)
class Loop:
  """A while loop of the compiled program (from `scan`, `fori_loop`, `while_loop`, ...).

  Attributes:
    name: the HLO `while` instruction.
    line: the user's source line of the loop, "file:line (function)", if known.
    trip_count: iterations per execution, when XLA knows it (`known_trip_count`).
    kind: "scan" or "while_loop" when the jaxpr was given, else "loop".
  """

  name: str
  line: str | None
  trip_count: int | None
  kind: str = "loop"

  def __str__(self) -> str:
    trips = f"{self.trip_count} iterations" if self.trip_count is not None else "trip count unknown"
    where = notebook_cell(self.line) if self.line else self.name
    return f"{self.kind} at {where} ({trips})"


@dataclasses.dataclass(frozen=True, slots=True)
class CopyRecord:
  """One copy XLA inserted.

  Attributes:
    instruction: the HLO instruction (`copy.6`).
    opcode: "copy" or "copy-start" (an asynchronous copy).
    nbytes, shape, dtype: the copied buffer.
    loops: the enclosing loops, outermost first; empty when the copy runs once per call.
    count: how many times it runs per call (product of the trip counts); None if a trip count
      is unknown.
    value: the copied value in words ("buf, carry 1 of scan at f.py:7").
    input_path: the input leaf the buffer comes from, if it comes from one.
    carry: the loop-carry index (in the compiled loop's state) in the innermost loop, if any.
    donated: the buffer is a donated input or a loop carry (what strict mode guards).
    lines: the source lines that force the copy.
    reason: why XLA copies, in words.
    fix: a suggested fix, when one is known.
  """

  instruction: str
  opcode: str
  nbytes: int
  shape: tuple[int, ...]
  dtype: str
  loops: tuple[Loop, ...]
  count: int | None
  value: str
  input_path: str | None
  carry: int | None
  donated: bool
  lines: tuple[str, ...]
  reason: str
  fix: str | None

  @property
  def loop(self) -> Loop | None:
    """The innermost enclosing loop, or None when the copy runs once per call."""
    return self.loops[-1] if self.loops else None

  @property
  def per_call_bytes(self) -> int | None:
    """Bytes copied per call (`nbytes * count`); None if a trip count is unknown."""
    return None if self.count is None else self.nbytes * self.count

  @property
  def bytes_per_call(self) -> int | None:
    """The old name of `per_call_bytes`."""
    return self.per_call_bytes
