"""Reading the files XLA writes beside a compiled module when asked to (`xla_dump_to`).

`parse_buffer_assignment` reads `*after_optimizations-buffer-assignment.txt`: one `XlaAllocation`
per `allocation N: size S, color C, ...:` block, with the values XLA put in it at their offsets (the
collective-memory sizing of `donate._symm_size` reads the allocations of the collective colour).
`parse_live_ranges` reads `*after_optimizations-live-range.txt`: when each value is live in the
module's schedule (`benchmarks/xla_dump.py` turns both into packing problems). The compiled
module's own text is read by `donate._xla.hlo`.

>>> (a,) = parse_buffer_assignment('''BufferAssignment:
... allocation 13: size 53248, color 7, page 0, preallocated-temp:
...  value: <19 psum.7.2 @7> (size=4096,offset=0): f32[1024]{0:S(7)}
...  value: <20 while.3{1} (phi) @7> (size=8,offset=4096): s32[2]{0:S(7)}''')
>>> a.index, a.nbytes, a.color, a.kind
(13, 53248, 7, 'color 7, page 0, preallocated-temp')
>>> a.values
(('psum.7.2', 4096, 0), ('while.3{1}', 8, 4096))
>>> parse_live_ranges('''BufferLiveRange:
...     psum.7.2{}:7-8
...     while.3{1}:0-11
...   Live ranges at 9 (peak):''')
{'psum.7.2{}': (7, 8), 'while.3{1}': (0, 11)}
"""

from __future__ import annotations

import dataclasses
import re

_ALLOCATION = re.compile(r"allocation (\d+): size (\d+)(.*):\s*$")
_VALUE = re.compile(r" value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)")
_RANGE = re.compile(r"\s+(\S+):(\d+)-(\d+)\s*$")
_SEQUENCE = re.compile(r"\s+(\d+):(\S+)\s*$")
_PARAMETER = re.compile(r"(?:^|, )parameter (\d+)")


@dataclasses.dataclass(frozen=True, slots=True)
class XlaAllocation:
  """One allocation of XLA's buffer assignment: index, size in bytes (`nbytes`), colour, and its
  values.

  `kind` is the rest of the allocation's header (`color 7, page 0, preallocated-temp`,
  `parameter 0, shape |f32[4]| at ShapeIndex {}`, ...); `values` are (value name, size, offset).
  """

  index: int
  nbytes: int
  color: int
  kind: str
  values: tuple[tuple[str, int, int], ...]

  @property
  def size(self) -> int:
    """The old name of `nbytes` (XLA's word)."""
    return self.nbytes

  @property
  def parameter_number(self) -> int | None:
    """The entry parameter this allocation holds (`parameter N` in its header), else None."""
    found = _PARAMETER.search(self.kind)
    return int(found.group(1)) if found else None


def dump_options(directory: str) -> dict:
  """Per-compile options that make XLA write the compiled module, its buffer assignment and live
  ranges as text into `directory`.

  >>> sorted(dump_options("/tmp/d"))
  ['xla_dump_hlo_as_text', 'xla_dump_to']
  """
  return {"xla_dump_to": str(directory), "xla_dump_hlo_as_text": True}


def parse_buffer_assignment(text: str) -> tuple[XlaAllocation, ...]:
  """Parses a `*buffer-assignment.txt` dump into allocations (colour 0 when none is printed).

  Raises:
    ValueError: on a value line it cannot read (sizes summed from the rest would be wrong).
  """
  out: list[XlaAllocation] = []
  head: tuple | None = None
  values: list[tuple[str, int, int]] = []

  def flush():
    if head is not None:
      out.append(XlaAllocation(*head, tuple(values)))

  for line in text.splitlines():
    header = _ALLOCATION.match(line)
    if header:
      flush()
      rest = header.group(3).strip(", ")
      color = re.search(r"(?:^|, )color (\d+)", rest)
      head = (int(header.group(1)), int(header.group(2)), int(color.group(1)) if color else 0, rest)
      values = []
    elif line.startswith(" value: "):  # not "  value:" (reused by buffers of another colour)
      value = _VALUE.match(line)
      if value is None:
        raise ValueError(f"cannot read the value line {line!r}")
      if head is not None:
        values.append((value.group(1), int(value.group(2)), int(value.group(3))))
    elif line.strip() and not line.startswith(" ") and head is not None:
      flush()  # the allocations end where the next section starts
      head = None
  flush()
  return tuple(out)


def parse_live_ranges(text: str) -> dict[str, tuple[int, int]]:
  """Value name (with its tuple index, `x{}`) -> (first, last) schedule position, both inclusive,
  from the `BufferLiveRange:` section of a `*live-range.txt` dump."""
  return {
    m.group(1): (int(m.group(2)), int(m.group(3)))
    for m in section_matches(text, "BufferLiveRange:", _RANGE)
  }


def parse_sequence(text: str) -> tuple[str, ...]:
  """The `InstructionSequence:` of a `*live-range.txt` dump: the instruction at each step.

  >>> parse_sequence('''HloLiveRange (max 2):
  ...   InstructionSequence:
  ...     0:x.1
  ...     1:exp
  ...   BufferLiveRange:''')
  ('x.1', 'exp')
  """
  return tuple(m.group(2) for m in section_matches(text, "InstructionSequence:", _SEQUENCE))


def section_matches(text: str, header: str, pattern: re.Pattern):
  """The matches of `pattern` on the lines after the line `header` of a dump file, up to the
  first line it does not match."""
  inside = False
  for line in text.splitlines():
    if line.strip() == header:
      inside = True
    elif inside:
      found = pattern.match(line)
      if not found:
        return
      yield found
