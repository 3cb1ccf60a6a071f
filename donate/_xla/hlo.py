"""A structural reader of compiled HLO text (`jax.stages.Compiled.as_text()`).

One parser for every reader of the compiled program (the copy report, the memory profile, the
symmetric-memory checks). `parse_module` returns computations of instructions (name, shape with
each array's memory space, opcode, operands, called computations), the `input_output_alias`, and
the source-location tables newer XLA prints (`FileNames`, `FunctionNames`, `FileLocations`,
`StackFrames`, by `stack_frame_id`). Attributes (`metadata`, `backend_config`, ...) stay text
until read. It splits on brackets and quotes, never on one version's spelling: names with or
without `%`, operands bare or typed (`f32[8]{0} %x`), metadata with `source_file`/`source_line`
or a `stack_frame_id`, `backend_config` as JSON or a quoted JSON string. jaxlib 0.10 names
collectives after their opcode (`%all-reduce-start` ... `-done`) and colours collective memory
`S(1)`; jaxlib 0.12 names them after JAX ops (`%psum.7.2`), prints a synchronous `all-reduce` and
uses `S(7)`; both read alike. Host memory (`S(5)`) is never collective memory. XLA's dump files
(buffer assignment, live ranges) are read by `_hlo_dump`.

>>> m = parse_module('''HloModule m, input_output_alias={ {0}: (1, {}, may-alias) }
...
... ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4]) {
...   %a = f32[4]{0} parameter(0), frontend_attributes={donate.symmetric="symm_mem"}
...   %b = f32[4]{0} parameter(1)
...   %c = f32[4]{0:S(1)} copy(f32[4] %b), metadata={op_name="x" source_file="f.py" source_line=3}
...   ROOT %t = (f32[4]{0:S(1)}) tuple(%c)
... }''')
>>> c = m.entry.get("c")
>>> c.opcode, c.operands, c.shape.nbytes, c.memory_spaces, m.source(c), m.aliases
('copy', ('b',), 16, (1,), 'f.py:3', {1: (0,)})
>>> m.find("a").frontend, c.metadata_op, m.root("main").name, m.computation_of("c")
({'donate.symmetric': 'symm_mem'}, 'x', 't', 'main')
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re

from donate._xla import frames as _frames

HOST_MEMORY_SPACE = 5
"""XLA's host memory space (`S(5)`, memory kind `pinned_host`): never collective memory."""

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
                    "all-to-all", "ragged-all-to-all")  # fmt: skip
"""The HLO collective opcodes that XLA:GPU can place in collective memory (sync or async form)."""

# fmt: off
_ITEMSIZE = {"pred": 1, "s2": 1, "u2": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
    "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8,
    "c128": 16, "token": 0, "opaque": 0}
# fmt: on
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
_OPENERS, _CLOSERS = "({[", ")}]"
_CALL_CANDIDATES = re.compile(r"(?<![\w.])([a-z_]+)=(%?[\w.\-]+|\{[^{}]*\})")
_NESTED = re.compile(r'["({\[]')
_ALIAS = re.compile(r"\{([^{}]*)\}\s*:\s*\(\s*(\d+)")  # an alias: output index, parameter
_ALIAS_BODY = re.compile(r"\{((?:\s*\{[^{}]*\}\s*:\s*\([^()]*\)\s*,?)*)\s*\}")
_COMMENT = re.compile(r"/\*.*?\*/")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
  """An array shape (`dtype`, `dims`, `layout`) or a tuple of shapes (`elements`)."""

  dtype: str | None
  dims: tuple[int, ...] = ()
  elements: tuple[Shape, ...] | None = None
  layout: str | None = None  # e.g. "{1,0}" or "{0:S(1)}", when printed

  @property
  def nbytes(self) -> int:
    if self.elements is not None:
      return sum(e.nbytes for e in self.elements)
    size = _ITEMSIZE.get(self.dtype or "", 1 if self.dtype and self.dtype.startswith("f8") else 0)
    return size * math.prod(self.dims)

  @property
  def memory_space(self) -> int:
    """The array's memory space (`S(n)` in its layout); 0, the default, when none is printed."""
    found = _MEMORY_SPACE.search(self.layout or "")
    return int(found.group(1)) if found else 0

  @property
  def leaves(self) -> tuple[Shape, ...]:
    """The arrays of the shape, nested tuples flattened in order."""
    if self.elements is None:
      return (self,)
    return tuple(leaf for e in self.elements for leaf in e.leaves)

  def element(self, index: int) -> Shape:
    return self.elements[index] if self.elements is not None else self

  def __str__(self) -> str:
    if self.elements is not None:
      return "(" + ", ".join(map(str, self.elements)) + ")"
    return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(slots=True, eq=False)
class Instruction:
  """One HLO instruction; `position` is its place in its computation (the schedule order).

  Attributes are kept as text (`attrs_text`) and read on demand by `attr`, so that parsing a
  large module touches only what its reader asks for. `called` is filled in by `parse_module`:
  (attribute, computation) for every computation the instruction calls (`calls`, `to_apply`,
  `body`, `condition`, `branch_computations`, ...).
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
  called: tuple[tuple[str, str], ...] = ()

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
      return text[start : _close(text, start)]
    end = text.find(",", start)
    return text[start : end if end >= 0 else len(text)].strip()

  def metadata(self) -> dict[str, str]:
    return _fields(self.attr("metadata") or "")

  def backend_config(self) -> dict:
    """The `backend_config` JSON (printed bare or as a quoted string), or {}."""
    config = self.attr("backend_config")
    try:
      value = json.loads(config) if config else {}
      value = json.loads(value) if isinstance(value, str) else value
    except ValueError:
      return {}
    return value if isinstance(value, dict) else {}

  @property
  def calls(self) -> tuple[str, ...]:
    """The computations this instruction calls, in the order printed."""
    return tuple(name for _, name in self.called)

  @property
  def parameter_number(self) -> int | None:
    return int(self.inside) if self.opcode == "parameter" and self.inside.isdigit() else None

  @property
  def index(self) -> int | None:
    """A `get-tuple-element`'s tuple index."""
    text = self.attr("index")
    return int(text) if text and text.isdigit() else None

  @property
  def frontend(self) -> dict[str, str]:
    """The `frontend_attributes` (e.g. `donate.symmetric`), as a dict of strings."""
    return _fields(self.attr("frontend_attributes") or "")

  @property
  def metadata_op(self) -> str:
    return self.metadata().get("op_name", "")

  @property
  def leaves(self) -> tuple[Shape, ...]:
    return self.shape.leaves

  @property
  def memory_spaces(self) -> tuple[int, ...]:
    return tuple(leaf.memory_space for leaf in self.shape.leaves)

  @property
  def collective_kind(self) -> str | None:
    """The collective this instruction starts or is (`all-reduce`, ...), or None."""
    base = self.opcode.removesuffix("-start")
    return base if base in COLLECTIVE_KINDS else None

  @property
  def collectives_mode(self) -> str:
    """The collective's `collectives_mode` in its backend config ("" when none is printed)."""
    config = self.backend_config()
    return str(config.get("collective_backend_config", config).get("collectives_mode", ""))

  def trip_count(self) -> int | None:
    """A while loop's known trip count from its `backend_config`, if XLA recorded one."""
    try:
      return int(self.backend_config()["known_trip_count"]["n"])
    except (ValueError, KeyError, TypeError):
      return None


@dataclasses.dataclass(slots=True, eq=False)
class Computation:
  """One computation (the entry, a loop body, a fusion's kernel, ...): its instructions in order."""

  name: str
  is_entry: bool
  instructions: list[Instruction]
  by_name: dict[str, Instruction]

  def get(self, name: str) -> Instruction | None:
    return self.by_name.get(name)

  def __contains__(self, name: str) -> bool:
    return name in self.by_name

  @property
  def root(self) -> Instruction | None:
    return next(
      (i for i in self.instructions if i.is_root),
      self.instructions[-1] if self.instructions else None,
    )

  def parameter(self, number: int) -> Instruction | None:
    return next((i for i in self.instructions if i.parameter_number == number), None)


@dataclasses.dataclass(slots=True, eq=False)
class Module:
  """A parsed HLO module: computations, the entry, aliases and source locations."""

  name: str
  computations: dict[str, Computation]
  entry: Computation
  aliases: dict[int, tuple[int, ...]]  # entry parameter -> output index it aliases
  locations: dict[int, str]  # FileLocations id -> "file:line (function)"
  frames: dict[int, int]  # StackFrames id -> FileLocations id
  callers: dict[str, list[tuple[Instruction, str]]]  # computation -> (caller, attribute)
  by_name: dict[str, Instruction]  # every instruction by name (names are unique in a module)
  # StackFrames id -> FileLocations id of its innermost frame, where that is a library's
  libraries: dict[int, int] = dataclasses.field(default_factory=dict)

  def source(self, instr: Instruction) -> str | None:
    """The user's source line of an instruction, "file:line (function)", or None."""
    meta = instr.metadata()
    if "source_file" in meta and "source_line" in meta:
      return f"{meta['source_file']}:{meta['source_line']}"
    return self._frame_line(meta, self.frames)

  def library_source(self, instr: Instruction) -> str | None:
    """The installed package's line of an instruction's innermost frame, or None."""
    return self._frame_line(instr.metadata(), self.libraries)

  def _frame_line(self, meta: dict, table: dict[int, int]) -> str | None:
    frame = meta.get("stack_frame_id")
    return self.locations.get(table.get(int(frame), -1)) if frame and frame.isdigit() else None

  def users(self, comp: Computation) -> dict[str, list[tuple[Instruction, int]]]:
    """For each instruction name in `comp`, the (user, operand index) pairs that read it."""
    out: dict[str, list[tuple[Instruction, int]]] = {}
    for instr in comp.instructions:
      for k, name in enumerate(instr.operands):
        out.setdefault(name, []).append((instr, k))
    return out

  def instructions(self):
    """Every instruction of every computation, computation by computation."""
    for comp in self.computations.values():
      yield from comp.instructions

  def find(self, name: str, computation: str | None = None) -> Instruction | None:
    """The instruction `name`, looked up in `computation` first when given."""
    comp = self.computations.get(computation) if computation is not None else None
    return (comp.get(name) if comp is not None else None) or self.by_name.get(name)

  def computation_of(self, name: str) -> str | None:
    instr = self.by_name.get(name)
    return instr.computation if instr is not None else None

  def root(self, computation: str) -> Instruction | None:
    comp = self.computations.get(computation)
    return comp.root if comp is not None else None


def collective_memory_spaces(module: Module) -> frozenset[int]:
  """The non-default, non-host memory spaces that collectives' buffers are in (`{1}`, `{7}`)."""
  spaces: set[int] = set()
  for instr in module.instructions():
    if instr.collective_kind or instr.opcode.endswith("-done"):
      spaces.update(s for s in instr.memory_spaces if s not in (0, HOST_MEMORY_SPACE))
  return frozenset(spaces)


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
  """Index just past the bracket (or quote) that closes the one at `start`."""
  if text[start] == '"':
    return next((k for k, _, _ in _outside(text, start)), len(text))  # the first after it
  for k, ch, depth in _outside(text, start):
    if depth == 0 and ch in _CLOSERS:
      return k + 1
  return len(text)


def _fields(text: str) -> dict[str, str]:
  """`{a="x y" b=3}` or `{a="x",b="y"}` -> {"a": ..., "b": ...} (metadata, frontend attributes)."""
  out = {}
  for item in split_top(text.strip().removeprefix("{").removesuffix("}")):
    for part in split_top(item, " "):
      key, eq, value = part.partition("=")
      if eq:
        out[key.strip()] = value.strip().strip('"')
  return out


@functools.lru_cache(maxsize=4096)
def parse_shape(text: str) -> Shape:
  """Parses `f32[8,128]{1,0}` or a tuple `(s32[], f32[8]{0:S(1)})`; shapes repeat, so it caches."""
  text = text.strip()
  if text.startswith("("):
    inner = text[1 : _close(text, 0) - 1]
    return Shape(None, (), tuple(parse_shape(p) for p in split_top(inner) if p.strip()))
  m = _ARRAY.match(text)
  if m is None:
    return Shape(text.split("[")[0] or None)
  dims = tuple(int(d.strip().lstrip("<=")) for d in m.group(2).split(",") if d.strip())
  rest = text[m.end() :]
  return Shape(m.group(1), dims, None, rest[: _close(rest, 0)] if rest.startswith("{") else None)


def tuple_element(name: str) -> tuple[str, int | None]:
  """`(instruction, k)` for an operand that names element `k` of a tuple-shaped value, as XLA
  0.12's dumped modules spell it in place of a `get-tuple-element` (`while.1#2`); `(name, None)`
  for any other operand.

  >>> tuple_element("while.1#2"), tuple_element("add.3")
  (('while.1', 2), ('add.3', None))
  """
  base, sep, k = name.rpartition("#")
  return (base, int(k)) if sep and base and k.isdigit() else (name, None)


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
  opcode, inside = rest[:open_at].strip(), rest[open_at + 1 : close_at - 1].strip()
  operands: tuple[str, ...] = ()
  if opcode not in ("parameter", "constant", "iota") and inside:
    operands = tuple(_operand_name(p) for p in split_top(inside))
  name, tail = name.strip().lstrip("%"), rest[close_at:]
  return Instruction(name, shape, opcode, operands, inside, tail, position, computation, is_root)


def input_output_aliases(text: str) -> dict[int, tuple[int, ...]]:
  """`parse_module(text).aliases`, read from the module's header line alone (every compile
  reads it; parsing the whole module would cost more)."""
  start = max(text.find("HloModule"), 0)
  end = text.find("\n", start)
  return _aliases(text[start : end if end >= 0 else len(text)])


def _aliases(header: str) -> dict[int, tuple[int, ...]]:
  start = header.find("input_output_alias=")
  if start < 0:
    return {}
  start = header.index("{", start)
  whole = _ALIAS_BODY.match(header, start)  # `{ {output index}: (parameter, {...}, kind), ... }`
  body = whole.group(1) if whole else header[start + 1 : _close(header, start) - 1]
  return {int(p): tuple(int(k) for k in i.split(",") if k.strip()) for i, p in _ALIAS.findall(body)}


def _tables(lines: list[str]) -> tuple[dict[int, str], dict[int, int], dict[int, int]]:
  """The FileNames/FunctionNames/FileLocations/StackFrames tables, if the module prints them."""
  tables: dict[str, dict[int, str]] = {}
  current = None
  for line in lines:
    if line in _TABLES:
      current = tables.setdefault(line, {})
    elif not line.strip() or line.endswith("{"):
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
  stack = tables.get("StackFrames", {})
  return locations, _frames.user_frames(stack, locations), _frames.library_frames(stack, locations)


def _computations(lines: list[str]) -> dict[str, Computation]:
  """Each `[ENTRY] [%]name (params) -> shape {` ... `}` block: a computation of instructions."""
  computations, current = {}, None
  for line in lines:
    if current is None:
      if (
        line.rstrip().endswith("{")
        and line[:1] not in ("", " ", "\t")
        and " -> " in line
        and not line.startswith("HloModule")
      ):
        name = line.split("(")[0].split()[-1].lstrip("%")
        current = Computation(name, line.startswith("ENTRY"), [], {})
        computations[name] = current
    elif line.startswith("}"):
      current = None
    elif line.startswith((" ", "\t")):
      instr = _instruction(line, len(current.instructions), current.name)
      if instr is not None:
        current.instructions.append(instr)
        current.by_name[instr.name] = instr
  return computations


def _called(attrs_text: str, computations) -> tuple[tuple[str, str], ...]:
  """(attribute, computation) for every attribute value that names computations of the module."""
  return tuple(
    (key, name)
    for key, value in _CALL_CANDIDATES.findall(attrs_text)
    for name in (n.strip().lstrip("%") for n in value.strip("{}").split(","))
    if name in computations
  )


def parse_module(text: str) -> Module:
  """Parses the text of a compiled HLO module."""
  lines = text.splitlines()
  header = next((ln for ln in lines if ln.startswith("HloModule")), "HloModule ?")
  computations = _computations(lines)
  entry = next((c for c in computations.values() if c.is_entry), None)
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  callers: dict[str, list] = {}
  by_name: dict[str, Instruction] = {}
  for comp in computations.values():
    for instr in comp.instructions:
      by_name.setdefault(instr.name, instr)
      instr.called = _called(instr.attrs_text, computations)
      for attr, called in instr.called:
        callers.setdefault(called, []).append((instr, attr))
  locations, frames, libraries = _tables(lines)
  name, aliases = header.split()[1].rstrip(","), _aliases(header)
  return Module(name, computations, entry, aliases, locations, frames, callers, by_name, libraries)
