"""A structural reader of compiled HLO text (`jax.stages.Compiled.as_text()`).

It reads what the copy report needs and nothing more: computations, instructions (name, shape,
opcode, operands, attributes), which instruction calls which computation, the module's
`input_output_alias`, instruction metadata and the source-location tables that newer XLA prints
(`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`, referred to by `stack_frame_id`).

It splits on brackets and quotes, never on one version's spelling: operands may be printed bare
(`%x`) or typed (`f32[8]{0} %x`), metadata may carry `source_file`/`source_line` or a
`stack_frame_id`, `backend_config` may be JSON or a quoted JSON string.

>>> m = parse('''HloModule m, input_output_alias={ {0}: (1, {}, may-alias) }
...
... ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4]) {
...   %a = f32[4]{0} parameter(0)
...   %b = f32[4]{0} parameter(1)
...   %c = f32[4]{0} copy(f32[4]{0} %b), metadata={op_name="x" source_file="f.py" source_line=3}
...   ROOT %t = (f32[4]{0}) tuple(%c)
... }''')
>>> c = m.entry.get("c")
>>> c.opcode, c.operands, c.shape.nbytes, m.source(c), m.aliases
('copy', ('b',), 16, 'f.py:3', {1: (0,)})
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re

_ITEMSIZE = {
    "pred": 1, "s2": 1, "u2": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
    "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
    "token": 0, "opaque": 0,
}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_OPENERS, _CLOSERS = "({[", ")}]"
_CALLS = re.compile(r"(?<![\w.])([a-z_]+)=(%[\w.\-]+|\{%[^}]*\})")
_NESTED = re.compile(r'["({\[]')
_COMMENT = re.compile(r"/\*.*?\*/")


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
  """An array shape (`dtype`, `dims`) or a tuple of shapes (`elements`)."""
  dtype: str | None
  dims: tuple[int, ...] = ()
  elements: tuple["Shape", ...] | None = None
  layout: str | None = None  # e.g. "{1,0}", when printed

  @property
  def nbytes(self) -> int:
    if self.elements is not None:
      return sum(e.nbytes for e in self.elements)
    size = _ITEMSIZE.get(self.dtype, 1 if self.dtype and self.dtype.startswith("f8") else 0)
    return size * math.prod(self.dims)

  def element(self, index: int) -> "Shape":
    return self.elements[index] if self.elements is not None else self

  def __str__(self) -> str:
    if self.elements is not None:
      return "(" + ", ".join(map(str, self.elements)) + ")"
    return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(slots=True, eq=False)
class Instruction:
  """One HLO instruction; `position` is its place in its computation (the schedule order).

  Attributes are kept as text (`attrs_text`) and read on demand by `attr`, so that parsing a
  large module touches only what the copy report asks for.
  """
  name: str
  shape: Shape
  opcode: str
  operands: tuple[str, ...]
  inside: str  # the text between the opcode's parentheses
  attrs_text: str
  position: int
  computation: str
  is_root: bool = False

  def attr(self, key: str) -> str | None:
    """The text of attribute `key` (`index`, `calls`, `metadata`, ...), or None."""
    text = self.attrs_text
    k = text.find(f" {key}=")
    while k >= 0 and text[k - 1] != ",":
      k = text.find(f" {key}=", k + 1)
    if k < 0:
      return None
    start = k + len(key) + 2
    if start < len(text) and text[start] in '{(["':
      return text[start:_close(text, start)]
    end = text.find(",", start)
    return text[start:end if end >= 0 else len(text)].strip()

  def metadata(self) -> dict[str, str]:
    return _fields(self.attr("metadata") or "")

  def called(self) -> list[tuple[str, str]]:
    """(attribute, computation name) for every computation this instruction calls."""
    return [(key, name.strip().lstrip("%")) for key, value in _CALLS.findall(self.attrs_text)
            for name in value.strip("{}").split(",")]

  def parameter_number(self) -> int | None:
    return int(self.inside) if self.opcode == "parameter" else None

  def trip_count(self) -> int | None:
    """A while loop's known trip count from its `backend_config`, if XLA recorded one."""
    config = self.attr("backend_config")
    if not config:
      return None
    try:
      value = json.loads(config)
      if isinstance(value, str):
        value = json.loads(value)
      return int(value["known_trip_count"]["n"])
    except (ValueError, KeyError, TypeError):
      return None


@dataclasses.dataclass(slots=True, eq=False)
class Computation:
  name: str
  is_entry: bool
  instructions: list[Instruction]
  by_name: dict[str, Instruction]

  def get(self, name: str) -> Instruction | None:
    return self.by_name.get(name)

  @property
  def root(self) -> Instruction:
    return next((i for i in self.instructions if i.is_root), self.instructions[-1])

  def parameter(self, number: int) -> Instruction | None:
    return next((i for i in self.instructions if i.opcode == "parameter"
                 and i.parameter_number() == number), None)


@dataclasses.dataclass(slots=True, eq=False)
class Module:
  """A parsed HLO module: computations, the entry, aliases and source locations."""
  name: str
  computations: dict[str, Computation]
  entry: Computation
  aliases: dict[int, tuple[int, ...]]  # entry parameter -> output index it aliases
  locations: dict[int, str]  # FileLocations id -> "file:line (function)"
  frames: dict[int, int]  # StackFrames id -> FileLocations id
  callers: dict[str, list[tuple[Instruction, str]]]  # computation -> (calling instruction, attribute)

  def source(self, instr: Instruction) -> str | None:
    """The user's source line of an instruction, "file:line (function)", or None."""
    meta = instr.metadata()
    if "source_file" in meta and "source_line" in meta:
      return f"{meta['source_file']}:{meta['source_line']}"
    frame = meta.get("stack_frame_id")
    if frame is not None and frame.isdigit():
      return self.locations.get(self.frames.get(int(frame), -1))
    return None

  def users(self, comp: Computation) -> dict[str, list[tuple[Instruction, int]]]:
    """For each instruction name in `comp`, the (user, operand index) pairs that read it."""
    out: dict[str, list[tuple[Instruction, int]]] = {}
    for instr in comp.instructions:
      for k, name in enumerate(instr.operands):
        out.setdefault(name, []).append((instr, k))
    return out


def _outside(text: str, start: int = 0):
  """Yields (index, character, bracket depth after it) for every character outside quotes."""
  depth, quoted, escaped = 0, False, False
  for k in range(start, len(text)):
    ch = text[k]
    if quoted:
      escaped, quoted = (False, True) if escaped else (ch == "\\", ch != '"')
      continue
    if ch == '"':
      quoted = True
      continue
    if ch in _OPENERS:
      depth += 1
    elif ch in _CLOSERS:
      depth -= 1
    yield k, ch, depth


def split_top(text: str, sep: str = ",") -> list[str]:
  """Splits `text` at `sep` outside brackets and quotes."""
  if not _NESTED.search(text):
    return text.split(sep)
  parts, start = [], 0
  for k, ch, depth in _outside(text):
    if ch == sep and depth == 0:
      parts.append(text[start:k])
      start = k + 1
  parts.append(text[start:])
  return parts


def _close(text: str, start: int) -> int:
  """Index just past the bracket that closes the one at `start`."""
  for k, ch, depth in _outside(text, start):
    if depth == 0 and ch in _CLOSERS:
      return k + 1
  return len(text)


def _fields(text: str) -> dict[str, str]:
  """`{a="x y" b=3}` -> {"a": "x y", "b": "3"} (metadata and table entries)."""
  out = {}
  for part in split_top(text.strip().strip("{}"), " "):
    key, eq, value = part.partition("=")
    if eq:
      out[key.strip()] = value.strip().strip('"')
  return out


@functools.lru_cache(maxsize=4096)
def parse_shape(text: str) -> Shape:
  """Parses `f32[8,128]{1,0}` or a tuple `(s32[], f32[8]{0})`; shapes repeat, so it caches."""
  text = text.strip()
  if text.startswith("("):
    inner = text[1:_close(text, 0) - 1]
    return Shape(None, (), tuple(parse_shape(p) for p in split_top(inner) if p.strip()))
  m = _ARRAY.match(text)
  if m is None:
    return Shape(text.split("[")[0] or None)
  dims = tuple(int(d.strip().lstrip("<=")) for d in m.group(2).split(",") if d.strip())
  rest = text[m.end():]
  return Shape(m.group(1), dims, None, rest[:_close(rest, 0)] if rest.startswith("{") else None)


def _operand_name(text: str) -> str:
  text = text.strip()
  if text.startswith("%") and " " not in text:
    return text[1:]
  tokens = text.split()
  named = [t for t in tokens if t.startswith("%")]
  return (named[-1] if named else (tokens[-1] if tokens else "")).lstrip("%")


def _instruction(line: str, position: int, computation: str) -> Instruction | None:
  if "/*" in line:
    line = _COMMENT.sub("", line)
  line = line.strip()
  is_root = line.startswith("ROOT ")
  if is_root:
    line = line[5:]
  name, eq, rest = line.partition(" = ")
  if not eq:
    return None
  end = _close(rest, 0) if rest.startswith("(") else rest.find(" ")
  shape, rest = parse_shape(rest[:end]), rest[end:].lstrip()
  open_at = rest.find("(")
  close_at = rest.find(")", open_at) + 1
  if _NESTED.search(rest, open_at + 1, close_at - 1):
    close_at = _close(rest, open_at)
  opcode, inside = rest[:open_at].strip(), rest[open_at + 1:close_at - 1].strip()
  operands = () if opcode in ("parameter", "constant", "iota") or not inside else tuple(
      _operand_name(p) for p in split_top(inside))
  return Instruction(name.strip().lstrip("%"), shape, opcode, operands, inside,
                     rest[close_at:], position, computation, is_root)


def _aliases(header: str) -> dict[int, tuple[int, ...]]:
  start = header.find("input_output_alias=")
  if start < 0:
    return {}
  start = header.index("{", start)
  body = header[start + 1:_close(header, start) - 1]
  out = {}
  for entry in split_top(body):
    index, colon, target = entry.partition(":")
    if not colon:
      continue
    param = split_top(target.strip().strip("()"))[0]
    out[int(param)] = tuple(int(k) for k in index.strip().strip("{}").split(",") if k.strip())
  return out


def _tables(lines: list[str]) -> tuple[dict[int, str], dict[int, int]]:
  """The FileNames/FunctionNames/FileLocations/StackFrames tables, if the module prints them."""
  tables: dict[str, dict[int, str]] = {}
  current = None
  for line in lines:
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      current = tables.setdefault(line, {})
    elif not line.strip() or line.startswith(("%", "ENTRY")):
      current = None
    elif current is not None:
      key, _, value = line.partition(" ")
      if key.isdigit():
        current[int(key)] = value.strip()
  files, funcs = tables.get("FileNames", {}), tables.get("FunctionNames", {})
  locations = {}
  for k, text in tables.get("FileLocations", {}).items():
    f = _fields(text)
    where = f"{files.get(int(f.get('file_name_id', 0)), '?').strip(chr(34))}:{f.get('line', '?')}"
    func = funcs.get(int(f.get("function_name_id", 0)))
    locations[k] = where + (f" ({func.strip(chr(34))})" if func else "")
  frames = {k: int(_fields(t).get("file_location_id", -1))
            for k, t in tables.get("StackFrames", {}).items()}
  return locations, frames


def parse(text: str) -> Module:
  """Parses the text of a compiled HLO module."""
  lines = text.splitlines()
  header = next((ln for ln in lines if ln.startswith("HloModule")), "HloModule ?")
  computations, entry, current = {}, None, None
  for line in lines:
    if current is None:
      if line.endswith("{") and (line.startswith("%") or line.startswith("ENTRY")):
        is_entry = line.startswith("ENTRY")
        name = line.split()[1 if is_entry else 0].lstrip("%")
        current = Computation(name, is_entry, [], {})
        computations[name] = current
        entry = current if is_entry else entry
    elif line.startswith("}"):
      current = None
    else:
      instr = _instruction(line, len(current.instructions), current.name)
      if instr is not None:
        current.instructions.append(instr)
        current.by_name[instr.name] = instr
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  callers: dict[str, list] = {}
  for comp in computations.values():
    for instr in comp.instructions:
      for attr, called in instr.called():
        if called in computations:
          callers.setdefault(called, []).append((instr, attr))
  locations, frames = _tables(lines)
  return Module(header.split()[1].rstrip(","), computations, entry, _aliases(header), locations,
                frames, callers)
