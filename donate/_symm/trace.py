"""Producer trace-back: from every symmetric mark to the buffer that must be symmetric.

``comm_buffers(closed_jaxpr)`` finds every ``symmetric_p`` equation and every equation traced inside
``symmetric_memory``, at any nesting depth, and follows each marked value back through views
(reshape, broadcast, convert, transpose, ...) and calls (``jit``, ``checkpoint``) to the equation
that materialises it, as in the symmetric-memory RFC:

* a built-in producer gets only that output made symmetric;
* a custom-op producer (custom_jvp/custom_vjp function, callback, FFI call, or a nested ``jit``
  traced inside ``symmetric_memory``) gets *all* its outputs made symmetric, and the outputs that
  were not needed are reported in ``over_allocated_bytes``;
* an input of the program is reported with ``producer="argument"``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from donate._base import primitives as _primitives
from donate._base.errors import SymmetricMemoryWarning
from donate._base.jaxprs import is_var, nbytes, short_source_line, subs
from donate._base.text import notebook_cell
from donate._symm.prim import context_spec, contexts_used, marks_traced, symmetric_p
from donate._symm.registry import COLLECTIVE_PRIMITIVES, any_registered, requirements


@dataclasses.dataclass(frozen=True, slots=True)
class CommBuffer:
  """One buffer that must live in symmetric (collective) memory.

  Attributes:
    var: the jaxpr ``Var`` of the producer output that must be symmetric.
    jaxpr: the (open) ``Jaxpr`` that ``var`` lives in.
    kind: the comm-buffer type, e.g. ``"symm_mem"``.
    group: the communication group, as mesh axis names.
    producer: the producing primitive's name, or ``"argument"``, ``"constant"``, ``"literal"``.
    custom_op: True if the producer is a custom op (all its outputs are symmetric).
    nbytes: size of the buffer in bytes (per device, inside ``shard_map``).
    shape: the buffer's shape.
    dtype: the buffer's dtype name.
    source_info: ``file:line`` of the user code that produced it, or ``""``.
    feeds_collective: True if the value (or a view of it) reaches a collective.
    collectives: names of the collective primitives it reaches.
    is_output: True if the value (or a view of it) is a program output.
    over_allocated_bytes: bytes made symmetric only because a sibling output of the same custom
      op needed it (0 otherwise).
    sources: which annotations asked for it (``"with_symmetric"``, ``"requires_symmetric"``,
      ``"context"``).
    path: names of the equations enclosing ``jaxpr`` (e.g. ``("shard_map", "scan")``).
    out_index: the index of ``var`` among its producer's outputs, or None for arguments.
    eqn: the producing equation, or None for arguments and constants.

  >>> import jax, jax.numpy as jnp
  >>> from jax import lax
  >>> import donate
  >>> mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  >>> def body(b):
  ...   return lax.psum(donate.with_symmetric(jnp.sin(b).reshape(4), "x"), "x")
  >>> f = jax.shard_map(body, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P())
  >>> (buf,) = comm_buffers(jax.make_jaxpr(f)(jnp.ones((1, 4))))
  >>> buf.producer, buf.group, buf.nbytes, buf.feeds_collective
  ('sin', ('x',), 16, True)
  """

  var: Any = dataclasses.field(repr=False)
  jaxpr: Any = dataclasses.field(repr=False, compare=False)
  kind: str
  group: tuple[str, ...]
  producer: str
  custom_op: bool
  nbytes: int
  shape: tuple[int, ...]
  dtype: str
  source_info: str
  feeds_collective: bool
  collectives: tuple[str, ...]
  is_output: bool
  over_allocated_bytes: int
  sources: tuple[str, ...]
  path: tuple[str, ...]
  out_index: int | None
  eqn: Any = dataclasses.field(repr=False, compare=False)

  def __str__(self) -> str:
    shape = ",".join(str(d) for d in self.shape)
    text = (
      f"{self.kind}@{','.join(self.group)} {self.dtype}[{shape}] {self.nbytes} B"
      f" <- {self.producer}" + (" (custom op)" if self.custom_op else "")
    )
    if self.source_info:
      text += f" at {notebook_cell(self.source_info)}"
    text += (
      f"; feeds {', '.join(self.collectives)}"
      if self.feeds_collective
      else ("; never reaches a collective")
    )
    if self.is_output:
      text += "; program output"
    if self.over_allocated_bytes:
      text += f"; over-allocated {self.over_allocated_bytes} B"
    return text


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
  jaxpr: Any
  eqn: Any
  sub: Any


@dataclasses.dataclass(frozen=True, slots=True)
class _Index:
  producers: dict
  uses: dict
  invars: dict
  outvars: dict


def _index(jaxpr, cache: dict) -> _Index:
  hit = cache.get(id(jaxpr))
  if hit is not None:
    return hit[1]
  producers: dict = {}
  uses: dict = {}
  outvars: dict = {}
  for eqn in jaxpr.eqns:
    for i, var in enumerate(eqn.invars):
      if is_var(var):
        uses.setdefault(var, []).append((eqn, i))
    for k, var in enumerate(eqn.outvars):
      producers[var] = (eqn, k)
  for k, var in enumerate(jaxpr.outvars):
    if is_var(var):
      outvars.setdefault(var, []).append(k)
  found = _Index(producers, uses, {v: i for i, v in enumerate(jaxpr.invars)}, outvars)
  cache[id(jaxpr)] = (jaxpr, found)  # holding jaxpr keeps its id valid while the cache lives.
  return found


def _current(top, path):
  return path[-1].sub.jaxpr if path else top


def is_custom_op(eqn) -> bool:
  """True if ``eqn`` is a custom-op producer (all outputs symmetric together).

  >>> import jax
  >>> is_custom_op(jax.make_jaxpr(jax.numpy.sin)(1.0).eqns[0])
  False
  """
  name = eqn.primitive.name
  return name in _primitives.CUSTOM or (name in _primitives.CALL and context_spec(eqn) is not None)


def _call_output(eqn, k):
  """The sub-jaxpr and inner output of a call-like ``eqn`` that becomes its output ``k``."""
  if eqn.primitive.name not in _primitives.CALL or is_custom_op(eqn):
    return None
  for sub in subs(eqn):
    if sub.transparent and k in sub.out_map:
      return sub, sub.jaxpr.outvars[sub.out_map.index(k)]
  return None


def _trace_back(top, path, var, cache):
  """Follows ``var`` back to its materialising producer: ``(path, var, eqn_or_None, name)``."""
  while True:
    jaxpr = _current(top, path)
    if not is_var(var):
      return path, var, None, "literal"
    ix = _index(jaxpr, cache)
    if var in ix.producers:
      eqn, k = ix.producers[var]
      if eqn.primitive.name in _primitives.TRACE_BACK_VIEWS and eqn.invars:
        var = eqn.invars[k if len(eqn.invars) == len(eqn.outvars) else 0]
        continue
      inner = _call_output(eqn, k)
      if inner is None:
        return path, var, eqn, eqn.primitive.name
      path, var = path + (_Step(jaxpr, eqn, inner[0]),), inner[1]
      continue
    if var in ix.invars and path:
      step = path[-1]
      outer = step.sub.in_map[ix.invars[var]]
      # Not out of a shard_map: inside, the buffer is the per-device shard, outside the whole array.
      if step.sub.transparent and outer is not None and step.eqn.primitive.name != "shard_map":
        path, var = path[:-1], step.eqn.invars[outer]
        continue
    name = "argument" if var in ix.invars else "constant"
    return path, var, None, name


def _is_collective_use(eqn, reqs) -> bool:
  if eqn.primitive is symmetric_p:
    return eqn.params["source"] == "requires_symmetric"
  return eqn.primitive.name in COLLECTIVE_PRIMITIVES or eqn.primitive.name in reqs


def _forward(top, path, var, cache, reqs):
  """Follows ``var`` forward through views and calls: ``(collectives, is_output)``."""
  todo, seen, collectives, is_output = [(path, var)], set(), [], False
  while todo:
    path, var = todo.pop()
    key = (tuple(id(s.eqn) for s in path), id(var))
    if key in seen or not is_var(var):
      continue
    seen.add(key)
    jaxpr = _current(top, path)
    ix = _index(jaxpr, cache)
    for eqn, i in ix.uses.get(var, ()):
      if _is_collective_use(eqn, reqs):
        collectives.append(eqn.primitive.name)
      if eqn.primitive.name in _primitives.TRACE_BACK_VIEWS:
        todo.append((path, eqn.outvars[i if len(eqn.outvars) == len(eqn.invars) else 0]))
      for sub in subs(eqn):
        for j, outer in enumerate(sub.in_map):
          if outer == i:
            todo.append((path + (_Step(jaxpr, eqn, sub),), sub.jaxpr.invars[j]))
    for k in ix.outvars.get(var, ()):
      if not path:
        is_output = True
      elif path[-1].sub.transparent and path[-1].sub.out_map[k] is not None:
        todo.append((path[:-1], path[-1].eqn.outvars[path[-1].sub.out_map[k]]))
  names = tuple(dict.fromkeys(n for n in collectives if n != "symmetric")) or (
    ("declared",) if collectives else ()
  )
  return names, is_output


def _walk(jaxpr, path, in_context):
  """Yields ``(path, jaxpr, eqn, context_spec_or_None)`` for marks and context equations."""
  for eqn in jaxpr.eqns:
    spec = None if in_context else context_spec(eqn)
    if eqn.primitive is symmetric_p or spec is not None:
      yield path, jaxpr, eqn, spec
    for sub in subs(eqn):
      yield from _walk(sub.jaxpr, path + (_Step(jaxpr, eqn, sub),), in_context or spec is not None)


@dataclasses.dataclass(slots=True)
class _Pending:
  """Mutable accumulator for one buffer while marks are collected."""

  path: tuple
  var: Any
  eqn: Any
  producer: str
  out_index: int | None
  kind: str
  group: tuple[str, ...]
  trigger_info: Any
  needed: bool = False
  sources: list = dataclasses.field(default_factory=list)


def _requests(top, cache):
  """Yields ``(path, var, eqn, producer, out_index, needed_if_explicit, kind, group, source,
  info)``."""
  for path, _jaxpr, eqn, spec in _walk(top, (), False):
    if spec is None:  # an explicit symmetric_p mark
      axes, kind, source = eqn.params["axis_name"], eqn.params["kind"], eqn.params["source"]
      p_path, var, producer_eqn, name = _trace_back(top, path, eqn.invars[0], cache)
    else:  # an equation traced inside symmetric_memory
      (axes, kind), source = spec, "context"
      p_path, var, producer_eqn, name = path, None, eqn, eqn.primitive.name
    if producer_eqn is None:
      yield p_path, var, None, name, None, True, kind, axes, source, eqn.source_info
      continue
    outs = list(enumerate(producer_eqn.outvars))
    if var is not None and not is_custom_op(producer_eqn):
      outs = [(k, v) for k, v in outs if v is var]
    for k, out in outs:
      explicit = source != "context" and out is var
      yield p_path, out, producer_eqn, name, k, explicit, kind, axes, source, eqn.source_info


def _collect(top, cache) -> list[_Pending]:
  pending: dict = {}
  for path, var, eqn, name, k, explicit, kind, axes, source, info in _requests(top, cache):
    key = (tuple(id(s.eqn) for s in path), id(var))
    item = pending.get(key)
    if item is None:
      item = pending[key] = _Pending(path, var, eqn, name, k, kind, tuple(axes), info)
    item.needed |= eqn is None or explicit or not is_custom_op(eqn)
    item.sources.append(source)
  return list(pending.values())


def _finish(top, item: _Pending, cache, reqs) -> CommBuffer:
  collectives, is_output = _forward(top, item.path, item.var, cache, reqs)
  custom = item.eqn is not None and is_custom_op(item.eqn)
  needed = item.needed or (custom and bool(collectives) and "context" in item.sources)
  aval = item.var.aval
  size = nbytes(aval)
  info = item.eqn.source_info if item.eqn is not None else item.trigger_info
  return CommBuffer(
    var=item.var,
    jaxpr=_current(top, item.path),
    kind=item.kind,
    group=item.group,
    producer=item.producer,
    custom_op=custom,
    nbytes=size,
    shape=tuple(getattr(aval, "shape", ())),
    dtype=str(getattr(aval, "dtype", "")),
    source_info=short_source_line(info),
    feeds_collective=bool(collectives),
    collectives=collectives,
    is_output=is_output,
    over_allocated_bytes=0 if needed else size,
    sources=tuple(dict.fromkeys(item.sources)),
    path=tuple(s.eqn.primitive.name for s in item.path),
    out_index=item.out_index,
    eqn=item.eqn,
  )


def comm_buffers(closed_jaxpr) -> tuple[CommBuffer, ...]:
  """Returns every buffer of ``closed_jaxpr`` that must live in symmetric memory.

  Marks are found at any nesting depth; each marked value is traced back through views to the
  equation that materialises it (see the module docstring). Buffers are listed in program order,
  each once.

  Args:
    closed_jaxpr: a ``ClosedJaxpr`` (call ``mark_required`` first to include registered
      collectives' inputs).

  Returns:
    A tuple of ``CommBuffer``.

  >>> import jax, jax.numpy as jnp, numpy as np
  >>> from jax.sharding import Mesh, PartitionSpec as P
  >>> from donate._symm.prim import mark
  >>> mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
  >>> def body(x):
  ...   y = jnp.sin(x)
  ...   y = y.reshape(2, 2).astype(jnp.bfloat16)
  ...   z = mark(y, "i", kind="symm_mem", source="with_symmetric")
  ...   return jax.lax.psum(z, "i")
  >>> f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P())
  >>> buffers = comm_buffers(jax.make_jaxpr(f)(np.ones(4, np.float32)))
  >>> [(b.producer, b.nbytes, b.feeds_collective) for b in buffers]
  [('sin', 16, True)]
  """
  if nothing_marked():
    return ()
  top, reqs = closed_jaxpr.jaxpr, requirements()
  cache: dict = {}
  return tuple(_finish(top, item, cache, reqs) for item in _collect(top, cache))


def nothing_marked() -> bool:
  """Whether no value was marked, no collective registered and no `symmetric_memory` context
  entered anywhere in this process: then no program has a comm buffer (`comm_buffers` is empty)
  and `mark_required` returns every jaxpr as it is."""
  return nothing_to_mark() and not marks_traced()


def nothing_to_mark() -> bool:
  """Whether no collective is registered and no `symmetric_memory` context was entered in this
  process: then `mark_required` returns every jaxpr as it is, and a jaxpr has comm buffers only
  where it holds `symmetric` equations (`with_symmetric`'s marks)."""
  return not (any_registered() or contexts_used())


def comm_buffer_report(buffers, *, warn: bool = False) -> tuple[str, ...]:
  """Returns (and optionally warns) one sentence per problem among ``buffers``.

  Problems: custom-op outputs made symmetric but not needed (over-allocation), values that never
  reach a collective, and symmetric values that are program outputs (they cannot stay in a pool).

  >>> comm_buffer_report(())
  ()
  """
  notes = []
  for buf in buffers:
    where = f"{buf.producer} output {buf.dtype}{list(buf.shape)}" + (
      f" at {notebook_cell(buf.source_info)}" if buf.source_info else ""
    )
    if buf.over_allocated_bytes:
      notes.append(
        f"donate: {where} is symmetric only because it comes from the same custom op "
        f"as a needed buffer: {buf.over_allocated_bytes} bytes over-allocated. Fix: "
        "split the custom op so the collective's input is its own output."
      )
    if not buf.feeds_collective:
      notes.append(
        f"donate: {where} is marked symmetric but never reaches a collective. Fix: "
        "remove the annotation or pass the value to the collective."
      )
    if buf.is_output:
      notes.append(
        f"donate: {where} is symmetric and a program output; it is copied out of "
        "the collective pool. Fix: return a value computed from it instead."
      )
  if warn:
    for note in notes:
      warnings.warn(note, SymmetricMemoryWarning, stacklevel=2)
  return tuple(notes)
