"""Reading XLA's compiled HLO text and buffer-assignment dumps, structurally.

``parse_module(text)`` turns ``Compiled.as_text()`` into computations of ``Instr`` records (name,
opcode, shape, operands, called computations, frontend attributes, the collective mode in the
backend config, and each array leaf's memory space). It reads what both jaxlib lines print:
jaxlib 0.10 names collectives after their opcode (``%all-reduce-start``) and colours collective
memory ``S(1)``; jaxlib 0.12 names them after JAX ops (``%psum.7.2``), prints a synchronous
``all-reduce`` and uses ``S(7)``. Memory spaces are read from each leaf's layout (``{1,0:S(7)}``);
host memory (``S(5)``) is never collective.

``parse_buffer_assignment(text)`` reads the ``*buffer-assignment.txt`` file that
``xla_dump_to`` writes: one ``Allocation`` per ``allocation N: size S, color C, ...`` block.

>>> m = parse_module('''HloModule m
... ENTRY %main (p: f32[4]) -> f32[4] {
...   %p = f32[4]{0} parameter(0)
...   %s = f32[4]{0:S(1)} sine(%p), frontend_attributes={donate.symmetric="symm_mem"}
...   ROOT %ar = f32[4]{0:S(1)} all-reduce(%s), channel_id=1, to_apply=%add
... }''')
>>> ar = m.entry["ar"]
>>> ar.opcode, ar.operands, ar.memory_spaces, m.entry["s"].frontend["donate.symmetric"]
('all-reduce', ('s',), (1,), 'symm_mem')
"""

from __future__ import annotations

import dataclasses
import re

HOST_MEMORY_SPACE = 5
"""XLA's host memory space (``S(5)``, memory kind ``pinned_host``): never collective memory."""

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
                    "all-to-all", "ragged-all-to-all")
"""The HLO collective opcodes that XLA:GPU can place in collective memory (sync or async form)."""

_LEAF = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\](\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})?")
_HEADER = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_MODE = re.compile(r'"collectives_mode"\s*:\s*"(\w+)"')


@dataclasses.dataclass(frozen=True, slots=True)
class Leaf:
  """One array in an instruction's shape: dtype (HLO spelling), dims, memory space (0 default)."""
  dtype: str
  dims: tuple[int, ...]
  memory_space: int

  @property
  def nbytes(self) -> int:
    size = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
            "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
            "c64": 8, "c128": 16}.get(self.dtype, 0)
    n = 1
    for d in self.dims:
      n *= d
    return n * size


@dataclasses.dataclass(frozen=True, slots=True)
class Instr:
  """One HLO instruction, as printed in the compiled module."""
  name: str
  opcode: str
  leaves: tuple[Leaf, ...]
  tuple_shape: bool
  operands: tuple[str, ...]
  calls: tuple[str, ...]
  index: int | None
  frontend: dict = dataclasses.field(compare=False)
  collectives_mode: str
  metadata_op: str
  root: bool
  parameter_number: int | None = None

  @property
  def memory_spaces(self) -> tuple[int, ...]:
    return tuple(leaf.memory_space for leaf in self.leaves)

  @property
  def collective_kind(self) -> str | None:
    """The collective this instruction starts or is (``all-reduce``, ...), or None."""
    base = re.sub(r"-(start|done)$", "", self.opcode)
    return base if base in COLLECTIVE_KINDS and not self.opcode.endswith("-done") else None


@dataclasses.dataclass(frozen=True, slots=True)
class Module:
  """The computations of a compiled module, by name; ``entry`` is the entry computation."""
  computations: dict
  entry_name: str

  @property
  def entry(self) -> dict:
    return self.computations[self.entry_name]

  def instructions(self):
    for comp in self.computations.values():
      yield from comp.values()

  def root(self, computation: str) -> Instr | None:
    return next((i for i in self.computations.get(computation, {}).values() if i.root), None)

  def computation_of(self, name: str) -> str | None:
    return next((c for c, instrs in self.computations.items() if name in instrs), None)

  def find(self, name: str, computation: str | None = None) -> Instr | None:
    if computation is not None and name in self.computations.get(computation, {}):
      return self.computations[computation][name]
    comp = self.computation_of(name)
    return self.computations[comp][name] if comp is not None else None


def _split_top(text: str, open_ch: str, close_ch: str) -> tuple[str, str]:
  """Splits ``text`` (starting with ``open_ch``) at its matching ``close_ch``: (inside, rest)."""
  depth = 0
  for k, ch in enumerate(text):
    depth += ch == open_ch
    depth -= ch == close_ch
    if depth == 0:
      return text[1:k], text[k + 1:]
  return text[1:], ""


def _leaves(shape: str) -> tuple[Leaf, ...]:
  out = []
  for dtype, dims, layout in _LEAF.findall(shape):
    space = re.search(r"S\((\d+)\)", layout or "")
    out.append(Leaf(dtype, tuple(int(d) for d in dims.split(",") if d),
                    int(space.group(1)) if space else 0))
  return tuple(out)


def _frontend(attrs: str) -> dict:
  at = attrs.find("frontend_attributes=")
  if at < 0:
    return {}
  inside, _ = _split_top(attrs[at + len("frontend_attributes="):], "{", "}")
  return dict(re.findall(r'([\w.\-]+)="([^"]*)"', inside))


def _instr(root: bool, name: str, body: str) -> Instr:
  if body.startswith("("):
    inside, rest = _split_top(body, "(", ")")
    shape, tuple_shape = "(" + inside + ")", True
  else:
    shape, _, rest = body.partition(" ")
    tuple_shape = False
  rest = rest.strip()
  opcode = re.match(r"[\w\-]+", rest).group(0)
  operands, attrs = _split_top(rest[len(opcode):], "(", ")")
  calls = re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", attrs)
  index = re.search(r"\bindex=(\d+)", attrs)
  mode = _MODE.search(attrs)
  op_name = re.search(r'op_name="([^"]*)"', attrs)
  number = int(operands) if opcode == "parameter" and operands.strip().isdigit() else None
  return Instr(name, opcode, _leaves(shape), tuple_shape, tuple(re.findall(r"%([\w.\-]+)",
               operands)), tuple(calls), int(index.group(1)) if index else None,
               _frontend(attrs), mode.group(1) if mode else "", op_name.group(1) if op_name
               else "", root, number)


def parse_module(text: str) -> Module:
  """Parses compiled HLO text (``Compiled.as_text()``) into a ``Module``."""
  comps, current, entry = {}, None, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and " = " not in line.split("(")[0]:
      current = comps.setdefault(header.group(2), {})
      entry = header.group(2) if header.group(1) else entry
      continue
    if line.strip() == "}":
      current = None
      continue
    m = _INSTR.match(line) if current is not None else None
    if m:
      ins = _instr(bool(m.group(1)), m.group(2), m.group(3))
      current[ins.name] = ins
  return Module(comps, entry if entry is not None else next(iter(comps), ""))


def collective_memory_spaces(module: Module) -> frozenset[int]:
  """The non-default, non-host memory spaces that collectives' buffers are in (``{1}``, ``{7}``)."""
  spaces = set()
  for ins in module.instructions():
    if ins.collective_kind or ins.opcode.endswith("-done"):
      spaces.update(s for s in ins.memory_spaces if s not in (0, HOST_MEMORY_SPACE))
  return frozenset(spaces)


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
  """One allocation of XLA's buffer assignment: index, size in bytes, colour, and its values."""
  index: int
  size: int
  color: int
  kind: str
  values: tuple[tuple[str, int, int], ...]  # (value name, size, offset)


def parse_buffer_assignment(text: str) -> tuple[Allocation, ...]:
  """Parses a ``*buffer-assignment.txt`` dump into allocations (colour 0 when none is printed).

  >>> (a,) = parse_buffer_assignment('''BufferAssignment:
  ... allocation 13: size 53248, color 7, page 0, preallocated-temp:
  ...  value: <19 psum.7.2 @7> (size=4096,offset=0): f32[1024]{0:S(7)}''')
  >>> a.size, a.color, a.values
  (53248, 7, (('psum.7.2', 4096, 0),))
  """
  out, head, values = [], None, []

  def flush():
    if head is not None:
      out.append(Allocation(head[0], head[1], head[2], head[3], tuple(values)))

  for line in text.splitlines():
    m = re.match(r"allocation (\d+): size (\d+)(.*):\s*$", line)
    if m:
      flush()
      color = re.search(r"color (\d+)", m.group(3))
      head, values = (int(m.group(1)), int(m.group(2)), int(color.group(1)) if color else 0,
                      m.group(3).strip(", ")), []
      continue
    v = re.match(r"\s*value: <\d+ ([^ >]+)[^>]*> \(size=(\d+),offset=(\d+)\)", line)
    if v and head is not None:
      values.append((v.group(1), int(v.group(2)), int(v.group(3))))
    elif line.strip() and not line.startswith(" ") and head is not None:
      flush()
      head = None
  flush()
  return tuple(out)
