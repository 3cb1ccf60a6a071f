"""The copies XLA inserts into a compiled program, mapped back to the user's values and lines.

Donation and aliasing save memory only if XLA does not copy the buffer anyway. `find_copies` reads
the compiled HLO text structurally (`hlo`) and returns one `CopyRecord` per `copy` / `copy-start`
of at least `threshold` bytes outside fused kernels: its size, how often it runs (once, or per
iteration of which loops and their trip counts), the value it copies (the input leaf, the loop
carry), the source lines that force it, a reason in words and a fix when one is known. The reason
comes from the buffer's own dataflow in the computation that holds the copy (a loop body, a `cond`
branch, the entry): which instruction updates it in place, which reads its old value after that
update, whether it is returned twice, or not donated.

>>> import jax, jax.numpy as jnp
>>> def f(buf, xs):
...   def body(c, x):
...     old = c[0]           # read before the in-place update ...
...     c = c.at[0].set(x)
...     return c, old + c[1]  # ... and used after it
...   return jax.lax.scan(body, buf, xs)
>>> text = jax.jit(f, donate_argnums=0).lower(jnp.zeros(2**16), jnp.ones(4)).compile().as_text()
>>> records = find_copies(text, in_paths=["buf", "xs"])
>>> {(r.nbytes, r.count, r.input_path, r.loop.trip_count) for r in records}
{(262144, 4, 'buf', 4)}
"""

from __future__ import annotations

import dataclasses
import html

from donate._base.errors import message
from donate._base.text import format_bytes, notebook_cells
from donate._xla import copies_why, hlo
from donate._xla.copy_record import CopyRecord, Loop

PASS_THROUGH = frozenset({"copy", "bitcast", "copy-start", "copy-done"})
_UPDATES = frozenset({"dynamic-update-slice", "scatter"})
_CONTROL = frozenset({"while", "call", "conditional", "async-start"})


@dataclasses.dataclass(frozen=True, slots=True)
class _Origin:
  carries: tuple[tuple[Loop, int], ...]  # loops the buffer is carried through, innermost first
  param: int | None  # the entry parameter it comes from
  producer: hlo.Instruction | None  # otherwise the instruction that made it


@dataclasses.dataclass(frozen=True, slots=True)
class _Slot:
  """A buffer that enters a computation and leaves it at the same place (carry k, alias)."""

  index: int | None  # tuple index in the computation's parameter and root (None: param/root)
  inputs: tuple[hlo.Instruction, ...]  # instructions that are the incoming value
  path: tuple[hlo.Instruction, ...]  # from the outgoing value back to the incoming one
  updaters: tuple[hlo.Instruction, ...]  # in-place updates on that path


class _Analysis:
  """One module's call graph, loop contexts and value origins."""

  def __init__(self, module: hlo.Module, in_paths, loops_info):
    self.m, self.in_paths, self.loops_info = module, in_paths, loops_info
    self._users: dict[str, dict] = {}
    self._contexts: dict[str, tuple] = {}
    self._loops: dict[int, Loop] = {}
    self._states: dict[str, hlo.Shape] = {}  # while name -> its loop state's shape

  def users(self, comp: hlo.Computation):
    if comp.name not in self._users:
      self._users[comp.name] = self.m.users(comp)
    return self._users[comp.name]

  def fused(self, comp: hlo.Computation) -> bool:
    """Whether `comp` runs inside a kernel (a fusion's body, a reduction's scalar function)."""
    callers = self.m.callers.get(comp.name, ())
    return bool(callers) and all(c.opcode not in _CONTROL for c, _ in callers)

  def loop(self, instr: hlo.Instruction) -> Loop:
    loop = self._loops.get(id(instr))
    if loop is None:
      loop = Loop(instr.name, self.m.source(instr), instr.trip_count())
      if self.loops_info is not None:
        loop = dataclasses.replace(loop, kind=self.loops_info.kind(loop.line))
      self._loops[id(instr)] = loop
      self._states[instr.name] = instr.shape
    return loop

  def context(self, name: str) -> tuple[tuple[Loop, ...], int | None]:
    """(enclosing loops outermost first, executions per call) of a computation."""
    if name not in self._contexts:
      self._contexts[name] = ((), 1)  # guards recursion
      callers = self.m.callers.get(name)
      if not callers:
        self._contexts[name] = ((), 1)
      else:
        instr, attr = callers[0]
        loops, count = self.context(instr.computation)
        if instr.opcode == "while" and attr in ("body", "condition"):
          loop = self.loop(instr)
          trips = loop.trip_count
          loops = loops + (loop,)
          count = None if count is None or trips is None else count * (trips + (attr != "body"))
        self._contexts[name] = (loops, count)
    return self._contexts[name]

  def comp(self, instr: hlo.Instruction) -> hlo.Computation:
    return self.m.computations[instr.computation]

  def operand(self, instr: hlo.Instruction, k: int = 0) -> hlo.Instruction | None:
    return self.comp(instr).get(instr.operands[k]) if k < len(instr.operands) else None

  def origin(self, instr: hlo.Instruction) -> _Origin:
    """Where the buffer `instr` holds comes from: input parameter, loop carries, or a producer."""
    carries: list = []
    index: tuple[int, ...] = ()
    for _ in range(10000):
      op = instr.opcode
      nxt = None
      if op in PASS_THROUGH or op == "opt-barrier":
        nxt = self.operand(instr)
      elif op == "get-tuple-element":
        index, nxt = (instr.index or 0,) + index, self.operand(instr)
      elif op == "tuple" and index:
        nxt, index = self.operand(instr, index[0]), index[1:]
      elif op == "while" and index:
        carries.append((self.loop(instr), index[0]))
        nxt = self.operand(instr)
      elif op == "call" and index:
        callee = dict(instr.called).get("to_apply")
        nxt = self.m.computations[callee].root if callee in self.m.computations else None
      elif op == "parameter":
        nxt, carry = self._through_parameter(instr, index)
        if carry is not None:
          carries.append(carry)
        if nxt is None:
          param = instr.parameter_number if self.comp(instr).is_entry else None
          return _Origin(tuple(carries), param, None)
      if nxt is None:
        return _Origin(tuple(carries), None, instr)
      instr = nxt
    return _Origin(tuple(carries), None, instr)

  def _through_parameter(self, param: hlo.Instruction, index):
    """The caller's operand that feeds parameter `param`, and the loop carry it passes, if any."""
    callers = self.m.callers.get(param.computation)
    if not callers:
      return None, None
    caller, attr = callers[0]
    n = param.parameter_number
    if caller.opcode == "while":
      carry = (self.loop(caller), index[0]) if index else None
      return self.operand(caller), carry
    if caller.opcode == "conditional":
      if attr == "branch_computations":
        names = [c for a, c in caller.called if a == "branch_computations"]
        return self.operand(caller, 1 + names.index(param.computation)), None
      return self.operand(caller, 1 if attr == "true_computation" else 2), None
    if caller.opcode == "call" and n is not None:
      return self.operand(caller, n), None
    return None, None

  def describe(self, origin: _Origin, instr: hlo.Instruction) -> str:
    """The copied value in words: "buf (carry[0] of scan at f.py:7)"."""
    carries = "; ".join(self.carry_words(loop, instr.shape, k) for loop, k in origin.carries)
    if origin.param is not None:
      return self.path(origin.param) + (f" ({carries})" if carries else "")
    if carries:
      return carries
    where = self.m.source(origin.producer) if origin.producer is not None else None
    what = origin.producer.opcode if origin.producer is not None else "a value"
    return f"the result of {what}" + (f" at {where}" if where else "")

  def carry_words(self, loop: Loop, shape: hlo.Shape, k: int) -> str:
    state = self._states.get(loop.name)
    elements = (state.elements or ()) if state is not None else ()
    same = [j for j, e in enumerate(elements) if (e.dims, e.dtype) == (shape.dims, shape.dtype)]
    rank = (same.index(k), len(same)) if k in same else None
    info = self.loops_info
    name = (info.carry_name(loop.line, shape, rank) if info else None) or f"carry {k}"
    return f"{name} of {loop.kind} at {loop.line or loop.name}"

  def path(self, param: int) -> str:
    if self.in_paths is not None and param < len(self.in_paths):
      return self.in_paths[param]
    return f"parameter {param}"


def inplace_operand(module: hlo.Module, instr: hlo.Instruction) -> int | None:
  """The operand whose buffer `instr` updates in place (dynamic-update-slice, scatter, fusions of
  them, custom calls with `output_to_operand_aliasing`), or None."""
  if instr.opcode in _UPDATES:
    return 0
  text = instr.attr("output_to_operand_aliasing") if instr.opcode == "custom-call" else None
  if text:
    inner = text[text.find("(") + 1 : text.find(",", text.find("("))]
    return int(inner) if inner.strip().isdigit() else None
  if instr.opcode not in ("fusion", "fusion-start"):
    return None
  fused = module.computations.get(dict(instr.called).get("calls", ""))
  if fused is None:
    return None
  root = fused.root
  while root is not None and root.opcode == "bitcast":
    root = fused.get(root.operands[0])
  if root is None or root.opcode not in _UPDATES:
    return None
  target = fused.get(root.operands[0])
  while target is not None and target.opcode == "bitcast":
    target = fused.get(target.operands[0])
  return target.parameter_number if target is not None and target.opcode == "parameter" else None


def _passes(instr: hlo.Instruction) -> bool:
  """Whether `instr` holds its operand's buffer (a copy, bitcast, or the end of an async op)."""
  return instr.opcode in PASS_THROUGH or instr.opcode.endswith("-done")


def _slot(a: _Analysis, comp: hlo.Computation, copy: hlo.Instruction) -> _Slot | None:
  """The carry/alias slot of `comp` whose buffer `copy` belongs to, or None."""
  out_index, root = _slot_index(a, comp, copy), comp.root
  if out_index is None or root is None:  # no root: a computation with no instructions
    return None
  kind, k = out_index
  ins = comp.instructions
  if kind == "entry":
    outs = a.m.aliases.get(k)
    if outs is None:
      return None
    out: hlo.Instruction | None = root
    if outs:
      entry = a.m.computations[comp.name]
      out = entry.get(root.operands[outs[0]]) if root.opcode == "tuple" else None
    inputs = tuple(i for i in ins if i.opcode == "parameter" and i.parameter_number == k)
  else:
    out = comp.get(root.operands[k]) if root.opcode == "tuple" and k < len(root.operands) else None
    gtes = [i for i in ins if i.opcode == "get-tuple-element" and i.index == k]
    sources = [(i, comp.get(i.operands[0])) for i in gtes]
    inputs = tuple(i for i, p in sources if p is not None and p.opcode == "parameter")
  if out is None:
    return None
  path, updaters = [], []
  node: hlo.Instruction | None = out
  while node is not None and node not in inputs:
    path.append(node)
    k_in = 0 if _passes(node) else inplace_operand(a.m, node)
    if k_in is None:
      break
    if not _passes(node):
      updaters.append(node)
    node = comp.get(node.operands[k_in]) if k_in < len(node.operands) else None
  if node is not None and node in inputs:
    path.append(node)
  return _Slot(None if kind == "entry" else k, inputs, tuple(path), tuple(reversed(updaters)))


def _slot_index(a: _Analysis, comp: hlo.Computation, copy: hlo.Instruction):
  """("entry", parameter) or ("tuple", k) for the slot a copy belongs to, from its operand side."""
  node: hlo.Instruction | None = copy
  while node is not None and node.opcode in PASS_THROUGH:
    node = a.operand(node)
  if node is None:
    return None
  if node.opcode == "parameter" and comp.is_entry:
    return ("entry", node.parameter_number)
  if node.opcode == "get-tuple-element":
    src = a.operand(node)
    if src is not None and src.opcode == "parameter":
      return ("tuple", node.index or 0)
  # The copy's operand was made in this computation: find the root position it flows to.
  users = a.users(comp)
  node, seen = copy, set()
  while node is not None and node.name not in seen:
    seen.add(node.name)
    nxt = None
    for user, k in users.get(node.name, ()):
      if user.is_root and user.opcode == "tuple":
        return ("tuple", k) if not comp.is_entry else _entry_slot(a, k)
      if _passes(user) or inplace_operand(a.m, user) == k:
        nxt = user
    node = nxt
  return None


def _entry_slot(a: _Analysis, out: int):
  for param, outs in a.m.aliases.items():
    if outs[:1] == (out,):
      return ("entry", param)
  return None


def find_copies(
  compiled_hlo_text: str, *, in_paths: list[str] | None = None, threshold: int = 65536, jaxpr=None
) -> tuple[CopyRecord, ...]:
  """The copies of at least `threshold` bytes that XLA inserted into a compiled program.

  Args:
    compiled_hlo_text: `jax.stages.Compiled.as_text()` (or `donate.jit(...).lower().compile()`).
    in_paths: the user's path of each entry parameter, by parameter number (for `donate.jit`,
      the plan's leaf paths in the layout's order); default "parameter N".
    threshold: the smallest copy reported, in bytes.
    jaxpr: the traced (closed) jaxpr, to name loops ("scan", "while_loop"), carries by their
      index in the jaxpr, and source lines that the HLO metadata lacks.

  Returns:
    One record per copy, in program order (entry first, then loop bodies).
  """
  module = hlo.parse_module(compiled_hlo_text)
  info = copies_why.JaxprLoops(jaxpr) if jaxpr is not None else None
  a = _Analysis(module, in_paths, info)
  records = []
  for comp in _ordered(module):
    if a.fused(comp):
      continue
    for instr in comp.instructions:
      if instr.opcode in ("copy", "copy-start"):
        shape = (a.operand(instr) or instr).shape if instr.opcode == "copy-start" else instr.shape
        if shape.elements is None and shape.nbytes >= threshold:
          records.append(_record(a, comp, instr, shape))
  return tuple(records)


def _ordered(module: hlo.Module) -> list[hlo.Computation]:
  comps = list(module.computations.values())
  return [module.entry] + [c for c in comps if c is not module.entry]


def _record(
  a: _Analysis, comp: hlo.Computation, instr: hlo.Instruction, shape: hlo.Shape
) -> CopyRecord:
  loops, count = a.context(comp.name)
  origin = a.origin(a.operand(instr) or instr)
  slot = _slot(a, comp, instr)
  value = a.describe(origin, instr)
  first = origin.carries[0] if origin.carries and loops else None
  carry = first[1] if first is not None and first[0] is loops[-1] else None
  callers = a.m.callers.get(comp.name, ())
  in_loop = callers and callers[0][0].opcode == "while" and loops
  if carry is None and slot is not None and slot.index is not None and in_loop:
    carry = slot.index  # the new carry value is made here: name the carry it becomes
    value = a.carry_words(loops[-1], shape, carry)
  from_input = origin.param is not None and origin.param in a.m.aliases
  kept = from_input or bool(origin.carries) or carry is not None
  donated = kept and copies_why.layout_change(a, instr) is None
  reason, lines, fix = copies_why.explain(a, comp, instr, origin, slot, value)
  input_path = a.path(origin.param) if origin.param is not None else None
  what = (instr.name, instr.opcode, shape.nbytes, shape.dims, shape.dtype or "?", loops, count)
  where = tuple(dict.fromkeys(notebook_cells(ln) for ln in lines if ln))
  # The words name a notebook's cells (`In[3]:17`); the loops keep their lines, which are keys.
  value, reason = notebook_cells(value), notebook_cells(reason)
  fix = notebook_cells(fix) if fix else fix
  return CopyRecord(*what, value, input_path, carry, donated, where, reason, fix)


def how_often(record: CopyRecord) -> str:
  """ "once per call", or "8x per call: each iteration of scan at f.py:7 (8 iterations)"."""
  if not record.loops:
    return "once per call"
  times = f"{record.count}x per call" if record.count is not None else "per iteration"
  inner, *outer = reversed(record.loops)
  inside = "".join(f" inside {loop}" for loop in outer)
  return f"{times}: each iteration of {inner}{inside}"


def format_copies(records: tuple[CopyRecord, ...], threshold: int = 65536) -> list[str]:
  """Lines of the "copies XLA added" section of a plan's text; empty when there are none.

  >>> r = CopyRecord("copy.6", "copy", 4 << 20, (1 << 20,), "f32", (Loop("while.6", "f.py:7", 8,
  ...     "scan"),), 8, "buf (carry[0] of scan at f.py:7)", "buf", 1, True, ("f.py:4", "f.py:5"),
  ...     "read after update", None)
  >>> print("\\n".join(format_copies((r,))))
  copies XLA added (1 of at least 64.0 KiB, 32.0 MiB copied per call):
    copy.6: 4.0 MiB f32[1048576], 8x per call: each iteration of scan at f.py:7 (8 iterations)
      value: buf (carry[0] of scan at f.py:7)
      why: read after update
      lines: f.py:4, f.py:5
  """
  if not records:
    return []
  known = [r.per_call_bytes for r in records if r.per_call_bytes is not None]
  partial = " in known trip counts" if len(known) < len(records) else ""
  total = f", {format_bytes(sum(known))} copied per call{partial}"
  lines = [f"copies XLA added ({len(records)} of at least {format_bytes(threshold)}{total}):"]
  for r in records:
    lines.append(f"  {r.instruction}: {format_bytes(r.nbytes)} {_array(r)}, {how_often(r)}")
    lines.append(f"    value: {r.value}")
    lines.append(f"    why: {r.reason}")
    if r.lines:
      lines.append(f"    lines: {', '.join(r.lines)}")
    if r.fix:
      lines.append(f"    fix: {r.fix}")
  return lines


def copies_html(records: tuple[CopyRecord, ...]) -> str:
  """The "copies XLA added" section as an HTML fragment (a table); empty when there are none."""
  if not records:
    return ""
  esc = html.escape
  head = "".join(f"<th>{h}</th>" for h in ("copy", "bytes", "runs", "value", "why", "lines", "fix"))
  body = "".join(
    f"<tr><td><code>{esc(r.instruction)}</code></td><td>{format_bytes(r.nbytes)} "
    f"{esc(_array(r))}</td><td>{esc(how_often(r))}</td><td><code>{esc(r.value)}"
    f"</code></td><td>{esc(r.reason)}</td><td>{'<br>'.join(map(esc, r.lines))}</td>"
    f"<td>{esc(r.fix or '-')}</td></tr>"
    for r in records
  )
  return f"<p><b>copies XLA added</b></p><table><tr>{head}</tr>{body}</table>"


def strict_problems(records: tuple[CopyRecord, ...] | None, function: str) -> list[str]:
  """One message (the library's shape) per copied donated buffer or loop carry; for strict mode.

  >>> r = CopyRecord("copy.6", "copy", 4 << 20, (1 << 20,), "f32", (), 1, "buf", "buf", None,
  ...     True, (), "buf is read at f.py:4 after it is updated in place at f.py:3", None)
  >>> print(strict_problems((r,), "step")[0])
  donate: step: XLA copies a donated buffer (4.0 MiB, once per call) at buf: expected no copy, \
got buf is read at f.py:4 after it is updated in place at f.py:3. Fix: change the code at the \
lines named so that the buffer is not read after it is updated in place, or leave strict="copies" \
off to accept the copy.
  """
  return [
    message(
      f"{function}: XLA copies a {'loop carry' if r.loops else 'donated buffer'} "
      f"({format_bytes(r.nbytes)}, {how_often(r)})",
      path=r.value,
      expected="no copy",
      got=r.reason,
      fix=r.fix
      or "change the code at the lines named so that the buffer is not read after it "
      "is updated in place, or leave strict=\"copies\" off to accept the copy",
    )
    for r in records or ()
    if r.donated
  ]


def _array(r: CopyRecord) -> str:
  return f"{r.dtype}[{','.join(map(str, r.shape))}]"
