"""The compiled program's dataflow, read from its HLO: which pass made a value, who reads it, and
which input an output is computed from.

JAX writes its name stack into every instruction's `op_name`: values of the forward pass of a
differentiated function carry `jvp(...)`, those of its backward pass `transpose(jvp(...))`
(`phase`). A value is followed through the instructions that only move it (tuples, bitcasts,
copies, a loop's carry that its body passes on unchanged) to where it was made (`Flow.origin`) and
to the instructions that read it (`Flow.reader_phases`). `Flow.computed_from` is the dataflow
distance from each entry parameter to an output: how many computing instructions lie between
them (0: the output is the parameter itself), within `DEPTH`, outside any backward pass (a
gradient is computed from its input, it is not that input updated).

>>> from donate._xla import hlo as _hlo
>>> m = _hlo.parse_module('''HloModule m
...
... ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4], f32[4]) {
...   %a = f32[4]{0} parameter(0), metadata={op_name="a"}
...   %b = f32[4]{0} parameter(1), metadata={op_name="b"}
...   %t = f32[4]{0} tanh(%a), metadata={op_name="jit(f)/jvp()/tanh"}
...   %g = f32[4]{0} multiply(%t, %b), metadata={op_name="jit(f)/transpose(jvp())/mul"}
...   %u = f32[4]{0} subtract(%a, %g), metadata={op_name="jit(f)/sub"}
...   %v = f32[4]{0} add(%b, %u), metadata={op_name="jit(f)/add"}
...   ROOT %r = (f32[4]{0}, f32[4]{0}) tuple(%u, %v)
... }''')
>>> flow = Flow(m)
>>> flow.phase_of(m.find("t")), sorted(flow.reader_phases(m.find("t"), ()))
('forward', ['backward'])
>>> flow.computed_from(0), flow.computed_from(1)  # b reaches u only through the backward pass
({0: 1}, {1: 1, 0: 2})
"""

from __future__ import annotations

from collections import deque

from donate._profile import naming
from donate._xla import hlo as _hlo

DEPTH = 6  # computing instructions followed from an output back to its inputs
_MOVES = (
  "bitcast",
  "copy",
  "reshape",
  "get-tuple-element",
  "tuple",
  "optimization-barrier",
  "copy-start",
  "copy-done",
  "domain",
)

_JOINS = frozenset(_MOVES) | {"parameter", "concatenate"}


def phase(scope: str | None) -> str:
  """ "backward" (`transpose(...)` in the name stack), "forward" (`jvp(...)`) or "other"."""
  if not scope:
    return "other"
  if "transpose(" in scope:
    return "backward"
  return "forward" if "jvp(" in scope else "other"


def _uses(module: _hlo.Module, comp: _hlo.Computation) -> dict[str, list]:
  """Instruction name -> (user, operand index, tuple element) of each read in `comp`; the element
  is the `k` of an operand XLA 0.12's dump spells `while.1#2` in place of a get-tuple-element."""
  out: dict[str, list] = {}
  for operand, readers in module.users(comp).items():
    base, element = _hlo.tuple_element(operand)
    out.setdefault(base, []).extend((user, k, element) for user, k in readers)
  return out


class Flow:
  """Users, origins and readers of the values of one parsed module (built once per profile)."""

  def __init__(self, module: _hlo.Module):
    self.module = module
    self._uses = {name: _uses(module, comp) for name, comp in module.computations.items()}
    self._ops: dict[str, str | None] = {}  # instruction -> its op_name (parsed once)
    self.roots = naming.output_instructions(module)

  def uses(self, instr: _hlo.Instruction) -> list:
    """(user, operand index, tuple element) of each read of `instr`: the element is the `k` of
    an operand spelled `name#k` (a part of a tuple read in place), else None."""
    return self._uses.get(instr.computation, {}).get(instr.name, [])

  def users(self, instr: _hlo.Instruction):
    """(user, operand index) of each read of `instr`'s whole value."""
    return [(user, k) for user, k, element in self.uses(instr) if element is None]

  def operand(self, instr: _hlo.Instruction, j: int, index: tuple = ()):
    """(instruction, index) of `instr`'s operand `j` at `index` (`name#k`: element `k` of it)."""
    base, element = _hlo.tuple_element(instr.operands[j])
    found = self.module.find(base, instr.computation)
    return found, (index if element is None else (element,) + index)

  def op(self, instr: _hlo.Instruction) -> str | None:
    """`instr`'s own `op_name` (its metadata read once per profile)."""
    if instr.name not in self._ops:
      self._ops[instr.name] = instr.metadata_op
    return self._ops[instr.name]

  def scope_of(self, instr: _hlo.Instruction | None) -> str | None:
    """`instr`'s own `op_name`, or the first of its fused kernel's."""
    if instr is None or self.op(instr):
      return None if instr is None else self.op(instr)
    for name in instr.calls if instr.opcode == "fusion" else ():
      comp = self.module.computations.get(name)
      for inner in comp.instructions if comp is not None else ():
        if self.op(inner):
          return self.op(inner)
    return None

  def phase_of(self, instr: _hlo.Instruction | None) -> str:
    return phase(self.scope_of(instr))

  def _body(self, loop: _hlo.Instruction) -> _hlo.Computation | None:
    name = next((c for a, c in loop.called if a == "body"), None)
    return self.module.computations.get(name) if name else None

  def origin(self, instr: _hlo.Instruction | None, index: tuple = ()):
    """(instruction, index) where the value at `instr`'s `index` is made: through tuples,
    bitcasts, copies, and loops whose body passes that element on unchanged."""
    m = self.module
    for _ in range(4 * DEPTH):
      if instr is None:
        return None, index
      op = instr.opcode
      nxt = None
      if op == "get-tuple-element" and instr.index is not None:
        nxt, index = self.operand(instr, 0, (instr.index,) + index)
      elif op == "tuple" and index and index[0] < len(instr.operands):
        nxt, index = self.operand(instr, index[0], index[1:])
      elif op in ("bitcast", "copy", "reshape", "copy-done", "copy-start") and instr.operands:
        nxt, index = self.operand(instr, 0, index)
      elif op == "while" and index and self._passes_on(instr, index[0]):
        nxt, index = self.operand(instr, 0, index)
      elif op == "parameter" and not m.computations[instr.computation].is_entry:
        callers = m.callers.get(instr.computation, [])
        if not callers or callers[0][0].opcode != "while":
          return instr, index
        caller = callers[0][0]
        if index and not self._passes_on(caller, index[0]):
          return caller, index  # a carry the loop updates: the loop's value
        nxt, index = self.operand(caller, 0, index)
      if nxt is None:
        return instr, index
      instr = nxt
    return instr, index

  def loop_element(self, instr: _hlo.Instruction | None, index: tuple = ()):
    """(loop, index) when `instr` is what a loop's body returns at that place of its carry
    (the loop's value there), else (`instr`, `index`)."""
    if instr is None or index:
      return instr, index
    for user, k in self.users(instr):
      if user.opcode == "tuple" and user.is_root:
        for caller, _ in self.module.callers.get(user.computation, []):
          if caller.opcode == "while":
            return caller, (k,)
    return instr, index

  def _passes_on(self, loop: _hlo.Instruction, k: int) -> bool:
    """Whether `loop`'s body returns element `k` of its carry unchanged."""
    body = self._body(loop)
    root = body.root if body is not None else None
    if body is None or root is None or root.opcode != "tuple" or k >= len(root.operands):
      return False
    element, index = self.operand(root, k)
    while element is not None and not index and element.opcode in ("bitcast", "copy"):
      element, index = self.operand(element, 0)
    if element is not None and not index and element.opcode == "get-tuple-element":
      element, index = self.operand(element, 0, (element.index,))
    return element is not None and element.opcode == "parameter" and index == (k,)

  def reader_phases(self, instr: _hlo.Instruction, index: tuple = (), readers=None) -> set[str]:
    """The phases of the computing instructions that read the value (through the instructions
    that move it), added to the list `readers` if given; "output" when it is returned."""
    readers = [] if readers is None else readers
    found: set[str] = set()
    todo, seen = [(instr, index, 0)], set()
    while todo:
      at, index, depth = todo.pop()
      if (at.name, index) in seen or depth > 4 * DEPTH:
        continue
      seen.add((at.name, index))
      comp = self.module.computations[at.computation]
      if comp.is_entry and at.name in self.roots:
        found.add("output")
      for user, k, element in self.uses(at):
        if element is not None and index and index[0] != element:
          continue  # another part of the tuple, read in place (`while.1#2`)
        rest = index[1:] if element is not None and index else index
        if user.opcode == "get-tuple-element":
          if not rest or rest[0] == user.index:
            todo.append((user, rest[1:], depth + 1))
        elif (
          user.opcode == "tuple"
          and user.is_root
          and not self.module.computations[user.computation].is_entry
        ):  # a loop's next carry, a call's result: its readers
          todo += [
            (caller, (k,) + rest, depth + 1)
            for caller, _ in self.module.callers.get(user.computation, [])
            if caller.opcode in ("while", "call")
          ]
        elif user.opcode == "tuple":
          todo.append((user, (k,) + rest, depth + 1))
        elif user.opcode in _MOVES:
          todo.append((user, rest, depth + 1))
        elif user.opcode == "fusion":
          found |= _fused_phases(self, user, k) | {self.phase_of(user)}
          readers.append(user)
          if _joins_only(self, user):  # XLA:GPU's weights joined for one matmul: its readers
            todo.append((user, (), depth + 1))
        else:
          found.add(self.phase_of(user))
          readers.append(user)
          todo += [(p, rest, depth + 1) for p in _entered(self, user, k)]  # its readers inside
      if at.is_root and comp.is_entry is False:
        for caller, _ in self.module.callers.get(at.computation, []):
          if caller.opcode in ("call", "while", "conditional") and len(found) < 4:
            todo.append((caller, index, depth + 1))
    return found

  def computed_from(self, k: int) -> dict[int, int]:
    """Entry parameter -> the fewest computing instructions between it and output `k`."""
    m = self.module
    if k >= len(self.roots):
      return {}
    base, element = _hlo.tuple_element(self.roots[k])
    start = m.find(base, m.entry.name)
    out: dict[int, int] = {}
    todo, seen = deque([(start, 0)]), set()
    while todo:
      instr, d = todo.popleft()
      if instr is None or instr.name in seen or d > DEPTH:
        continue
      seen.add(instr.name)
      if instr.parameter_number is not None and instr.computation == m.entry.name:
        out.setdefault(instr.parameter_number, d)
        continue
      step = 0 if instr.opcode in _MOVES else 1
      if step and self.phase_of(instr) == "backward":
        continue  # a gradient is computed from its input, not the input updated
      for name in instr.operands:
        operand = m.find(_hlo.tuple_element(name)[0], instr.computation)
        (todo.appendleft if step == 0 else todo.append)((operand, d + step))
    return out

  def depends_on_backward(self, k: int) -> bool:
    """Whether output `k` is computed from a value of a backward pass (within `DEPTH`)."""
    if k >= len(self.roots):
      return False
    base, element = _hlo.tuple_element(self.roots[k])
    return self.made_from_backward(self.module.find(base, self.module.entry.name), element)

  def made_from_backward(self, instr: _hlo.Instruction | None, element: int | None = None) -> bool:
    """Whether the value of `instr` (its tuple element `element`) is computed from a value of a
    backward pass within `DEPTH` computing instructions: through the instructions that move it,
    and into the loops and calls that return it (gradients summed over microbatches in a loop
    are the loop's carry, computed in its body)."""
    todo, seen = [(instr, element, 0)], set()
    while todo:
      at, element, d = todo.pop()
      if at is None or (at.name, element) in seen or d > DEPTH:
        continue
      seen.add((at.name, element))
      if at.opcode not in _MOVES + ("parameter",) and self.phase_of(at) == "backward":
        return True
      todo += _sources(self, at, element, d)
    return False


def _joins_only(flow: Flow, fusion: _hlo.Instruction) -> bool:
  """Whether `fusion`'s kernel only joins its operands (a concatenate of them, as XLA:GPU
  makes of the query, key and value weights for one matmul): its value is theirs, moved."""
  comps = [flow.module.computations.get(name) for name in fusion.calls]
  return bool(comps) and all(
    c is not None and all(i.opcode in _JOINS for i in c.instructions) for c in comps
  )


def _fused_phases(flow: Flow, fusion: _hlo.Instruction, k: int) -> set[str]:
  """The phases of the instructions of `fusion`'s kernel that read its operand `k` (XLA fuses
  a forward instruction into a backward kernel: each keeps its own name stack)."""
  found: set[str] = set()
  for name in fusion.calls:
    comp = flow.module.computations.get(name)
    param = comp.parameter(k) if comp is not None else None
    todo = [param] if param is not None else []
    while todo:
      at = todo.pop()
      for user, _ in flow.users(at):
        if user.opcode in _MOVES and len(found) < 4:
          todo.append(user)
        elif flow.op(user):
          found.add(phase(flow.op(user)))
  return found


def _sources(flow: Flow, at: _hlo.Instruction, element: int | None, d: int) -> list:
  """(instruction, tuple element, depth) of the values `at`'s value (its `element`) is made
  from: a tuple's operand, a loop's or call's returned element, a loop body's carry before the
  first iteration, else every operand (one computing instruction further)."""
  op, m = at.opcode, flow.module

  def one(src, index):
    return (src, index[0] if len(index) == 1 else None)

  if op == "get-tuple-element" and at.index is not None:
    return [(*one(*flow.operand(at, 0, (at.index,))), d)]
  if op == "tuple" and element is not None and element < len(at.operands):
    return [(*one(*flow.operand(at, element)), d)]
  if op in ("while", "call") and element is not None:
    comps = [flow._body(at)] if op == "while" else [m.computations.get(c) for c in at.calls]
    return [(c.root, element, d) for c in comps if c is not None and c.root is not None]
  if op == "parameter":
    callers = m.callers.get(at.computation, [])
    if not callers or callers[0][0].opcode != "while":
      return []
    return [(*one(*flow.operand(callers[0][0], 0, () if element is None else (element,))), d)]
  step = 0 if op in _MOVES else 1
  return [(*one(*flow.operand(at, j)), d + step) for j in range(len(at.operands))]


def _entered(flow: Flow, user: _hlo.Instruction, k: int) -> list:
  """The parameters that hold operand `k` of a loop or call inside the computations it runs
  (a loop's carry: its body's parameter)."""
  if user.opcode == "while":
    body = flow._body(user)
    return [p for p in (body.parameter(k),) if p is not None] if body is not None else []
  if user.opcode != "call":
    return []
  comps = [flow.module.computations.get(c) for c in user.calls]
  return [p for c in comps if c is not None and (p := c.parameter(k)) is not None]
