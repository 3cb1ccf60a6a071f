"""Why XLA copies a buffer: reasons, source lines and fixes for `donate._xla.copies`.

The reason is read from the buffer's dataflow in the computation that holds the copy (a loop
body, a `cond` branch, the entry): `explain` gets the slot the buffer belongs to (carry k, or a
donated input and the output that aliases it) and the path from the outgoing value back to the
incoming one; readers of the old value scheduled after the first in-place update on that path
force the copy. Source lines come from the HLO metadata (looking inside fusions for the
instruction that really reads or writes), and from the jaxpr when the metadata has none.
"""

from __future__ import annotations

import numpy as np

from donate._base import compat as _compat
from donate._base import jaxprs as _jaxprs
from donate._base import loops as _loops
from donate._base import primitives as _primitives

_FIX_LOOP_READ = (
  "carry the value you need into the next iteration instead of reading it before the update "
  "(compute it from the updated carry at the end of the step), or read it after the update when "
  "the update leaves it unchanged; XLA fuses small reads into their later consumers, so moving "
  "the read up in the code is not enough"
)
_WORDS = {
  "conditional": "a cond",
  "while": "an inner loop",
  "call": "a call",
  "fusion": "a fused computation",
}


def explain(a, comp, copy, origin, slot, value) -> tuple[str, list[str], str | None]:
  """(reason, source lines, fix) for one copy of `value`; see the module docstring."""
  in_loop = bool(a.context(comp.name)[0])
  layouts = layout_change(a, copy)
  if layouts is not None:
    lines = [ln for u, k in a.users(comp).get(copy.name, ()) for ln in reader_lines(a, u, k)]
    return (
      f"a layout change {layouts[0]} -> {layouts[1]} of {value}: XLA rewrites the buffer "
      f"in the order its consumer{_at(lines)} reads it",
      lines,
      None,
    )
  if slot is not None and slot.path and slot.path[-1] in slot.inputs:
    found = _read_after_update(a, comp, slot, value, in_loop, origin, _shape(a, copy))
    if found is not None:
      return found
    others = _returned_elsewhere(a, comp, slot)
    if others:
      where = "carry" if slot.index is not None else "output"
      return (
        f"{value} is also returned as {where} {', '.join(map(str, others))}, which needs a "
        "buffer of its own",
        _own(a, copy),
        None,
      )
    caller = a.m.callers.get(comp.name, [(None, None)])[0][0]
    if not slot.updaters and caller is not None and caller.opcode == "conditional":
      line = a.m.source(caller)
      return (
        f"the cond branch{_at([line])} returns {value} unchanged while another branch "
        "writes it in place, so the conditional's result needs a buffer of its own",
        [line] if line else [],
        None,
      )
  if slot is not None and slot.path and slot.path[-1] not in slot.inputs:
    return _computed_elsewhere(a, comp, copy, slot, value)
  if comp.is_entry and origin.param is not None and origin.param not in a.m.aliases:
    return _not_donated(a, comp, copy, origin, value)
  lines = _own(a, copy)
  return (
    f"XLA copies {value}" + (f" (the copy is attributed to {lines[0]})" if lines else ""),
    lines,
    None,
  )


def layout_change(a, copy) -> tuple[str, str] | None:
  """(operand layout, result layout) when a copy only changes the layout (a transpose)."""
  source = a.operand(copy)
  if copy.opcode != "copy" or source is None:
    return None
  old, new = source.shape.layout, copy.shape.layout
  return (old, new) if None not in (old, new) and old != new else None


def _read_after_update(a, comp, slot, value, in_loop, origin, shape):
  late = _late_reads(a, comp, slot)
  if not late:
    return None
  read = [ln for u, k in late for ln in reader_lines(a, u, k)]
  wrote = [ln for u in slot.updaters for ln in updater_lines(a, u)]
  if a.loops_info is not None and in_loop:  # the jaxpr knows reads that XLA's metadata lost
    j_read, j_wrote = a.loops_info.carry_lines(a.context(comp.name)[0][-1].line, shape)
    wrote = wrote + j_wrote
    where = {_function(ln) for ln in wrote}
    read = [ln for ln in j_read if _function(ln) in where] + [ln for ln in read if ln not in wrote]
  reason = (
    f"{value} is read{_at(read)} after it is updated in place{_at(wrote)}, so XLA keeps "
    "the old value in a copy"
  )
  if in_loop:
    return reason, read + wrote, _FIX_LOOP_READ
  path = a.path(origin.param) if origin.param is not None else value
  return (
    reason,
    read + wrote,
    f"read what you need from the updated output where the update leaves it unchanged, "
    f"or do not donate {path}: the copy costs as much memory as not donating, and time",
  )


def _late_reads(a, comp, slot) -> list:
  """Reads of the buffer's state before an in-place update, scheduled after that update.

  The path from the incoming to the outgoing value is cut at each update into states; a read of
  one state (or of a copy of it) placed after the update that ends that state forces a copy.
  """
  users = a.users(comp)
  forward = list(reversed(slot.path))
  on_path = {(forward[k + 1].name, forward[k].name) for k in range(len(forward) - 1)}
  late, state = [], [i.name for i in slot.inputs]
  for node in forward:
    if node in slot.updaters:
      for name in _with_copies(users, state):
        late += [
          (u, k)
          for u, k in users.get(name, ())
          if u.position > node.position
          and not u.is_root
          and (u.name, name) not in on_path
          and u.opcode not in ("copy", "bitcast")
        ]
      state = []
    state.append(node.name)
  return sorted(set(late), key=lambda p: (p[0].position, p[1]))


def _with_copies(users, names) -> set[str]:
  out, todo = set(names), list(names)
  while todo:
    for user, _ in users.get(todo.pop(), ()):
      if user.opcode in ("copy", "bitcast") and user.name not in out:
        out.add(user.name)
        todo.append(user.name)
  return out


def _computed_elsewhere(a, comp, copy, slot, value):
  """The outgoing value is not an in-place update of the incoming buffer."""
  producer = slot.path[-1]
  while producer.opcode == "get-tuple-element" and a.operand(producer) is not None:
    producer = a.operand(producer)
  made = a.m.source(producer)
  what = _WORDS.get(producer.opcode, producer.opcode)
  target = "the carry's buffer" if slot.index is not None else "the donated buffer"
  if copy in slot.path:  # the copy writes the new value into the slot's buffer
    return (
      f"the new value of {value} is computed by {what}{_at([made])} into a buffer of its "
      f"own and copied into {target}",
      [made] if made else [],
      None,
    )
  users = a.users(comp)
  read = [
    ln
    for name in _with_copies(users, [copy.name])
    for u, k in users.get(name, ())
    if not u.is_root and u.opcode not in ("copy", "bitcast")
    for ln in reader_lines(a, u, k)
  ]
  read = list(dict.fromkeys(read))
  return (
    f"the new value of {value} is written into {target} by {what}{_at([made])} while its "
    f"old value is still read{_at(read)}, so XLA keeps the old value in a copy",
    read + ([made] if made else []),
    None,
  )


def _not_donated(a, comp, copy, origin, value):
  path = a.path(origin.param)
  users = a.users(comp)
  node, loop = copy, None
  for _ in range(100):
    nxt = [u for u, _ in users.get(node.name, ())]
    if not nxt:
      break
    node = nxt[0]
    if node.opcode in ("while", "call"):
      loop = node
      break
  if loop is not None:
    line = a.m.source(loop)
    return (
      f"{value} is not donated and the loop{_at([line])} updates its carry in place, so XLA "
      "first copies it into a buffer of its own",
      [line] if line else [],
      f"donate {path} (donate_argnums / donate_argnames) if the caller does not need it "
      "after the call",
    )
  return (
    f"{value} is not donated, so XLA copies it to make an output or a buffer it may write",
    _own(a, copy),
    f"donate {path} if the caller does not need it after the call",
  )


def _members(a, comp, slot) -> set[str]:
  """The slot's buffers: its path and every copy or bitcast of them."""
  return _with_copies(a.users(comp), [i.name for i in slot.path + slot.inputs])


def _returned_elsewhere(a, comp, slot) -> list[int]:
  members = _members(a, comp, slot)
  root = comp.root
  if root.opcode != "tuple":
    return []
  mine = slot.index if slot.index is not None else None
  if mine is None and slot.inputs:
    outs = a.m.aliases.get(slot.inputs[0].parameter_number)
    mine = outs[0] if outs else None
  return [k for k, name in enumerate(root.operands) if name in members and k != mine]


def _shape(a, copy):
  return a.operand(copy).shape if copy.opcode == "copy-start" else copy.shape


def _own(a, copy) -> list[str]:
  line = a.m.source(copy)
  return [line] if line else []


def _function(line: str) -> str:
  return line.rpartition(" (")[2]


def _at(lines) -> str:
  lines = list(dict.fromkeys(ln for ln in lines if ln))
  return f" at {', '.join(lines)}" if lines else ""


def reader_lines(a, user, k: int) -> list[str]:
  """Source lines of what `user` does with operand `k` (inside a fusion: the fused reader)."""
  if user.opcode == "fusion":
    fused = a.m.computations.get(dict(user.called).get("calls", ""))
    param = fused.parameter(k) if fused is not None else None
    if param is not None:
      found = _first_sources(a, fused, param)
      if found:
        return found
  line = a.m.source(user)
  return [line] if line else []


def _first_sources(a, comp, start) -> list[str]:
  found: list[str] = []
  users, todo, seen = a.users(comp), [start], set()
  while todo and not found:
    nxt = []
    for node in todo:
      for user, k in users.get(node.name, ()):
        if user.name in seen:
          continue
        seen.add(user.name)
        line = a.m.source(user)
        if line:
          found.append(line)
        elif user.opcode == "fusion":
          found += reader_lines(a, user, k)
        else:
          nxt.append(user)
    todo = nxt
  return found


def updater_lines(a, instr) -> list[str]:
  """Source line of an in-place update (inside a fusion: the fused update itself)."""
  if instr.opcode in ("fusion", "fusion-start"):
    fused = a.m.computations.get(dict(instr.called).get("calls", ""))
    if fused is not None:
      root = fused.root
      while root is not None and root.opcode == "bitcast":
        root = fused.get(root.operands[0])
      line = a.m.source(root) if root is not None else None
      if line:
        return [line]
  line = a.m.source(instr)
  return [line] if line else []


def hlo_dtype(dtype) -> str:
  """The HLO element-type name of a numpy/JAX dtype: float32 -> f32, int8 -> s8, bool -> pred."""
  dt = np.dtype(dtype)
  if dt == np.bool_:
    return "pred"
  if dt.name.startswith(("bfloat", "float8")):
    return dt.name.replace("bfloat", "bf").replace("float8_", "f8")
  kind = {"f": "f", "i": "s", "u": "u", "c": "c"}.get(dt.kind, dt.kind)
  return f"{kind}{dt.itemsize * 8}"


def _line_key(line: str | None) -> str | None:
  return line.split(" (")[0] if line else None


class JaxprLoops:
  """The loops of a traced jaxpr by source line: kind, carries, and their reads and updates."""

  def __init__(self, closed):
    self.loops: dict[str | None, list] = {}
    self._walk(_jaxprs.open_jaxpr(closed) or closed)

  def _walk(self, jaxpr) -> None:
    for eqn in jaxpr.eqns:
      loop = _loops.loop_layout(eqn)
      if loop is not None:
        carries = loop.body.invars[loop.body_consts : loop.body_consts + loop.carries]
        key = _line_key(_compat.source_line(eqn.source_info))
        kind = "scan" if loop.kind == "scan" else "while_loop"
        self.loops.setdefault(key, []).append((kind, tuple(carries), loop.body))
      for sub in _jaxprs.subs(eqn):
        self._walk(sub.jaxpr)

  def kind(self, line: str | None) -> str:
    found = self.loops.get(_line_key(line))
    return found[0][0] if found else "loop"

  def _carry(self, line, shape, rank=None):
    """(jaxpr carry index, its variable, the loop body) of the carry of this shape and dtype.

    With several carries of that shape, `rank` = (position among the compiled loop state's
    elements of that shape, how many there are) picks one when the counts agree (XLA keeps the
    order of the loop state).
    """
    for _kind, carries, body in self.loops.get(_line_key(line), ()):
      same = [
        j
        for j, v in enumerate(carries)
        if tuple(v.aval.shape) == tuple(shape.dims) and hlo_dtype(v.aval.dtype) == shape.dtype
      ]
      if len(same) > 1 and rank is not None and rank[1] == len(same):
        same = [same[rank[0]]]
      if len(same) == 1:
        return same[0], carries[same[0]], body
    return None

  def carry_name(self, line: str | None, shape, rank=None) -> str | None:
    """`carry[j]`, the carry's index in the jaxpr loop, when it can be told (see `_carry`)."""
    found = self._carry(line, shape, rank) if shape.elements is None else None
    return f"carry[{found[0]}]" if found else None

  def carry_lines(self, line: str | None, shape) -> tuple[list[str], list[str]]:
    """(reads, in-place updates) of the loop carry of this shape in the jaxpr's loop body."""
    found = self._carry(line, shape) if shape.elements is None else None
    if found is None:
      return [], []
    read: list = []
    wrote: list = []
    for eqn, k in _uses(found[2], found[1]):
      where = _compat.source_line(eqn.source_info)
      (wrote if k == 0 and eqn.primitive.name in _primitives.IN_PLACE else read).append(where)
    return read, wrote


def _uses(jaxpr, var):
  """(equation, operand index) of every use of `var`, looking inside calls."""
  for eqn in jaxpr.eqns:
    for k, v in enumerate(eqn.invars):
      if v is not var:
        continue
      inner = [s for s in _jaxprs.subs(eqn) if s.transparent]
      if not inner:
        yield eqn, k
      for sub in inner:
        for j, outer in enumerate(sub.in_map):
          if outer == k:
            yield from _uses(sub.jaxpr, sub.jaxpr.invars[j])
