"""The dump of a compiled program rebuilt from the program alone: XLA's live ranges, recomputed.

A `jax.stages.Compiled` keeps its buffer assignment (`memory_analysis()
.serialized_buffer_assignment_proto`, filled for CPU programs) and its optimized, scheduled module
(`runtime_executable().hlo_modules()`), but not the live ranges XLA's dump writes
(`*live-range.txt`): the proto's heap-simulator traces are empty. `dump_of(assignment, module)`
recomputes them with XLA's own rules (`HloLiveRange` over the dataflow of `HloDataflowAnalysis`
in SSA form, which the buffer assignment's values are) and returns the same `reading.Dump` the dump
files give, so the rest of the profile is shared. The tests check every range and the schedule
against XLA's dump of the same compile.

The rules, as XLA applies them:

- The schedule is flattened: each computation's sequence in order, a `while` preceded by its
  condition and body, a `call` or `conditional` by the computations it calls.
- Every position of the module holds one value (SSA form: a loop's carry that changes is a phi
  value of the `while` and of its body's and condition's parameters, in the buffer assignment).
  Positions without a value of their own forward one: `get-tuple-element`, the elements of a
  `tuple`, `bitcast`, a `while` or a body parameter whose carry does not change (the loop's
  operand), a `call` (its computation's root), a called computation's parameter (the operand).
- A value is live from its definition (a computation's parameters from the computation's start)
  to the last of its positions (a computation's root: to the computation's end) and its uses (a
  `while` that reads it: to its body's parameter; a `call`: not a use, its computation's
  instructions are). Entry parameters no output reuses live to the end.
- Values of one buffer (XLA's alias analysis: the proto's `buffer_aliases`) do not overlap: in
  order of start, each ends where the next starts and the last ends at the latest end.

XLA widens the live ranges around asynchronous instructions (`copy-start`, `all-gather-start`:
XLA:GPU's; the CPU programs tested have none) by further rules: a module with them raises
`Unsupported` rather than being read approximately.
"""

from __future__ import annotations

from donate._profile import proto, reading
from donate._xla import hlo_dump as _hlo_dump

_FORWARD = ("bitcast", "domain", "add-dependency", "optimization-barrier", "while")
_CALLERS = ("while", "call", "conditional")
_ASYNC = ("-start", "-update", "-done")


class Unsupported(ValueError):
  """The module has asynchronous instructions (`copy-start`, `all-gather-start`, ...): XLA widens
  the live ranges around them by rules this reader does not recompute (CPU programs have none)."""


class _Dataflow:
  """The value at each position (instruction, shape index) and the schedule's times."""

  def __init__(self, module: proto.Module, assignment: proto.BufferAssignment):
    self.module = module
    self.by = module.instructions
    self.defined = {(v[1], v[2]): k for k, v in assignment.values.items()}
    self.callers: dict[int, list[proto.Instruction]] = {}
    self.users: dict[int, list[tuple[proto.Instruction, int]]] = {}
    for instr in self.by.values():
      for c in instr.calls:
        self.callers.setdefault(c, []).append(instr)
      for i, o in enumerate(instr.operands):
        self.users.setdefault(o, []).append((instr, i))
    self.sequence: list[int] = []
    self.time: dict[int, int] = {}
    self.span: dict[int, tuple[int, int]] = {}
    self._flatten(module.entry)
    self._memo: dict[tuple[int, tuple], int | None] = {}

  def _flatten(self, computation: int) -> None:
    order = self.module.schedule.get(computation)
    if order is None or computation in self.span:
      return
    start = len(self.sequence)
    for iid in order:
      instr = self.by[iid]
      if instr.opcode.endswith(_ASYNC):
        raise Unsupported(instr.opcode)
      if instr.opcode in ("call", "conditional"):
        for c in instr.calls:
          self._flatten(c)
      elif instr.opcode == "while":  # calls are (body, condition): the condition first
        for c in reversed(instr.calls):
          self._flatten(c)
      self.time[iid] = len(self.sequence)
      self.sequence.append(iid)
    self.span[computation] = (start, len(self.sequence))

  def is_root(self, instr: proto.Instruction) -> bool:
    return self.module.roots.get(instr.computation) == instr.id

  def value_at(self, instr: proto.Instruction, index: tuple) -> int | None:
    """The value at a position: its own, else the one it forwards (None: none known)."""
    key = (instr.id, index)
    found = self.defined.get(key)
    if found is not None or key in self._memo:
      return found if found is not None else self._memo[key]
    self._memo[key] = None  # a cycle finds nothing
    source = self._source(instr, index)
    found = self.value_at(*source) if source is not None else None
    self._memo[key] = found
    return found

  def _source(self, instr: proto.Instruction, index: tuple):
    """The position whose value `instr` forwards at `index`, or None."""
    op = instr.opcode
    if op == "get-tuple-element":
      return self.by[instr.operands[0]], (instr.tuple_index,) + index
    if op == "tuple" and index:
      return self.by[instr.operands[index[0]]], index[1:]
    if op in _FORWARD and instr.operands:
      return self.by[instr.operands[0]], index
    if op == "call" and instr.calls:
      return self.by[self.module.roots[instr.calls[0]]], index
    if op == "parameter" and instr.computation != self.module.entry:
      callers = self.callers.get(instr.computation, [])
      if len(callers) == 1 and callers[0].opcode in _CALLERS:
        caller = callers[0]
        k = {"while": 0, "call": instr.parameter_number}.get(
          caller.opcode, caller.calls.index(instr.computation) + 1
        )
        return self.by[caller.operands[k]], index
    return None


def _indices(shape, prefix=()):
  yield prefix
  for k, element in enumerate(shape or ()):
    yield from _indices(element, prefix + (k,))


def _may_use(user: proto.Instruction, index: tuple) -> bool:
  """XLA's `MayUseOperandValue`: tuples pass their operands through, a `get-tuple-element` or
  `copy` reads only the top level of its operand."""
  if user.opcode in ("get-tuple-element", "copy"):
    return index == ()
  return user.opcode not in ("tuple", "domain")


def _ranges(flow: _Dataflow, values) -> dict[int, list[int]]:
  """[first, last] schedule steps (both inclusive, as XLA prints them) of every value defined by
  a scheduled instruction."""
  positions: dict[int, list] = {}
  for iid in flow.sequence:
    instr = flow.by[iid]
    for index in _indices(instr.shape):
      value = flow.value_at(instr, index)
      if value is not None:
        positions.setdefault(value, []).append((instr, index))
  ranges, end_of_program = {}, len(flow.sequence)
  entry = flow.module.entry
  for vid, (_, iid, index, _) in values.items():
    at = flow.by.get(iid)
    if at is None or iid not in flow.time:
      continue
    start, stop = flow.span[at.computation]
    first = start if at.opcode == "parameter" else flow.time[iid]
    last = stop if flow.is_root(at) else flow.time[iid]
    held = [p for p in positions.get(vid, ()) if (p[0].id, p[1]) != (iid, index)]
    for p, _ in held:
      if flow.is_root(p):
        last = max(last, flow.span.get(p.computation, (0, last))[1])
      else:
        last = max(last, flow.time.get(p.id, last))
    if (
      at.opcode == "parameter"
      and at.computation == entry
      and (at.parameter_number, index) not in flow.module.aliased
    ):
      last = end_of_program  # a read-only argument: the whole program
    else:
      last = max(last, _last_use(flow, positions.get(vid, ())))
    ranges[vid] = [first, last]
  return ranges


def _last_use(flow: _Dataflow, positions) -> int:
  """The latest step of a use of a value held at `positions` (-1: none)."""
  roots = {p.id for p, _ in positions if flow.is_root(p)}
  last = -1
  for p, index in positions:
    for user, _ in flow.users.get(p.id, ()):
      if not (_may_use(user, index) or user.id in roots):
        continue
      if user.opcode == "call" and user.calls and user.calls[0] in flow.span:
        continue  # its computation's instructions are the uses
      if user.opcode == "while" and user.calls and user.calls[0] in flow.span:
        body = flow.module.schedule[user.calls[0]]
        user = next(flow.by[i] for i in body if flow.by[i].opcode == "parameter")
      last = max(last, flow.time.get(user.id, -1))
  return last


def _normalize(ranges: dict[int, list[int]], assignment: proto.BufferAssignment) -> None:
  """Values of one buffer, in order of (start, end, id): each ends where the next starts, the
  next ends at the later of the two ends (XLA's `NormalizeAliasedBuffers`)."""
  parent = {v: v for v in ranges}

  def root(v):
    while parent[v] != v:
      parent[v] = parent[parent[v]]
      v = parent[v]
    return v

  defined = {(v[1], v[2]): k for k, v in assignment.values.items()}
  for source, iid, index in assignment.aliases:
    other = defined.get((iid, index))
    if source in parent and other in parent:
      parent[root(source)] = root(other)
  groups: dict[int, list[int]] = {}
  for v in ranges:
    groups.setdefault(root(v), []).append(v)
  for members in groups.values():
    members.sort(key=lambda v: (ranges[v][0], ranges[v][1], v))
    for a, b in zip(members, members[1:]):
      ra, rb = ranges[a], ranges[b]
      rb[1] = max(ra[1], rb[1])
      ra[1] = min(ra[1], rb[0])


def _kind(a: proto.Allocation) -> str:
  """The allocation's header as XLA's dump words it (what `reading` looks for)."""
  parts = [f"color {a.color}"] if a.color else []
  parts += [f"parameter {a.parameter}"] if a.parameter is not None else []
  parts += ["thread-local"] * a.thread_local + ["constant"] * a.constant
  parts += ["maybe-live-out"] * a.live_out + ["preallocated-temp"] * a.temp
  return ", ".join(parts)


def dump_of(
  assignment: proto.BufferAssignment,
  module: proto.Module,
  platform: str = "?",
  hlo_text: str | None = None,
) -> reading.Dump:
  """The `reading.Dump` XLA would have written for this compile (see the module docstring).

  Raises:
    Unsupported: the module has asynchronous instructions.
  """
  flow = _Dataflow(module, assignment)
  ranges = _ranges(flow, assignment.values)
  _normalize(ranges, assignment)

  def name(vid: int, braces: bool) -> str:
    _, iid, index, _ = assignment.values[vid]
    instr = flow.by.get(iid)
    text = instr.name if instr is not None else f"value.{vid}"
    tuple_shape = instr is not None and instr.shape is not None
    return text + ("{" + ",".join(map(str, index)) + "}" if braces or tuple_shape else "")

  allocations = tuple(
    _hlo_dump.XlaAllocation(
      a.index,
      a.nbytes,
      a.color,
      _kind(a),
      tuple((name(v, False), size, offset) for v, offset, size in sorted(a.assigned)),
    )
    for a in assignment.allocations
  )
  return reading.Dump(
    allocations,
    {name(v, True): (r[0], r[1]) for v, r in ranges.items()},
    tuple(flow.by[i].name for i in flow.sequence),
    platform,
    hlo_text,
  )
