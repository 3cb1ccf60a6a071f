"""Where the annotated values landed in the compiled program, and the collective memory it takes.

``placement_report(compiled_hlo_text, comm_buffers)`` reads the compiled HLO structurally
(``donate._xla.hlo``): every collective, the memory space of each operand, and whether the operand
comes from a value the user annotated (the producing op carries ``donate.symmetric`` in its
frontend attributes, which XLA keeps on the op and on the fusion that absorbs it). Each annotated
buffer gets a record: "collective memory S(n)" or "default memory" with the reason; un-annotated
collectives that were placed are listed with the reason too.
"""

from __future__ import annotations

import dataclasses
import warnings

from donate._base.errors import DonationError, SymmetricMemoryWarning, message
from donate._symm.xla import (
  KIND_OF_PRIMITIVE,
  MODE_OPTIONS,
  SYMMETRIC,
  process_spec,
  spec_supported,
)
from donate._xla import hlo as _hlo

_THROUGH = ("bitcast", "copy", "reshape", "get-tuple-element", "tuple", "optimization-barrier")
_DTYPES = {
  "float32": "f32",
  "float16": "f16",
  "bfloat16": "bf16",
  "float64": "f64",
  "int32": "s32",
  "int64": "s64",
  "int8": "s8",
  "uint8": "u8",
  "uint32": "u32",
  "bool": "pred",
  "int16": "s16",
  "uint16": "u16",
}


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveUse:
  """One collective of the compiled program and its first operand."""

  instruction: str
  kind: str
  memory_space: int
  annotated: bool
  dtype: str
  nbytes: int
  mode: str
  op_name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
  """Where one value landed: ``memory_space`` 0 is default memory, n > 0 collective memory S(n)."""

  value: str
  kind: str
  instruction: str
  memory_space: int
  reason: str

  @property
  def placed(self) -> bool:
    return self.memory_space > 0

  @property
  def where(self) -> str:
    return f"collective memory S({self.memory_space})" if self.placed else "default memory"

  def __str__(self) -> str:
    at = f" ({self.kind} {self.instruction})" if self.instruction else ""
    return f"{self.value}{at}: {self.where}; {self.reason}"


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementReport:
  """Per annotated value (``records``) and per un-annotated placed collective (``also_placed``)."""

  records: tuple[Placement, ...]
  also_placed: tuple[Placement, ...]
  collectives: tuple[CollectiveUse, ...]

  @property
  def missing(self) -> tuple[Placement, ...]:
    """Annotated values that did not land in collective memory."""
    return tuple(r for r in self.records if not r.placed)

  def check(self, *, strict: bool = False) -> PlacementReport:
    """Warns (``SymmetricMemoryWarning``) or, if ``strict``, raises for each missing placement."""
    if self.missing and strict:
      raise DonationError(
        message(
          "requested symmetric placement did not happen",
          expected="every annotated value in collective memory",
          got="; ".join(str(r) for r in self.missing),
          fix="compile with donate.symm.compile_options_for(...) (or donate.symm.configure "
          "before JAX starts), or pass strict=False to get a warning",
        )
      )
    for r in self.missing:
      warnings.warn(
        f"donate: requested symmetric placement did not happen: {r}",
        SymmetricMemoryWarning,
        stacklevel=2,
      )
    return self

  def __str__(self) -> str:
    lines = [
      f"PlacementReport: {sum(r.placed for r in self.records)} of {len(self.records)} "
      "annotated values in collective memory"
    ]
    lines += [f"  {r}" for r in self.records]
    if self.also_placed:
      lines.append(f"  un-annotated collectives placed too: {len(self.also_placed)}")
      lines += [f"    {r}" for r in self.also_placed]
    return "\n".join(lines)


def _marked(
  module,
  name: str,
  index: int | None = None,
  comp: str | None = None,
  fusions: tuple = (),
  depth: int = 0,
) -> bool:
  """True if the value ``name`` (tuple element ``index``) comes from an annotated op.

  Follows views, copies, tuples and concatenates (XLA's all-reduce combiner concatenates the
  operands it merges) back through fusions: into a fusion's root, and from a fused parameter out
  to the fusion's operand.
  """
  ins = module.find(name, comp)
  if ins is None or depth > 200:
    return False
  comp = (
    module.computation_of(name)
    if comp is None or name not in module.computations.get(comp, {})
    else comp
  )
  if "donate.symmetric" in ins.frontend and (index is None or _result_marked(ins, index)):
    return True

  def follow(n, i=None, c=comp, f=fusions):
    return _marked(module, n, i, c, f, depth + 1)

  if ins.opcode == "parameter" and fusions and ins.parameter_number is not None:
    outer, outer_comp = fusions[-1]
    if ins.parameter_number < len(outer.operands):
      return follow(outer.operands[ins.parameter_number], None, outer_comp, fusions[:-1])
    return False
  if ins.opcode == "get-tuple-element" and ins.operands:
    return follow(ins.operands[0], ins.index)
  if ins.opcode == "tuple" and index is not None and index < len(ins.operands):
    return follow(ins.operands[index])
  if ins.opcode == "concatenate" or (ins.opcode == "tuple" and index is None):
    return any(follow(op) for op in ins.operands)
  if ins.opcode in _THROUGH and ins.operands:
    return follow(ins.operands[0], index)
  if ins.opcode == "fusion" and ins.calls:
    root = module.root(ins.calls[0])
    return root is not None and follow(root.name, index, ins.calls[0], fusions + ((ins, comp),))
  return False


def _result_marked(ins, index: int) -> bool:
  results = ins.frontend.get("donate.results", "")
  return not results or str(index) in results.replace(";", ",").split(",")


def collectives(module) -> tuple[CollectiveUse, ...]:
  """Every collective of the entry computation (and its callees), with its first operand's facts."""
  out = []
  for ins in module.instructions():
    kind = ins.collective_kind
    if kind is None or not ins.operands:
      continue
    operand = module.find(ins.operands[0])
    leaf = operand.leaves[0] if operand is not None and operand.leaves else None
    space = leaf.memory_space if leaf is not None else 0
    out.append(
      CollectiveUse(
        ins.name,
        kind,
        0 if space == _hlo.HOST_MEMORY_SPACE else space,
        any(_marked(module, op) for op in ins.operands),
        leaf.dtype if leaf else "",
        sum(
          module.find(op).leaves[0].nbytes
          for op in ins.operands
          if module.find(op) is not None and module.find(op).leaves
        ),
        ins.collectives_mode,
        ins.metadata_op,
      )
    )
  return tuple(out)


def _why_placed(use: CollectiveUse) -> str:
  if use.mode == SYMMETRIC:
    return (
      f"{MODE_OPTIONS.get(use.kind, 'the mode option')}={SYMMETRIC} places every "
      f"{use.kind} of the program"
    )
  matching = [str(e) for e in process_spec() if e.matches(use.kind, use.nbytes, use.dtype)]
  if matching:
    return f"the process-wide spec {','.join(matching)} matches it (op, size, dtype)"
  return "xla_gpu_enable_nccl_user_buffers places every collective's buffers"


def _why_not(use: CollectiveUse | None, placed_any: bool) -> str:
  if use is None:
    return (
      "no collective in the compiled program reads it (XLA removed or merged the "
      "collective, e.g. over a group of one device)"
    )
  if placed_any and use.kind not in MODE_OPTIONS:
    return f"{use.kind} has no per-compile mode and no process-wide spec entry selects it"
  spec = [e for e in process_spec() if e.kind == use.kind]
  if spec and not any(e.matches(use.kind, use.nbytes, use.dtype) for e in spec):
    return (
      f"the process-wide spec {','.join(map(str, spec))} does not match its size or dtype "
      f"({use.nbytes} B, {use.dtype})"
    )
  if spec:
    return (
      f"the process-wide spec {','.join(map(str, spec))} matches it but XLA did not read it:"
      " XLA_FLAGS was set after JAX started its backends (use donate.symm.configure)"
    )
  hint = " (jaxlib >= 0.12: donate.symm.configure before JAX starts)" if spec_supported() else ""
  return f"no collective-memory option was on for this compile{hint}"


def _value_label(buf) -> str:
  shape = ",".join(str(d) for d in getattr(buf, "shape", ()))
  return f"{getattr(buf, 'producer', '?')} output {getattr(buf, 'dtype', '')}[{shape}]"


def _match(buf, uses, taken) -> CollectiveUse | None:
  """The compiled collective that reads ``buf``: same kind, annotated operand; an untaken one of
  the same dtype and size first, else any (XLA's combiner merges several into one)."""
  kinds = {KIND_OF_PRIMITIVE.get(c) for c in getattr(buf, "collectives", ())}
  dtype = _DTYPES.get(str(getattr(buf, "dtype", "")), str(getattr(buf, "dtype", "")))
  ranked = [u for u in uses if u.annotated and u.kind in kinds]
  exact = [
    u
    for u in ranked
    if u.instruction not in taken and u.dtype == dtype and u.nbytes == getattr(buf, "nbytes", -1)
  ]
  return (exact or ranked or [None])[0]


def placement_report(compiled_hlo_text: str, comm_buffers) -> PlacementReport:
  """Reads where each annotated value landed in the compiled program.

  Args:
    compiled_hlo_text: ``Compiled.as_text()`` of the program (for a GPU target).
    comm_buffers: the program's comm buffers (``donate.symm.comm_buffers``), in program order.

  Returns:
    A ``PlacementReport``: one ``Placement`` per comm buffer that feeds a collective (matched to
    the compiled collective by kind, dtype and size among those whose operand carries the
    annotation), and the un-annotated collectives that were placed too, each with its reason.

  >>> import jax, jax.numpy as jnp, numpy as np, donate
  >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("i",))
  >>> f = jax.shard_map(lambda v: jax.lax.psum(donate.with_symmetric(jnp.sin(v), "i"), "i"),
  ...                   mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P())
  >>> x = jnp.ones(4)
  >>> bufs = donate.symm.comm_buffers(jax.make_jaxpr(f)(x))
  >>> print(placement_report(jax.jit(f).lower(x).compile().as_text(), bufs))  # a CPU program
  PlacementReport: 0 of 1 annotated values in collective memory
    sin output float32[2] (all-reduce ...): default memory; no collective-memory option was on ...
  """
  module = _hlo.parse_module(compiled_hlo_text)
  uses = collectives(module)
  placed_any = any(u.memory_space for u in uses)
  records: list[Placement] = []
  taken: set[str] = set()
  for buf in comm_buffers:
    if not getattr(buf, "feeds_collective", True):
      continue
    use = _match(buf, uses, taken)
    if use is not None:
      taken.add(use.instruction)
    space = use.memory_space if use is not None else 0
    reason = _why_placed(use) if use is not None and space else _why_not(use, placed_any)
    records.append(
      Placement(
        _value_label(buf), use.kind if use else "", use.instruction if use else "", space, reason
      )
    )
  also = tuple(
    Placement(
      f"un-annotated {u.dtype} operand ({u.nbytes} B)",
      u.kind,
      u.instruction,
      u.memory_space,
      _why_placed(u),
    )
    for u in uses
    if u.memory_space and not u.annotated
  )
  return PlacementReport(tuple(records), also, uses)
