"""XLA's buffer assignment of one compiled program, read into buffers with owners and lifetimes.

`read_dump(folder)` finds the dumped module's `*buffer-assignment.txt` and `*live-range.txt`
(`xla_dump_to` as a per-compile option) and returns a `Dump`; `assign(dump, module, in_paths,
out_paths)` turns it into an `Assignment`: the program's totals (the same sums `memory_analysis()`
makes over XLA's allocations), one `Owner` per argument and output allocation, and the values of
the temp allocations merged into `Buffer`s (values that share bytes while both are live are one
buffer reused in place), each live on half-open schedule steps `[start, end)`.

>>> from donate._xla import hlo_dump as _hlo_dump
>>> allocations = _hlo_dump.parse_buffer_assignment('''BufferAssignment:
... allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}, maybe-live-out:
...  value: <1 x.1 @0> (size=64,offset=0): f32[16]{0}
...  value: <3 add @0> (size=64,offset=0): f32[16]{0}
... allocation 1: size 128, preallocated-temp:
...  value: <2 exp @0> (size=64,offset=0): f32[16]{0}
...  value: <4 mul @0> (size=64,offset=64): f32[16]{0}''')
>>> ranges = {"x.1{}": (0, 1), "exp{}": (1, 3), "mul{}": (2, 3), "add{}": (3, 4)}
>>> dump = Dump(allocations, ranges, ("x.1", "exp", "mul", "add"))
>>> totals(dump)
{'argument': 64, 'output': 64, 'alias': 64, 'temp': 128, 'constant': 0}
>>> [(b.value_at(2), b.nbytes, b.start, b.end) for b in temp_buffers(dump)]
[('exp', 64, 1, 4), ('mul', 64, 2, 4)]
"""

from __future__ import annotations

import dataclasses
import glob
import os

from donate._xla import hlo as _hlo
from donate._xla import hlo_dump as _hlo_dump


@dataclasses.dataclass(frozen=True, slots=True)
class Dump:
  """The dump files of one compiled module: allocations, live ranges, the schedule."""

  allocations: tuple[_hlo_dump.XlaAllocation, ...]
  ranges: dict[str, tuple[int, int]]  # value name with index ("x{}") -> first, last step
  sequence: tuple[str, ...]  # the instruction at each schedule step
  platform: str = "?"  # "cpu" or "gpu", from the dump's file name
  hlo_text: str | None = None  # the module the assignment is of (`*after_optimizations.txt`)


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
  """Values of one temp allocation that share bytes while live: one buffer reused in place.

  Attributes:
    allocation: the allocation's index; `color` its memory colour.
    low, high: the bytes `[low, high)` of the allocation the buffer covers.
    start, end: the schedule steps `[start, end)` it is live.
    values: its values, as (name, size, first step, end step), in the order of their start.
  """

  allocation: int
  color: int
  low: int
  high: int
  start: int
  end: int
  values: tuple[tuple[str, int, int, int], ...]

  @property
  def nbytes(self) -> int:
    return self.high - self.low

  def value_at(self, step: int) -> str:
    """The largest of the buffer's values live at `step` (its first value if none is)."""
    live = [v for v in self.values if v[2] <= step < v[3]]
    return max(live, key=lambda v: v[1])[0] if live else self.values[0][0]


parse_sequence = _hlo_dump.parse_sequence  # the dump's schedule, read by `hlo_dump`


def dump_files(folder: str, module_name: str | None = None) -> tuple[str, str]:
  """The (buffer-assignment, live-range) files of the module dumped in `folder`.

  Raises:
    FileNotFoundError: the folder has no buffer assignment after optimizations.
  """
  found = sorted(glob.glob(os.path.join(folder, "*after_optimizations-buffer-assignment.txt")))
  if module_name is not None:
    found = [f for f in found if f".{module_name}." in os.path.basename(f)] or found
  if not found:
    raise FileNotFoundError(f"no *after_optimizations-buffer-assignment.txt in {folder}")
  assignment = found[-1]
  return assignment, assignment[: -len("buffer-assignment.txt")] + "live-range.txt"


def read_dump(folder: str, module_name: str | None = None) -> Dump:
  """Reads the dump of one compiled module (the last one in `folder` named `module_name`)."""
  return read_files(*dump_files(folder, module_name))


def read_files(assignment: str, ranges_file: str) -> Dump:
  """Reads one module's `*buffer-assignment.txt` and `*live-range.txt` (and its module text)."""
  with open(assignment) as fh:
    allocations = _hlo_dump.parse_buffer_assignment(fh.read())
  with open(ranges_file) as fh:
    text = fh.read()
  name = os.path.basename(assignment)
  platform = next((p for p in ("gpu", "cpu", "tpu") if f"{p}_after_optimizations" in name), "?")
  module = assignment[: -len("-buffer-assignment.txt")] + ".txt"
  hlo_text = None
  if os.path.exists(module):  # on GPU it has kernels' inner fusions `as_text()` leaves out
    with open(module) as fh:
      hlo_text = fh.read()
  return Dump(
    allocations, _hlo_dump.parse_live_ranges(text), parse_sequence(text), platform, hlo_text
  )


def parameter_number(allocation: _hlo_dump.XlaAllocation) -> int | None:
  return allocation.parameter_number


def is_output(allocation: _hlo_dump.XlaAllocation) -> bool:
  return "maybe-live-out" in allocation.kind


def is_temp(allocation: _hlo_dump.XlaAllocation) -> bool:
  return "preallocated-temp" in allocation.kind


def is_constant(allocation: _hlo_dump.XlaAllocation) -> bool:
  return "constant" in allocation.kind.split(", ")


def on_device(allocation: _hlo_dump.XlaAllocation) -> bool:
  return allocation.color != _hlo.HOST_MEMORY_SPACE


def totals(dump: Dump) -> dict[str, int]:
  """Argument, output, aliased and temp bytes: sums over XLA's device allocations, as
  `memory_analysis()` makes them (an allocation both a parameter and live out is aliased); and the
  constants' bytes, which none of those counts."""
  out = {"argument": 0, "output": 0, "alias": 0, "temp": 0, "constant": 0}
  for a in filter(on_device, dump.allocations):
    param, live_out = parameter_number(a) is not None, is_output(a)
    out["argument"] += a.nbytes if param else 0
    out["output"] += a.nbytes if live_out else 0
    out["alias"] += a.nbytes if param and live_out else 0
    out["temp"] += a.nbytes if is_temp(a) else 0
    out["constant"] += a.nbytes if is_constant(a) else 0
  return out


def host_bytes(dump: Dump) -> int:
  """What the program keeps in host memory (offloaded values, arguments and outputs with a host
  memory kind): its host allocations' bytes, as `memory_analysis()`'s host fields sum them
  (arguments + outputs - aliased + temporaries)."""
  return sum(
    a.nbytes
    for a in dump.allocations
    if not on_device(a) and (parameter_number(a) is not None or is_output(a) or is_temp(a))
  )


def live_range(dump: Dump, name: str) -> tuple[int, int] | None:
  """[start, end) steps of value `name`, clipped to the schedule; None if XLA gives no range."""
  found = dump.ranges.get(name if "{" in name else name + "{}")
  if found is None:
    return None
  last = len(dump.sequence)
  return max(0, found[0]), max(found[0] + 1, min(found[1] + 1, last))


def temp_buffers(dump: Dump) -> list[Buffer]:
  """The values of every device temp allocation, merged into buffers (see `Buffer`)."""
  buffers = []
  for a in dump.allocations:
    if not (is_temp(a) and on_device(a)):
      continue
    rows = []
    for name, size, offset in a.values:
      live = live_range(dump, name)
      if live is not None and size:
        rows.append([offset, offset + size, live[0], live[1], [(name, size, *live)]])
    for low, high, start, end, members in merge_overlapping(rows):
      buffers.append(
        Buffer(
          a.index,
          a.color,
          low,
          high,
          start,
          end,
          tuple(sorted(members, key=lambda v: (v[2], v[0]))),
        )
      )
  return buffers


def merge_overlapping(rows: list[list]) -> list[list]:
  """Merges rows `[low, high, start, end, members]` (half-open bytes and steps) that overlap in
  bytes and in time, until no two overlap (a merged row may meet a third); members concatenate.

  >>> merge_overlapping([[0, 8, 0, 2, ["a"]], [4, 12, 1, 3, ["b"]], [0, 8, 2, 4, ["c"]]])
  [[0, 12, 0, 4, ['a', 'b', 'c']]]
  """
  while True:
    parent = list(range(len(rows)))

    def root(i, parent=parent):
      while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
      return i

    active: list[int] = []
    for i in sorted(range(len(rows)), key=lambda i: rows[i][0]):
      low, _, start, end, _ = rows[i]
      active = [j for j in active if rows[j][1] > low]
      for j in active:
        if rows[j][2] < end and start < rows[j][3]:
          parent[root(i)] = root(j)
      active.append(i)
    groups: dict[int, list] = {}
    for i, (low, high, start, end, members) in enumerate(rows):
      g = groups.setdefault(root(i), [low, high, start, end, []])
      g[0], g[1], g[2], g[3] = min(g[0], low), max(g[1], high), min(g[2], start), max(g[3], end)
      g[4].extend(members)
    if len(groups) == len(rows):
      return rows
    rows = list(groups.values())
