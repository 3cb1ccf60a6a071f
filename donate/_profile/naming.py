"""Who a value of the compiled program belongs to: the user's source line, the JAX name stack,
and what kind of buffer it is.

XLA keeps JAX's metadata on most instructions (`op_name`, the name stack, and the source line,
printed as `source_file`/`source_line` or a `stack_frame_id`). Instructions XLA adds (copies,
tuples, a loop's parameters) often carry none; they speak for what they copy or carry: a copy for
its operand, a loop body's parameter for the loop that calls it, a fusion without metadata (XLA:GPU
0.12 prints some) for its first operand (the buffer a dynamic-update-slice writes into).

>>> from donate._xla import hlo as _hlo
>>> m = _hlo.parse_module('''HloModule m
...
... ENTRY %main (a: f32[4]) -> f32[4] {
...   %a = f32[4]{0} parameter(0), metadata={op_name="x"}
...   %e = f32[4]{0} exponential(%a), metadata={META}
...   ROOT %c = f32[4]{0} copy(%e)
... }'''.replace("META", 'op_name="jit(f)/layer/exp" source_file="f.py" source_line=3'))
>>> c = m.entry.get("c")
>>> source_of(m, c), scope_of(m, c), kind_of(m, c, False)
('f.py:3', 'jit(f)/layer/exp', 'copy')
>>> instruction_name("while.2{1}"), group_scope("jit(f)/layer/exp")
('while.2', 'jit(f)/layer')
"""

from __future__ import annotations

from donate._base.text import notebook_cell
from donate._xla import frames as _frames
from donate._xla import hlo as _hlo

_FORWARDING = (
  "copy",
  "bitcast",
  "get-tuple-element",
  "tuple",
  "reshape",
  "transpose",
  "copy-start",
  "copy-done",
  "dynamic-update-slice",
  "parameter",
)
_DEPTH = 8


def instruction_name(value: str) -> str:
  """The instruction that defines value `value` (`while.2{1}` -> `while.2`)."""
  return value.split("{", 1)[0]


def _speaker(module: _hlo.Module, instr: _hlo.Instruction | None, want) -> _hlo.Instruction | None:
  """The first instruction from `instr` that has `want` (operand 0, or a body's caller)."""
  for _ in range(_DEPTH):
    if instr is None:
      return None
    if want(instr):
      return instr
    if instr.opcode == "parameter" and not module.computations[instr.computation].is_entry:
      callers = module.callers.get(instr.computation, [])
      instr = callers[0][0] if callers else None
    elif instr.operands and (
      instr.opcode in _FORWARDING or (instr.opcode == "fusion" and not instr.metadata_op)
    ):  # XLA's fusion without metadata; an operand `while.1#2` is part of `while.1`'s value
      instr = module.find(_hlo.tuple_element(instr.operands[0])[0], instr.computation)
    else:
      return None
  return None


def _short(where: str | None) -> str | None:
  """`file:line (function)` -> `file:line`."""
  if where is None:
    return None
  head, sep, _ = where.partition(" (")
  return head if sep else where


def _own_lines(module: _hlo.Module, instr: _hlo.Instruction) -> tuple[str | None, str | None]:
  """`instr`'s source line and its library's line (where the innermost frame is a library's),
  or for a fusion without a line its kernel's first (a notebook cell's file named as IPython
  names the cell)."""
  found, where = module.source(instr), instr
  if found is None and instr.opcode == "fusion":
    for name in instr.calls:
      comp = module.computations.get(name)
      for inner in comp.instructions if comp is not None else ():
        found, where = module.source(inner), inner
        if found is not None:
          break
      if found is not None:
        break
  if found is None:
    return None, None
  library = module.library_source(where)
  return notebook_cell(found), library


def _own_source(module: _hlo.Module, instr: _hlo.Instruction) -> str | None:
  return _own_lines(module, instr)[0]


def source_of(module: _hlo.Module, instr: _hlo.Instruction | None) -> str | None:
  """The user's `file:line` for `instr`, or for what it copies or carries; None if unknown."""
  found = _speaker(module, instr, lambda i: _own_source(module, i) is not None)
  return _short(_own_source(module, found)) if found is not None else None


def library_of(module: _hlo.Module, instr: _hlo.Instruction | None) -> str | None:
  """The library's `file:line` (`flax/linen/linear.py:287`) of the instruction whose user's line
  `source_of` gives, where that differs from the user's; None if there is none."""
  found = _speaker(module, instr, lambda i: _own_source(module, i) is not None)
  return library_line(*_own_lines(module, found)) if found is not None else None


def library_line(user: str | None, library: str | None) -> str | None:
  """`library` as its package's `file:line`, None when it is missing or the user's own line."""
  if library is None or user is None or _short(library) == _short(user):
    return None
  return _frames.package_line(library)


def argument_of(module: _hlo.Module, instr: _hlo.Instruction | None) -> int | None:
  """The entry parameter a value copies or carries (following copies and loop carries)."""
  found = _speaker(
    module, instr, lambda i: i.opcode == "parameter" and module.computations[i.computation].is_entry
  )
  return found.parameter_number if found is not None else None


def scope_of(module: _hlo.Module, instr: _hlo.Instruction | None) -> str | None:
  """The JAX name stack of `instr` (its `op_name`; the first of a fusion's), or None."""
  found = _speaker(
    module,
    instr,
    lambda i: (
      bool(i.metadata_op)
      and (i.opcode != "parameter" or not module.computations[i.computation].is_entry)
    ),
  )
  return _unescape(found.metadata_op.split(";")[0]) if found is not None else None


def _unescape(text: str) -> str:
  return text.replace("\\'", "'").replace('\\"', '"')


def group_scope(scope: str | None) -> str | None:
  """The scope without its last part (the primitive): what `by_scope` groups by."""
  if not scope:
    return None
  head, sep, _ = scope.rpartition("/")
  return head if sep else scope


def _in_loop(module: _hlo.Module, instr: _hlo.Instruction) -> bool:
  return any(
    caller.opcode in ("while", "call") for caller, _ in module.callers.get(instr.computation, [])
  )


def kind_of(module: _hlo.Module, instr: _hlo.Instruction | None, collective: bool) -> str:
  """ "collective", "copy", "loop carry" or "temporary" for a value of a temp allocation."""
  if collective or (
    instr is not None
    and (
      instr.collective_kind
      or (instr.opcode.endswith("-done") and instr.opcode[:-5] in _hlo.COLLECTIVE_KINDS)
    )
  ):
    return "collective"
  if instr is None:
    return "temporary"
  if instr.opcode in ("copy", "copy-start", "copy-done"):
    return "copy"
  if instr.opcode == "while" or (
    instr.opcode in ("parameter", "get-tuple-element", "tuple") and _in_loop(module, instr)
  ):
    return "loop carry"
  return "temporary"


# The path of a parameter that holds a closed-over constant, not an argument (as a donate.jit
# program names it, `_jit.compiled.Parameters`): its category is "constants", never donated.
CONSTANT = "<constant>"


def entry_parameter_path(module: _hlo.Module, number: int) -> str:
  """The path JAX wrote as an entry parameter's `op_name` (`params['w']`), or `arg<number>`."""
  param = module.entry.parameter(number)
  name = param.metadata_op if param is not None else ""
  return _unescape(name) if name else f"arg{number}"


def output_instructions(module: _hlo.Module) -> list[str]:
  """The instruction names of the program's outputs, in order (the root tuple's operands)."""
  root = module.entry.root
  if root is None:
    return []
  return list(root.operands) if root.opcode == "tuple" else [root.name]


def _element(module: _hlo.Module, name: str, k: int) -> list[str]:
  """The instructions whose value is element `k` of instruction `name`'s: a tuple's operand, or
  what a `call`'s computation returns there (its root tuple's operand, or element `k` of the loop
  or call it returns whole)."""
  instr = module.find(name)
  if instr is None:
    return []
  if instr.opcode == "tuple":
    return [instr.operands[k]] if k < len(instr.operands) else []
  if instr.opcode != "call":
    return []
  out = []
  for called in instr.calls:
    comp = module.computations.get(called)
    root = comp.root if comp is not None else None
    if root is not None and root.opcode == "tuple" and k < len(root.operands):
      out.append(root.operands[k])
    elif root is not None:  # a loop or call returned whole: its element k
      out.append(f"{root.name}#{k}")
  return out


def value_names(module: _hlo.Module, name: str) -> set[str]:
  """The names XLA's buffer assignment may give the value of instruction `name`: its own, and
  through tuple elements (a `get-tuple-element`, or an operand XLA 0.12's dump spells `while.2#0`),
  bitcasts and copies the value it forwards (`while.2{0}`)."""
  found: set = set()
  todo = [(name, 0)]
  while todo:
    name, depth = todo.pop()
    found.update((name, name + "{}"))
    base, k = _hlo.tuple_element(name)
    if k is not None:
      found.add(f"{base}{{{k}}}")
      todo += [(n, depth + 1) for n in _element(module, base, k)]
    instr = module.find(name)
    if instr is None or depth >= _DEPTH or not instr.operands:
      continue
    if instr.opcode == "get-tuple-element" and instr.index is not None:
      source = instr.operands[0]
      found.add(f"{source}{{{instr.index}}}")
      todo += [(n, depth + 1) for n in _element(module, source, instr.index)]
    elif instr.opcode in ("bitcast", "copy", "reshape"):
      todo.append((instr.operands[0], depth + 1))
  return found


def middle(text: str, width: int) -> str:
  """`text` cut in the middle to `width` characters: its head and its leaf stay."""
  if len(text) <= width:
    return text
  head = max((width - 1) // 2, 1)
  return text[:head] + "…" + text[len(text) - max(width - 1 - head, 1) :]


def layer_scope(scope: str) -> str:
  """A name stack without its transformations (`jit(f)`, `jvp(GPT)`) and its primitive."""
  parts = [s for s in scope.split("/") if "(" not in s]
  return "/".join(parts[:-1] if len(parts) > 1 else parts)
