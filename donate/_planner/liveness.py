"""Liveness over jaxprs: every value that needs memory, its producer and its live range.

The walk starts from the idea of `jax._src.core.last_used` (walk `reversed(jaxpr.eqns)` and record
each variable's last use) and recurses into the sub-jaxprs of calls (`jit`, `closed_call`, custom
derivatives), loops (`scan`, `while`), `cond` and `shard_map`. An equation with sub-jaxprs expands
into a span of time steps, so inner values get ranges inside the outer timeline.

Only public JAX names are used (`jax.extend.core`); `last_used` is re-implemented here because it
is not part of JAX's public API.

Time model (all ranges half-open, ``[start, end)``):

- every equation without sub-jaxprs is one step; its outputs start at that step and its operands
  are live up to and including it (``end = step + 1``); identities and views take no step;
- an equation with sub-jaxprs covers the steps of its sub-jaxprs, walked one after another; its
  operands are live over the whole span;
- program arguments and constants start at step 0; program outputs are marked ``is_output`` (the
  planner decides how long caller-owned values live).

Aliasing: values that need no memory of their own share their operand's buffer. That holds for
identity primitives (`pvary`, the symmetric-memory marker, ...), for the parameters of call-like
sub-jaxprs (which are the caller's operands) and for their results (which become the caller's
results). Loops and conds allocate their results for the whole span; their bodies compute into
buffers of their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

from jax.extend import core as jex_core

from donate._base import loops as _loops
from donate._base import primitives as _primitives

# Primitives with sub-jaxprs that are not simple calls.
_LOOPS_AND_CONDS = _primitives.LOOP | {"cond"}


@dataclasses.dataclass(frozen=True, slots=True)
class Value:
  """One buffer found by the walk: what produced it and when it is used.

  Attributes:
    id: index of this value in `Liveness.values` (creation order).
    producer: primitive name, ``"argument"`` or ``"constant"``.
    shape: shape as the owning jaxpr sees it (per-device inside ``shard_map``).
    dtype: dtype name.
    nbytes: size in bytes.
    start: step at which the value is produced.
    last_use: one past the last step that reads it (at least ``start + 1``); being a program
      output does not count as a read.
    scope: where it was produced, e.g. ``"shard_map/"`` (empty at top level).
    arg_index: index among the flat program arguments, or None.
    out_index: index of the first program output it is, or None.
  """

  id: int
  producer: str
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  start: int
  last_use: int
  scope: str
  arg_index: int | None = None
  out_index: int | None = None

  @property
  def is_output(self) -> bool:
    return self.out_index is not None


@dataclasses.dataclass(frozen=True, slots=True)
class InplaceCandidate:
  """An elementwise step whose output could reuse one of its operands' buffers."""

  step: int
  out: int
  operands: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Liveness:
  """Result of `live_ranges`: values, the step labels, and which values each jaxpr var became.

  Attributes:
    values: every value needing memory, in creation order.
    steps: one label per time step, e.g. ``"shard_map/add"``.
    instances: jaxpr var -> ids of the values it stands for (a sub-jaxpr walked twice yields two).
    inplace: elementwise steps, for in-place reuse by the planner.
    donated: ids of values marked with `donate.donate_buffer` somewhere in the program.
  """

  values: tuple[Value, ...]
  steps: tuple[str, ...]
  instances: dict[Any, tuple[int, ...]]
  inplace: tuple[InplaceCandidate, ...]
  donated: frozenset[int] = frozenset()

  @property
  def num_steps(self) -> int:
    return max(len(self.steps), 1)


def last_used(jaxpr: jex_core.Jaxpr) -> dict[Any, jex_core.JaxprEqn | None]:
  """Maps every var of `jaxpr` to the equation that uses it last (None: an output).

  The same ten lines as `jax._src.core.last_used`, which is not public API.
  """
  last: dict[Any, jex_core.JaxprEqn | None] = {
    v: None for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)
  }
  for eqn in reversed(jaxpr.eqns):
    for v in eqn.invars:
      if not isinstance(v, jex_core.Literal) and v not in last:
        last[v] = eqn
  return last


def aval_bytes(aval: Any) -> tuple[tuple[int, ...], str, int] | None:
  """Shape, dtype name and byte size of an array aval; None for tokens and other non-arrays."""
  shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
  itemsize = getattr(dtype, "itemsize", None)
  if shape is None or itemsize is None or not all(isinstance(d, int) for d in shape):
    return None
  return tuple(shape), str(dtype), math.prod(shape) * int(itemsize)


class _Record:
  """Mutable value record used while walking; frozen into a `Value` at the end."""

  __slots__ = (
    "producer",
    "shape",
    "dtype",
    "nbytes",
    "start",
    "last_use",
    "scope",
    "arg_index",
    "out_index",
  )

  def __init__(self, producer, shape, dtype, nbytes, start, scope, arg_index=None):
    self.producer, self.shape, self.dtype, self.nbytes = producer, shape, dtype, nbytes
    self.start, self.last_use, self.scope = start, start + 1, scope
    self.arg_index, self.out_index = arg_index, None


Env = dict  # jaxpr var -> value id (or None for values that need no memory)


class _Walker:
  """Walks nested jaxprs, creating value records and step labels."""

  def __init__(self):
    self.records: list[_Record] = []
    self.steps: list[str] = []
    self.instances: dict[Any, list[int]] = {}
    self.inplace: list[InplaceCandidate] = []
    self.donated: set[int] = set()

  def new(
    self, var, producer: str, scope: str, start: int, env: Env, arg_index: int | None = None
  ) -> None:
    """Creates a value for `var` (if it needs memory) and binds it in `env`."""
    info = aval_bytes(var.aval)
    if info is None or info[2] == 0:
      env[var] = None
      return
    self.records.append(_Record(producer, *info, start, scope, arg_index))
    env[var] = len(self.records) - 1
    self.instances.setdefault(var, []).append(env[var])

  def bind(self, var, value_id: int | None, env: Env) -> None:
    """Binds `var` to an existing value (an alias: no memory of its own)."""
    env[var] = value_id
    if value_id is not None:
      self.instances.setdefault(var, []).append(value_id)

  def read(self, atom, env: Env) -> int | None:
    return None if isinstance(atom, jex_core.Literal) else env.get(atom)

  def use(self, value_id: int | None, end: int) -> None:
    if value_id is not None:
      rec = self.records[value_id]
      rec.last_use = max(rec.last_use, end)

  def walk(self, jaxpr: jex_core.Jaxpr, env: Env, scope: str, top: bool = False) -> None:
    """Walks `jaxpr`'s equations; `env` already binds its invars (and maybe constvars).

    Outputs of a sub-jaxpr live to its end; the program's own outputs are left to the planner.
    """
    start = len(self.steps)
    for v in jaxpr.constvars:
      if v not in env:
        self.new(v, "constant", scope, start, env)
    last = last_used(jaxpr)
    for eqn in jaxpr.eqns:
      if any(True for _ in jex_core.jaxprs_in_params(eqn.params)):
        self.enter(eqn, env, scope)
      else:
        self.leaf(eqn, env, scope)
      stop = len(self.steps)
      for atom in eqn.invars:
        if not isinstance(atom, jex_core.Literal) and last.get(atom) is eqn:
          self.use(env.get(atom), stop)
    if not top:
      stop = len(self.steps)
      for atom in jaxpr.outvars:
        self.use(self.read(atom, env), stop)

  def leaf(self, eqn, env: Env, scope: str) -> None:
    """One step: an equation without sub-jaxprs (none for identities and views: they alias)."""
    step = len(self.steps)
    name = eqn.primitive.name
    operands = [self.read(v, env) for v in eqn.invars]
    if name == "donate_buffer":
      self.donated.update(i for i in operands if i is not None)
    if name == "donate_alias":  # alias(src, dst) returns dst
      self.bind(eqn.outvars[0], operands[-1], env)
      return
    if (name in _primitives.IDENTITY and len(eqn.invars) == len(eqn.outvars)) or (
      name in _primitives.VIEW and _same_bytes(eqn.invars[:1], eqn.outvars)
    ):
      for out, src in zip(eqn.outvars, operands):
        self.bind(out, src, env)
      return
    self.steps.append(scope + name)
    for out in eqn.outvars:
      self.new(out, name, scope, step, env)
    if (
      name in _primitives.ELEMENTWISE and len(eqn.outvars) == 1 and env[eqn.outvars[0]] is not None
    ):
      ids = tuple(dict.fromkeys(i for i in operands if i is not None))
      self.inplace.append(InplaceCandidate(step, env[eqn.outvars[0]], ids))

  def enter(self, eqn, env: Env, scope: str) -> None:
    """A span: an equation with sub-jaxprs, which get walked inside it."""
    name = eqn.primitive.name
    operands = [self.read(v, env) for v in eqn.invars]
    begin = len(self.steps)
    control_flow = name in _LOOPS_AND_CONDS or not _is_call_like(eqn)
    if control_flow:
      outs = []
      for out in eqn.outvars:
        self.new(out, name, scope, begin, env)
        outs.append(env[out])
      for label, sub, bound in _control_flow_parts(eqn, operands, outs):
        self.walk_sub(sub, bound, f"{scope}{label}/", begin)
    else:
      (sub,) = jex_core.jaxprs_in_params(eqn.params)
      inner = self.walk_sub(sub, operands, f"{scope}{name}/", begin)
      for out, inner_out in zip(eqn.outvars, sub.outvars):
        if isinstance(inner_out, jex_core.Literal):
          self.new(out, name, scope, max(begin, len(self.steps) - 1), env)
        else:
          self.bind(out, inner[inner_out], env)
    if len(self.steps) == begin:  # empty bodies still take a step
      self.steps.append(scope + name)
    if control_flow:
      for out in eqn.outvars:  # the loop state lives across every iteration
        self.use(env[out], len(self.steps))

  def walk_sub(
    self, sub: jex_core.Jaxpr, bound: Sequence[int | None | object], scope: str, begin: int
  ) -> Env:
    """Walks a sub-jaxpr; `bound[i]` is the value of invar i, or `FRESH` for a new one."""
    env: Env = {}
    for var, value_id in zip(sub.invars, bound):
      if value_id is FRESH:
        self.new(var, "parameter", scope, begin, env)
      else:
        self.bind(var, cast(int | None, value_id), env)
    self.walk(sub, env, scope)
    return env


FRESH = object()  # marks a sub-jaxpr parameter that gets a buffer of its own


def _same_bytes(ins, outs) -> bool:
  if len(ins) != 1 or len(outs) != 1:
    return False
  a, b = aval_bytes(ins[0].aval), aval_bytes(outs[0].aval)
  return a is not None and b is not None and a[2] == b[2]


def _is_call_like(eqn) -> bool:
  subs = list(jex_core.jaxprs_in_params(eqn.params))
  return (
    len(subs) == 1
    and len(subs[0].invars) == len(eqn.invars)
    and len(subs[0].outvars) == len(eqn.outvars)
  )


def _control_flow_parts(eqn, operands: list, outs: list) -> Iterable[tuple[str, Any, list]]:
  """Yields (label, sub-jaxpr, bindings of its invars) for loops, conds and unknown primitives.

  Loop-invariant operands alias the caller's buffers, loop carries alias the loop's results (the
  loop state, allocated for the whole span), and sliced or unknown parameters are `FRESH`.
  """
  p, name = eqn.params, eqn.primitive.name
  loop = _loops.loop_layout(eqn)
  if loop is not None and loop.kind == "scan":
    nc, ncarry, sub = loop.body_consts, loop.carries, loop.body
    yield "scan", sub, operands[:nc] + outs[:ncarry] + [FRESH] * (len(sub.invars) - nc - ncarry)
  elif loop is not None:
    cn, bn = loop.cond_consts, loop.body_consts
    yield "while.cond", loop.cond, operands[:cn] + outs
    yield "while.body", loop.body, operands[cn : cn + bn] + outs
  elif name == "cond":
    for i, branch in enumerate(p["branches"]):
      yield f"cond[{i}]", branch.jaxpr, operands[1:]
  else:
    for i, sub in enumerate(jex_core.jaxprs_in_params(p)):
      yield f"{name}[{i}]", sub, [FRESH] * len(sub.invars)


def live_ranges(closed_jaxpr: jex_core.ClosedJaxpr) -> Liveness:
  """Walks a closed jaxpr and its sub-jaxprs, giving every value a producer and a live range.

  Args:
    closed_jaxpr: e.g. from `jax.make_jaxpr`.

  Returns:
    A `Liveness` whose values are ordered by creation; arguments come first.

  >>> import jax, jax.numpy as jnp
  >>> lv = live_ranges(jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(jnp.ones(4)))
  >>> [(v.producer, v.start, v.last_use) for v in lv.values]
  [('argument', 0, 1), ('sin', 0, 2), ('mul', 1, 2)]
  >>> lv.values[-1].is_output  # program outputs: the planner decides how long they live
  True
  >>> lv.steps
  ('sin', 'mul')
  """
  jaxpr = closed_jaxpr.jaxpr
  walker = _Walker()
  env: Env = {}
  for i, var in enumerate(jaxpr.invars):
    walker.new(var, "argument", "", 0, env, arg_index=i)
  for var in jaxpr.constvars:
    walker.new(var, "constant", "", 0, env)
  walker.walk(jaxpr, env, "", top=True)
  for i, var in enumerate(jaxpr.outvars):
    value_id = walker.read(var, env)
    if value_id is not None and walker.records[value_id].out_index is None:
      walker.records[value_id].out_index = i
  values = tuple(
    Value(
      i,
      r.producer,
      r.shape,
      r.dtype,
      r.nbytes,
      r.start,
      r.last_use,
      r.scope,
      r.arg_index,
      r.out_index,
    )
    for i, r in enumerate(walker.records)
  )
  assert all(v.start < v.last_use for v in values), "every value is live for at least one step"
  return Liveness(
    values,
    tuple(walker.steps),
    {k: tuple(v) for k, v in walker.instances.items()},
    tuple(walker.inplace),
    frozenset(walker.donated),
  )
