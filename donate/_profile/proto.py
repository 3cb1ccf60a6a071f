"""XLA's buffer assignment and compiled module from their protobuf bytes, without protobuf.

`memory_analysis().serialized_buffer_assignment_proto` is a `BufferAssignmentProto` and
`runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()` an `HloModuleProto`
(xla/service/hlo.proto; the shapes are xla/xla_data.proto's `ShapeProto`). jaxlib ships no
Python classes for them, so they are read here from the wire format: a message is a sequence of
(field number, value) pairs, a value a varint or a length-delimited byte string (a string, a
nested message, or packed varints). Only the fields the memory profile needs are read; the field
numbers are written next to their names in hlo.proto's spelling.

>>> message(bytes([0x08, 0x96, 0x01, 0x12, 0x02, 0x68, 0x69]))  # 1: 150, 2: "hi"
{1: [150], 2: [b'hi']}
>>> integers({3: [bytes([0x01, 0x96, 0x01])]}, 3)  # packed repeated int64
[1, 150]
"""

from __future__ import annotations

import dataclasses

_TUPLE = 13  # xla_data.proto PrimitiveType.TUPLE


def _varint(data: bytes, i: int) -> tuple[int, int]:
  out = shift = 0
  while True:
    byte = data[i]
    i += 1
    out |= (byte & 0x7F) << shift
    shift += 7
    if byte < 0x80:
      return out, i


def message(data: bytes) -> dict[int, list]:
  """Field number -> its values in order (ints for varints, bytes for length-delimited ones).

  Raises:
    ValueError: a wire type this reader does not know (a group), i.e. not such a message.
  """
  out: dict[int, list] = {}
  value: int | bytes | None
  i, view = 0, memoryview(data)
  while i < len(data):
    key, i = _varint(data, i)
    kind = key & 7
    if kind == 0:
      value, i = _varint(data, i)
    elif kind == 2:
      n, i = _varint(data, i)
      value, i = bytes(view[i : i + n]), i + n
    elif kind in (1, 5):  # fixed64, fixed32: no field read here has them
      value, i = None, i + (8 if kind == 1 else 4)
    else:
      raise ValueError(f"wire type {kind} at byte {i}")
    out.setdefault(key >> 3, []).append(value)
  return out


def integers(fields: dict, number: int) -> list[int]:
  """A repeated integer field, packed or not."""
  out = []
  for value in fields.get(number, ()):
    if isinstance(value, int):
      out.append(value)
      continue
    i = 0
    while i < len(value):
      v, i = _varint(value, i)
      out.append(v)
  return out


def _int(fields: dict, number: int) -> int:
  return fields.get(number, [0])[-1]


def _sub(fields: dict, number: int) -> dict:
  return message(fields.get(number, [b""])[-1])


def _text(fields: dict, number: int) -> str:
  return fields.get(number, [b""])[-1].decode()


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
  """A `BufferAllocationProto`: its values are (logical buffer id, offset, size)."""

  index: int
  nbytes: int  # the proto's `size`
  color: int
  parameter: int | None  # the entry parameter it holds, if any
  live_out: bool
  thread_local: bool
  constant: bool
  assigned: tuple[tuple[int, int, int], ...]

  @property
  def size(self) -> int:
    """The old name of `nbytes` (the proto's word)."""
    return self.nbytes

  @property
  def temp(self) -> bool:
    """XLA's `IsPreallocatedTempBuffer`: none of parameter, live out, thread-local, constant."""
    return not (self.parameter is not None or self.live_out or self.thread_local or self.constant)


@dataclasses.dataclass(frozen=True, slots=True)
class BufferAssignment:
  """A `BufferAssignmentProto`.

  Attributes:
    values: logical buffer id -> (size, defining instruction id, shape index, colour).
    aliases: (logical buffer id, instruction id, shape index) of the values in one buffer with
      it (XLA's alias analysis: a loop's carry, an in-place update).
    allocations: the allocations, with the values XLA put in each.
  """

  values: dict[int, tuple[int, int, tuple[int, ...], int]]
  aliases: tuple[tuple[int, int, tuple[int, ...]], ...]
  allocations: tuple[Allocation, ...]


def buffer_assignment(data: bytes) -> BufferAssignment:
  """Decodes a `BufferAssignmentProto` (an empty one has no allocations)."""
  top = message(data)
  values = {}
  for raw in top.get(1, ()):  # logical_buffers
    b = message(raw)  # LogicalBufferProto: id 1, size 2, defined_at 3, color 4
    at = _sub(b, 3)  # Location: instruction_id 4, shape_index 3
    values[_int(b, 1)] = (_int(b, 2), _int(at, 4), tuple(integers(at, 3)), _int(b, 4))
  aliases = []
  for raw in top.get(2, ()):  # buffer_aliases: source_buffer_id 1, location 2
    a = message(raw)
    at = _sub(a, 2)
    aliases.append((_int(a, 1), _int(at, 4), tuple(integers(at, 3))))
  allocations = []
  for raw in top.get(3, ()):  # buffer_allocations
    a = message(raw)  # index 1, size 2, is_thread_local 3, is_entry_computation_parameter 5,
    # parameter_number 6, maybe_live_out 7, color 8, assigned 9, is_constant 12
    assigned = tuple(
      (_int(x, 1), _int(x, 2), _int(x, 3))  # logical_buffer_id, offset, size
      for x in map(message, a.get(9, ()))
    )
    allocations.append(
      Allocation(
        _int(a, 1),
        _int(a, 2),
        _int(a, 8),
        _int(a, 6) if _int(a, 5) else None,
        bool(_int(a, 7)),
        bool(_int(a, 3)),
        bool(_int(a, 12)),
        assigned,
      )
    )
  return BufferAssignment(values, tuple(aliases), tuple(allocations))


@dataclasses.dataclass(frozen=True, slots=True)
class Instruction:
  """An `HloInstructionProto`: `shape` is None for an array, else its tuple's element shapes."""

  id: int
  name: str
  opcode: str
  shape: tuple | None
  parameter_number: int
  tuple_index: int
  operands: tuple[int, ...]
  calls: tuple[int, ...]
  computation: int


@dataclasses.dataclass(frozen=True, slots=True)
class Module:
  """An `HloModuleProto`: instructions by id, each computation's root and schedule."""

  name: str
  entry: int
  instructions: dict[int, Instruction]
  roots: dict[int, int]  # computation id -> root instruction id
  schedule: dict[int, tuple[int, ...]]  # computation id -> its instructions in order
  aliased: frozenset[tuple[int, tuple[int, ...]]]  # (parameter, index) an output reuses


def _shape(data: bytes):
  shape = message(data)  # ShapeProto: element_type 2, tuple_shapes 4
  return tuple(map(_shape, shape.get(4, ()))) if _int(shape, 2) == _TUPLE else None


def module(data: bytes) -> Module:
  """Decodes an `HloModuleProto`."""
  top = message(data)  # name 1, computations 3, entry_computation_id 6, schedule 7,
  # input_output_alias 8
  instructions, roots = {}, {}
  for raw in top.get(3, ()):
    c = message(raw)  # HloComputationProto: instructions 2, id 5, root_id 6
    roots[_int(c, 5)] = _int(c, 6)
    for i in map(message, c.get(2, ())):  # HloInstructionProto: name 1, opcode 2, shape 3,
      # parameter_number 9, tuple_index 13, id 35, operand_ids 36, called_computation_ids 38
      instructions[_int(i, 35)] = Instruction(
        _int(i, 35),
        _text(i, 1),
        _text(i, 2),
        _shape(i.get(3, [b""])[-1]),
        _int(i, 9),
        _int(i, 13),
        tuple(integers(i, 36)),
        tuple(integers(i, 38)),
        _int(c, 5),
      )
  schedule = {}
  for entry in map(message, _sub(top, 7).get(1, ())):  # sequences: key 1, value 2
    schedule[_int(entry, 1)] = tuple(integers(_sub(entry, 2), 1))  # instruction_ids 1
  aliased = frozenset(
    (_int(e, 2), tuple(integers(e, 3)))  # parameter_number 2,
    for e in map(message, _sub(top, 8).get(1, ()))
  )  # parameter_shape_index 3
  return Module(_text(top, 1), _int(top, 6), instructions, roots, schedule, aliased)
