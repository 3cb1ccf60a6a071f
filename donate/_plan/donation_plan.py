"""The donation plan: what every input leaf's buffer becomes, and how it reads.

Pure data (frozen dataclasses): `LeafInfo`/`OutputInfo` are the facts of one traced call,
`LeafDecision` the decision per input leaf, `DonationPlan` the whole plan with its text, HTML and,
after compiling, the aliases XLA really made (`realize`) and its memory figures (`MemoryStats`).
`donate._plan.pairing.make_plan` makes the decisions.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from typing import Any

from donate._base import errors as _errors
from donate._base.records import fast_init
from donate._base.text import format_bytes, is_symbolic, notebook_cell, shape_text, sharding_str
from donate._plan import memory_stats as _memory_stats
from donate._plan.decision_types import Action, Cause, Kind, Request
from donate._plan.memory_stats import MemoryStats
from donate._xla import copies as _copies

# The plain names of the enum members, as earlier versions spelled them (each equals its string).
ALIASED, DONOR, KEPT = Action.ALIASED, Action.DONOR, Action.KEPT
UNUSABLE, UNUSED = Action.UNUSABLE, Action.UNUSED
REF = Action.REF  # the action of a `jax.Ref` leaf; equal to its kind, `Kind.REF`
# The HTML table's row colour of each action.
_COLORS = {
  ALIASED: "#d4f7d4",
  DONOR: "#e8f0ff",
  UNUSED: "#f0f0f0",
  UNUSABLE: "#ffd6d6",
  REF: "#fff3d6",
}
DEVICE, ABSTRACT, HOST = Kind.DEVICE, Kind.ABSTRACT, Kind.HOST

_WIDTH = 100  # the plan's text fits in this many columns


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class LeafInfo:
  """Static facts about one input leaf.

  `kind` is a `Kind`: DEVICE (a `jax.Array`: donating consumes it), ABSTRACT (a
  `jax.ShapeDtypeStruct`: planned as if it were an array), REF (a `jax.Ref`, or a
  `ShapeDtypeStruct(..., is_ref=True)`: the call writes its new value back into its own buffer,
  so it is never donated nor paired) or HOST (numpy arrays, Python and numpy scalars: `jax.jit`
  copies them to the device, so the caller's value is never consumed).

  >>> info = LeafInfo("x", (4,), "float32", 16, "cpu:0", None, Kind.DEVICE, "ArrayImpl")
  >>> info.is_array, info.kind == "device"
  (True, True)
  """

  path: str
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  sharding: str
  memory_kind: str | None
  kind: Kind
  type_name: str
  sharding_obj: Any = dataclasses.field(default=None, compare=False)
  group_kind: str | None = None  # the memory kind jax.jit pairs by (see keys.grouped)
  memory_space: str | None = None  # its type's memory space when not the device's ("Host")

  @property
  def is_array(self) -> bool:
    """A value donation can consume (a `jax.Array` or its abstract stand-in)."""
    return self.kind in (DEVICE, ABSTRACT)


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class OutputInfo:
  """Static facts about one output leaf (`sharding_obj` when `out_shardings` fixes it)."""

  path: str
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  sharding_obj: Any = dataclasses.field(default=None, compare=False)
  group_kind: str | None = None  # the memory kind jax.jit pairs by (see keys.grouped)
  memory_space: str | None = None  # its type's memory space when not the device's ("Host")


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class LeafDecision:
  """What happens to one input leaf.

  Code reads the typed fields (`action`, `cause`, `request`); `reason` and `source` say the same
  in words, for people.

  Attributes:
    info: the leaf's facts (`LeafInfo`); `path` (its pytree path, e.g. `params['w']`), `shape`,
      `dtype`, `nbytes`, `sharding` and `memory_kind` read them.
    request: how donation was asked for (a `Request`: `donate_argnums`, `donate_argnames`, an
      annotation or an inner call), or None: it was not (`requested` is False).
    where: the source line of the annotation or inner call that asked, if any.
    action: an `Action`: ALIASED (output `output` reuses the buffer), DONOR (given to XLA to reuse
      for any output), KEPT (not donated: not requested, or not a device buffer), UNUSED
      (requested, but the computation does not read it: it stays alive, as in `jax.jit`),
      UNUSABLE (requested but nothing can reuse it; it stays alive) or REF (a `jax.Ref`: the call
      writes it back into its own buffer; no output takes that buffer).
    output: the output path that reuses the buffer, if any.
    cause: why, for code (a `Cause`).
    reason: why, in words.

  >>> import jax.numpy as jnp, donate
  >>> f = donate.jit(lambda w, x: w - x, donate_argnums=0)
  >>> d = f.plan(jnp.ones(4), jnp.ones(4)).decisions[0]
  >>> d.path, d.action == "aliased", d.output, d.reason, d.consumed
  ('w', True, 'out', 'elementwise update of this input', True)
  >>> d.cause
  <Cause.ELEMENTWISE_UPDATE: 'elementwise_update'>
  >>> d.request, d.source
  (<Request.DONATE_ARGNUMS: 'donate_argnums'>, 'donate_argnums')
  """

  info: LeafInfo
  request: Request | None
  where: str | None
  action: Action
  output: str | None
  cause: Cause
  reason: str

  @property
  def path(self) -> str:
    """The leaf's pytree path, e.g. `params['w']`."""
    return self.info.path

  @property
  def shape(self) -> tuple[int, ...]:
    """The leaf's shape."""
    return self.info.shape

  @property
  def dtype(self) -> str:
    """The leaf's dtype, by name."""
    return self.info.dtype

  @property
  def nbytes(self) -> int:
    """The leaf's bytes (global array)."""
    return self.info.nbytes

  @property
  def sharding(self) -> str:
    """The leaf's sharding, by a compact name (`cpu:0`, `P('x')`)."""
    return self.info.sharding

  @property
  def memory_kind(self) -> str | None:
    """The memory kind of the leaf's sharding, if any."""
    return self.info.memory_kind

  @property
  def requested(self) -> bool:
    """Donation was asked for (`donate_argnums`/`donate_argnames` or an annotation)."""
    return self.request is not None

  @property
  def source(self) -> str:
    """How donation was asked for, in words ("donate_argnums", "donate_buffer at f.py:3", ...;
    "-": it was not). In a notebook the line names its cell (`In[3]:17`); `where` keeps the file."""
    if self.request is None:
      return "-"
    label = Request(self.request).label
    return f"{label} at {notebook_cell(self.where)}" if self.where else label

  @property
  def consumed(self) -> bool:
    """Whether the caller's array is deleted by the call."""
    return self.action in (ALIASED, DONOR)


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
  """The leaves the compiled program donates: the paired inputs and the buffer donors, in flat
  order. Arguments and results keep the user's order."""

  donated: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class DonationPlan:
  """One decision per input leaf, the alias map, totals, and the compiled memory figures.

  `str(plan)` is a readable table (at most 100 columns); in a notebook the plan renders as HTML.

  >>> import jax.numpy as jnp, donate
  >>> f = donate.jit(lambda a, b: (b.at[0].set(1.0), a + 1.0), donate_argnums=(0, 1))
  >>> plan = f.plan(jnp.zeros(2**16), jnp.zeros(2**16))
  >>> [(d.path, str(d.action), d.output) for d in plan.decisions]
  [('a', 'aliased', 'out[1]'), ('b', 'aliased', 'out[0]')]
  >>> plan.requested_bytes, plan.reused_bytes
  (524288, 524288)
  """

  function: str
  decisions: tuple[LeafDecision, ...]
  outputs: tuple[OutputInfo, ...]
  notes: tuple[str, ...]
  layout: Layout
  memory: MemoryStats | None = None
  compiled: bool = False
  collective_memory_bytes: int = 0  # bytes of values marked for symmetric memory (unpacked)
  copies: tuple | None = ()  # the copies XLA added (`_copies.CopyRecord`); None: not read yet
  copy_threshold: int = 65536  # the smallest copy `copies` reports, in bytes
  placements: Any = None  # where marked values landed on a GPU target (`_symm` report)
  # The compiled program's `donate.MemoryProfile` when `.plan()` read it to check the donations
  # (one more compile, with XLA's dump; None otherwise: `Compiled.memory_profile()` makes one).
  profile: Any = dataclasses.field(default=None, compare=False)

  @property
  def requested_bytes(self) -> int:
    """Bytes of every leaf whose donation was asked for."""
    return sum(d.nbytes for d in self.decisions if d.requested)

  @property
  def reused_bytes(self) -> int:
    """Bytes of donated leaves whose buffer an output really reuses."""
    return sum(d.nbytes for d in self.decisions if d.action == ALIASED)

  @property
  def bytes_requested(self) -> int:
    """The old name of `requested_bytes`."""
    return self.requested_bytes

  @property
  def bytes_reused(self) -> int:
    """The old name of `reused_bytes`."""
    return self.reused_bytes

  @property
  def aliases(self) -> dict[str, str]:
    """The alias map: output path -> input path whose buffer it takes over."""
    return {
      d.output: d.path
      for d in self.decisions
      if d.output is not None and d.action in (ALIASED, DONOR)
    }

  @property
  def unusable(self) -> tuple[LeafDecision, ...]:
    return tuple(d for d in self.decisions if d.action == UNUSABLE)

  def pairs(self) -> dict[int, int]:
    """{input leaf index: output index} of the planned aliases."""
    index = {o.path: j for j, o in enumerate(self.outputs)}
    aliased = [(i, d.output) for i, d in enumerate(self.decisions) if d.action == ALIASED]
    return {i: index[out] for i, out in aliased if out is not None}

  def realize(
    self,
    realized: dict[int, int],
    memory: MemoryStats | None,
    shardings: dict[int, tuple[str, str]] | None = None,
    out_shardings: dict[str, str] | None = None,
  ) -> DonationPlan:
    """Folds in what the compiled program does: realized[leaf index] = output index it aliases.

    A planned alias XLA did not make becomes "unusable" with the reason (`shardings[i]` gives the
    compiled input and output sharding when they differ); a donor XLA reused, or a requested
    leaf planned unusable that the compiled program aliases all the same, becomes "aliased",
    with what differs between it and the output (`out_shardings[path]`: the compiled sharding
    of the output, where known).
    """
    decisions = list(self.decisions)
    shardings = shardings or {}
    for i, d in enumerate(decisions):
      got = realized.get(i)
      got_path = self.outputs[got].path if got is not None else None
      if d.action == ALIASED and got_path != d.output:
        if got_path is not None:
          reason = f"XLA reuses it for {got_path} (planned {d.output})"
          decisions[i] = dataclasses.replace(
            d, output=got_path, cause=Cause.XLA_OTHER_OUTPUT, reason=reason
          )
        else:
          decisions[i] = dataclasses.replace(
            d, action=UNUSABLE, output=None, **_not_made(d.output, shardings.get(i))
          )
      elif d.action == DONOR or (d.action == UNUSABLE and got is not None):
        # (an unusable leaf, always a requested one, that jax.jit's own lowering still offered)
        if got_path and got is not None:
          differs = _differences(d, self.outputs[got], out_shardings)
          reason = f"XLA reuses it for {got_path} ({differs})"
          decisions[i] = dataclasses.replace(
            d, output=got_path, action=ALIASED, cause=Cause.DONOR_REUSED, reason=reason
          )
        else:
          decisions[i] = dataclasses.replace(
            d,
            action=UNUSABLE,
            cause=Cause.DONOR_NOT_REUSED,
            reason="offered to XLA as a donor, but XLA reused it for no output; it stays alive",
          )
    return dataclasses.replace(self, decisions=tuple(decisions), memory=memory, compiled=True)

  def explain_unusable(self, decisions: Sequence[LeafDecision] | None = None) -> str:
    """The per-leaf explanation used in warnings (and, after "donate: ", in strict-mode errors).

    It starts with `jax.jit`'s own sentence, so warning filters written for `jax.jit` match it.
    """
    unusable = self.unusable if decisions is None else tuple(decisions)
    avals = ", ".join(f"{_type(d, shard_shape(d.info))} ({d.path})" for d in unusable)
    lines = [
      f"{_errors.JAX_UNUSABLE_PREFIX} {avals}.",
      f"{self.function}: {len(unusable)} donated buffer(s) cannot be used and stay alive:",
    ]
    lines += [
      f"  {d.path}: {_type(d)}, sharding {d.sharding}, memory kind {d.memory_kind}: {d.reason}"
      for d in unusable
    ]
    lines.append(
      "Fix: return an output of the same shape, dtype and sharding, or leave these "
      "leaves out of donate_argnums."
    )
    return "\n".join(lines)

  def explain_host(self) -> str:
    """The strict-mode error for requested leaves that are not device buffers."""
    host = [d for d in self.decisions if d.requested and d.cause == Cause.NOT_A_DEVICE_BUFFER]
    return "\n".join(
      _errors.message(
        f"{self.function}: strict mode cannot donate a leaf that is not a device buffer "
        f"(asked by {d.source})",
        path=d.path,
        expected="a jax.Array",
        got=d.info.type_name,
        fix="pass an array (jnp.asarray(x)) or leave this argument out of donate_argnums",
      )
      for d in host
    )

  def __str__(self) -> str:
    lines = _wrap(
      [
        f"DonationPlan for {self.function}: {len(self.decisions)} input leaves, "
        f"{len(self.outputs)} outputs"
      ]
    )
    lines += _table(self.decisions)
    lines += _wrap([f"note: {n}" for n in self.notes])
    if self.collective_memory_bytes:
      lines += _wrap(
        [
          f"symmetric memory: {format_bytes(self.collective_memory_bytes)} of marked "
          "buffers (donate.planner.plan_memory packs them into pools)"
        ]
      )
    lines += _wrap([f"totals (global arrays): {self._totals()}"])
    if self.memory is not None:
      lines += _wrap([f"compiled (per device): {_memory_stats.text(self.memory)}"])
    lines += _wrap(_copies.format_copies(self.copies or (), self.copy_threshold), indent="      ")
    if self.placements is not None:
      lines += _wrap(str(self.placements).splitlines(), indent="      ")
    return "\n".join(lines)

  __repr__ = __str__

  def _totals(self) -> str:
    """Bytes requested and reused; with symbolic shapes (`jax.export.symbolic_shape`) these are
    expressions of the dimension variables, and the text says so."""
    text = (
      f"requested {format_bytes(self.requested_bytes)}, reused {format_bytes(self.reused_bytes)}"
    )
    if is_symbolic(self.requested_bytes) or is_symbolic(self.reused_bytes):
      text += " (symbolic: bytes in terms of dimension variables)"
    return text

  def _repr_html_(self) -> str:
    return _html(self)


def _html(plan: DonationPlan) -> str:
  """The plan as an HTML table (what a notebook shows)."""
  esc = html.escape
  head = "".join(
    f"<th>{h}</th>"
    for h in ("input", "type", "bytes", "sharding", "donate", "action", "output", "reason")
  )
  colors = _COLORS
  body = "".join(
    f"<tr style='background:{colors.get(d.action, 'transparent')}'>"
    f"<td><code>{esc(d.path)}</code></td><td>{esc(_type(d))}</td>"
    f"<td>{format_bytes(d.nbytes)}</td><td>{esc(d.sharding)}</td>"
    f"<td>{esc(d.source) if d.requested else '-'}</td>"
    f"<td><b>{d.action}</b></td><td><code>{esc(d.output or '-')}</code></td>"
    f"<td>{esc(d.reason)}</td></tr>"
    for d in plan.decisions
  )
  foot = f"<p>global arrays: {esc(plan._totals())}"
  if plan.memory is not None:
    foot += f"; compiled, per device: {_memory_stats.text(plan.memory)}"
  foot += "</p>" + "".join(f"<p>note: {esc(n)}</p>" for n in plan.notes)
  return (
    f"<div><b>DonationPlan for {esc(plan.function)}</b><table>"
    f"<tr>{head}</tr>{body}</table>{foot}{_copies.copies_html(plan.copies or ())}</div>"
  )


NOT_A_DEVICE_BUFFER = "not donated: not a device buffer"
WRITTEN_BACK = "ref: written back in place"  # the reason of every ref leaf the call uses


def _not_made(output: str | None, shardings: tuple[str, str] | None) -> dict:
  """The cause and reason of a planned alias XLA did not make."""
  if shardings is not None:
    return {
      "cause": Cause.SHARDING_DIFFERS,
      "reason": f"not usable: sharding differs (in {shardings[0]}, out {shardings[1]})",
    }
  return {
    "cause": Cause.ALIAS_NOT_MADE,
    "reason": f"planned for {output}, but XLA did not make the alias; it stays alive",
  }


def _table(decisions: Sequence[LeafDecision]) -> list[str]:
  """Fixed columns first (action, bytes, type, sharding), then `input -> output`, the reason."""
  rows: list[tuple[Any, ...]] = [
    (
      d.action,
      format_bytes(d.nbytes),
      _type(d),
      d.sharding,
      d.path + (f" -> {d.output}" if d.output else ""),
      d,
    )
    for d in decisions
  ]
  head = ("action", "bytes", "type", "sharding", "input -> output")
  widths = [max([len(head[k])] + [len(r[k]) for r in rows]) for k in range(4)]
  lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(head, widths + [0])).rstrip()]
  for r in rows:
    lines += _wrap(["  " + "  ".join(c.ljust(w) for c, w in zip(r[:5], widths + [0])).rstrip()])
    d = r[5]
    extra = d.reason if not d.requested else f"{d.reason} [{d.source}]"
    lines += _wrap([f"      {extra}"], indent="      ")
  return lines


def _wrap(lines: Sequence[str], indent: str = "    ") -> list[str]:
  out = []
  for line in lines:
    while len(line) > _WIDTH:
      cut = line.rfind(" ", len(indent) + 1, _WIDTH)
      cut = cut if cut > len(indent) else _WIDTH
      out.append(line[:cut].rstrip())
      line = indent + line[cut:].lstrip()
    out.append(line)
  return out


def _type(d, shape=None) -> str:
  """`float32[4,8]`: the leaf's type, or its dtype with `shape` (its shape on one device, as
  `jax.jit`'s warning names it), with its memory space when not the device's (`<host>`, as JAX
  spells avals)."""
  space = d.info.memory_space
  memory = f"<{space.lower()}>" if space else ""
  return f"{d.dtype}{memory}[{','.join(map(str, d.shape if shape is None else shape))}]"


def shard_shape(x: LeafInfo | OutputInfo) -> tuple:
  """The shape on one device, as `jax.jit` matches donations (the aval under the argument's or
  result's sharding, `mlir.sharded_aval`); the whole shape where the sharding is not known."""
  shape = tuple(x.shape)
  sharding = x.sharding_obj
  if sharding is not None and hasattr(sharding, "shard_shape"):
    try:
      return tuple(sharding.shard_shape(shape))
    except Exception:  # a sharding that does not fit the shape: jax.jit reports that itself
      pass
  return shape


def _differences(d: LeafDecision, out: OutputInfo, out_shardings: dict[str, str] | None) -> str:
  """What differs between a donated leaf and the output XLA put in its buffer, in words."""
  fields = []
  if tuple(out.shape) != tuple(d.shape):
    fields.append(f"shape {shape_text(out.shape)} vs {shape_text(d.shape)}")
  if out.dtype != d.dtype:
    fields.append(f"dtype {out.dtype} vs {d.dtype}")
  compiled = (out_shardings or {}).get(out.path)
  sharding = compiled or (sharding_str(out.sharding_obj) if out.sharding_obj is not None else None)
  if sharding is not None and sharding != d.sharding:
    fields.append(f"sharding {sharding} vs {d.sharding}")
  if fields:
    return ", ".join(fields)
  if sharding is None:
    return "same shape and dtype; its sharding was known only after partitioning"
  return "same shape, dtype and sharding"
