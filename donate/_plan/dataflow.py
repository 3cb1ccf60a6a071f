"""Dataflow over jaxprs: where buffers come from, where intent was annotated, what was consumed.

Pure analysis of a closed jaxpr (no JAX execution). Three facts per program:

* origin: which values *are* an input buffer (the input itself, forwarded into nested jaxprs as
  call arguments, loop carries, branch operands and `shard_map` blocks, or through `donate_buffer`
  and `alias`, whose result lives in the source's buffer). Chains of `alias` resolve to the root.
* in-place sources: for each value, the input buffers it could be computed in place from, with a
  strength (explicit `alias` > forwarded input > update op like `dynamic_update_slice` > loop
  carry > elementwise op), which the planner uses to pair outputs with donated inputs.
* annotations: every `donate_buffer`, `alias` and inner `jit(donate_argnums=...)` at any depth, with
  its source line and the input it resolves to (or None when it names an intermediate or constant),
  and a check that a donated or aliased source is not read afterwards.
* hosting (`Hosting`): which inputs cannot host an output because an operation that reads them
  depends on that output (XLA must copy the input to write the output into it), and which die
  into it (every reader of the input is computed before the output is).

Sharding and layout annotations (`_primitives.TRANSPARENT`) pass values through unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.extend import core as jcore

from donate._base import compat as _compat
from donate._base import errors as _errors
from donate._base import loops as _loops
from donate._base import primitives as _primitives
from donate._base.jaxprs import open_jaxpr
from donate._base.primitives import alias_p, donate_buffer_p, is_donate_jit
from donate._base.records import fast_init
from donate._plan.decision_types import Request

EXPLICIT = 9  # an explicit `alias`: survives any chain
IDENTITY = 6  # the output is the input buffer itself
UPDATE = 5  # dynamic_update_slice / scatter into the input
CARRY = 4  # a loop carry that starts as the input
ELEMENTWISE = 2  # an elementwise op of the input
KEY = 1  # a PRNG key made from the input key (`_primitives.PRNG_KEY`), or picked out of a batch

# Calls whose single sub-jaxpr takes the equation's operands one to one.
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


@dataclasses.dataclass(frozen=True, slots=True)
class Annotation:
  """One annotation found in the program.

  Attributes:
    kind: the `Request` it makes: DONATE_BUFFER, ALIAS, DONATE_JIT (an inner `donate.jit` call)
      or INNER_JIT (an inner plain `jax.jit` call).
    where: the user's source line.
    origin: index of the outer input leaf it resolves to, or None (intermediate or constant).
    dst_origin: for ALIAS, the input leaf `dst` is, if it is one (an error: inputs cannot alias).
  """

  kind: Request
  where: str
  origin: int | None
  dst_origin: int | None = None


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Dataflow:
  """What the planner needs from a program: annotations, output sources, inputs it reads, and
  which input can host which output (`can_host`, `dies_into`)."""

  annotations: tuple[Annotation, ...]
  out_sources: tuple[dict[int, int], ...]
  out_explicit: tuple[frozenset[int], ...]  # per output: inputs an explicit alias puts it in
  used: tuple[bool, ...]
  hosting: LazyHosting | None = dataclasses.field(default=None, compare=False)

  def can_host(self, i: int, j: int) -> bool:
    """Whether input i's buffer can take output j without a copy: no operation that depends on
    output j still reads input i, and input i is not itself returned (True when unknown)."""
    return self.hosting is None or not self.hosting.get().blocked(i, j)

  def dies_into(self, i: int, j: int) -> bool:
    """Whether every operation reading input i comes before output j is made."""
    return self.hosting is not None and self.hosting.get().dies(i, j)


class LazyHosting:
  """A program's `Hosting`, walked when first asked (most plans never ask: see `_pairing._pair`)."""

  __slots__ = ("_jaxpr", "_skip", "_hosting")

  def __init__(self, jaxpr, skip: int):
    self._jaxpr, self._skip = jaxpr, skip
    self._hosting: Hosting | None = None

  def get(self) -> Hosting:
    if self._hosting is None:
      self._hosting = Hosting(self._jaxpr, self._skip)
    return self._hosting


def _cap(sources: dict[int, int], cap: int) -> dict[int, int]:
  """`sources` with every link below EXPLICIT weakened to at most `cap` (the same dict when
  nothing changes: source dicts are never mutated once made)."""
  if len(sources) == 1:  # the common case, without a generator
    ((k, s),) = sources.items()
    return sources if s <= cap or s >= EXPLICIT else {k: cap}
  if all(s <= cap or s >= EXPLICIT for s in sources.values()):
    return sources
  return {k: (s if s >= EXPLICIT else min(s, cap)) for k, s in sources.items()}


def _merge(*dicts: dict[int, int]) -> dict[int, int]:
  out: dict[int, int] = {}
  for d in dicts:
    for k, s in d.items():
      out[k] = max(out.get(k, 0), s)
  return out


def _elementwise(eqn, operand_sources: list[dict[int, int]]) -> dict[int, int]:
  """The sources of an elementwise result: those of its operands of its own shape, weakened to
  ELEMENTWISE (a broadcast operand is not updated in place)."""
  shape = getattr(eqn.outvars[0].aval, "shape", ())
  same = None
  for v, s in zip(eqn.invars, operand_sources):
    if s and getattr(v.aval, "shape", None) == shape:
      same = s if same is None else _merge(same, s)
  return _EMPTY if same is None else _cap(same, ELEMENTWISE)


def key_sources(name: str, ins: list[dict[int, int]], n_out: int) -> list[dict[int, int]] | None:
  """The sources of a PRNG key operation's results (`_primitives.PRNG_KEY`: a key, or a key's
  data, made from its first operand's key), or of an op that picks keys out of a batch of keys
  (`_primitives.KEY_PARTS`: only the KEY links pass); None for any other operation."""
  if name in _primitives.PRNG_KEY and ins and ins[0]:
    return [dict.fromkeys(ins[0], KEY)] + [_EMPTY] * (n_out - 1)
  if name in _primitives.KEY_PARTS and ins and KEY in ins[0].values():
    return [{k: s for k, s in ins[0].items() if s == KEY} for _ in range(n_out)]  # unstack
  return None


_EMPTY: dict[int, int] = {}  # the sources of a literal or an unknown value (never mutated)
# Elementwise primitives no earlier rule of `_Walker._eqn` claims (see the fast path in `walk`).
_ELEMENTWISE_ONLY = frozenset(
  _primitives.ELEMENTWISE
  - _primitives.IDENTITY
  - _primitives.IN_PLACE
  - {"scan", "while", "cond", donate_buffer_p.name, alias_p.name}
)


class _Walker:
  """Walks a jaxpr and its sub-jaxprs once, top down."""

  def __init__(self, check_consumed: bool = True):
    self.annotations: list[Annotation] = []
    self.check_consumed = check_consumed

  def walk(
    self, jaxpr: jcore.Jaxpr, origin_in: list[int | None], sources_in: list[dict[int, int]]
  ) -> tuple[list[int | None], list[dict[int, int]]]:
    """Returns (origin, sources) of `jaxpr.outvars` given those of `jaxpr.invars`."""
    origin: dict[Any, int | None] = {}
    sources: dict[Any, dict[int, int]] = {}
    for v, o, s in zip(jaxpr.invars, origin_in, sources_in):
      origin[v], sources[v] = o, s
    literal, nothing = jcore.Literal, (None, _EMPTY)

    def read(v):
      return nothing if isinstance(v, literal) else (origin.get(v), sources.get(v, _EMPTY))

    consumed: dict[Any, tuple[str, str]] = {}  # var -> (what consumed it, where)
    for eqn in jaxpr.eqns:
      if consumed and self.check_consumed:
        self._check_not_consumed(eqn, consumed)
      elif eqn.primitive.name in _ELEMENTWISE_ONLY and len(eqn.outvars) == 1:
        # The common case, without `_eqn`'s per-operand pairs (a wide pytree's step is thousands
        # of these): the same rule as `_elementwise`, inline.
        (out,) = eqn.outvars
        origin[out] = None
        shape = getattr(out.aval, "shape", ())
        same = None
        for atom in eqn.invars:
          s = _EMPTY if isinstance(atom, literal) else sources.get(atom, _EMPTY)
          if s and getattr(atom.aval, "shape", None) == shape:
            same = s if same is None else _merge(same, s)
        sources[out] = _EMPTY if same is None else _cap(same, ELEMENTWISE)
        continue
      ins = [read(v) for v in eqn.invars]
      outs = self._eqn(eqn, ins, consumed)
      for v, (o, s) in zip(eqn.outvars, outs):
        origin[v], sources[v] = o, s
    if self.check_consumed:
      for atom in jaxpr.outvars:
        if not isinstance(atom, jcore.Literal) and atom in consumed:
          what, where = consumed[atom]
          raise _errors.DonationError(
            _errors.message(
              f"a value given up by {what} at {where} is returned afterwards",
              fix="return the value the annotation returned instead of the original",
            )
          )
    outvars = jaxpr.outvars
    return (
      [None if isinstance(v, literal) else origin.get(v) for v in outvars],
      [_EMPTY if isinstance(v, literal) else sources.get(v, _EMPTY) for v in outvars],
    )

  def _check_not_consumed(self, eqn, consumed):
    for v in eqn.invars:
      if not isinstance(v, jcore.Literal) and v in consumed:
        what, where = consumed[v]
        raise _errors.DonationError(
          _errors.message(
            f"a value given up by {what} at {where} is read again at "
            f"{_compat.source_line(eqn.source_info)} (by {eqn.primitive.name})",
            fix="use the value the annotation returned from then on (x = donate.donate_buffer(x))",
          )
        )

  def _eqn(self, eqn, ins, consumed):
    name = eqn.primitive.name
    params = eqn.params
    if eqn.primitive is donate_buffer_p:
      where = _compat.source_line(eqn.source_info)
      ((o, s),) = ins
      self.annotations.append(Annotation(Request.DONATE_BUFFER, where, o))
      consumed[eqn.invars[0]] = (Request.DONATE_BUFFER.label, where)
      return [(o, s)]
    if eqn.primitive is alias_p:
      where = params.get("where") or _compat.source_line(eqn.source_info)
      (so, ss), (do, ds) = ins
      self.annotations.append(Annotation(Request.ALIAS, where, so, do))
      if not isinstance(eqn.invars[0], jcore.Literal):
        consumed[eqn.invars[0]] = (Request.ALIAS.label, where)
      if so is None:
        return [(None, _cap(ds, ELEMENTWISE))]
      return [(so, {so: EXPLICIT})]
    if (name in _primitives.IDENTITY or name in _primitives.TRANSPARENT) and (
      len(eqn.invars) == len(eqn.outvars)
    ):
      return list(ins)  # marks, casts and sharding annotations: each stays the same value
    if name in _primitives.IN_PLACE:
      return [(None, _cap(ins[0][1], UPDATE))] + [(None, {})] * (len(eqn.outvars) - 1)
    if name in _primitives.ELEMENTWISE and len(eqn.outvars) == 1:
      return [(None, _elementwise(eqn, [s for _, s in ins]))]
    keys = key_sources(name, [s for _, s in ins], len(eqn.outvars))
    if keys is not None:
      return [(None, s) for s in keys]
    if name == "scan":
      return self._scan(eqn, ins)
    if name == "while":
      return self._while(eqn, ins)
    if name == "cond":
      return self._cond(eqn, ins)
    return self._call(eqn, ins)

  def _inner(self, jaxpr_value, ins):
    jaxpr = open_jaxpr(jaxpr_value)
    return self.walk(jaxpr, [o for o, _ in ins], [s for _, s in ins])

  def _call(self, eqn, ins):
    donated = eqn.params.get("donated_invars")
    if donated:
      where = _compat.source_line(eqn.source_info)
      for d, (o, _) in zip(donated, ins):
        if d:
          kind = Request.DONATE_JIT if is_donate_jit(eqn.params.get("jaxpr")) else Request.INNER_JIT
          self.annotations.append(Annotation(kind, where, o))
    for key in _CALL_PARAMS:
      sub = open_jaxpr(eqn.params.get(key))
      if sub is not None and len(sub.invars) == len(ins):
        origins, sources = self._inner(eqn.params[key], ins)
        if len(origins) == len(eqn.outvars):
          return list(zip(origins, sources))
    for value in eqn.params.values():  # other sub-jaxprs: walk for annotations only
      for sub in value if isinstance(value, tuple) else (value,):
        jaxpr = open_jaxpr(sub)
        if jaxpr is not None:
          self.walk(jaxpr, [None] * len(jaxpr.invars), [{}] * len(jaxpr.invars))
    return [(None, {})] * len(eqn.outvars)

  def _loop(self, body, ins, n_before_carry, n_carry):
    consts = ins[:n_before_carry]
    carry = [(o, _cap(s, CARRY)) for o, s in ins[n_before_carry : n_before_carry + n_carry]]
    rest = [(None, {})] * (len(open_jaxpr(body).invars) - n_before_carry - n_carry)
    origins, sources = self._inner(body, consts + carry + rest)
    # The final carry lives where the body's result lives; only carries updated in place stay.
    finals = [(None, _cap(s, CARRY)) for s in sources[:n_carry]]
    return finals, sources[n_carry:]

  def _scan(self, eqn, ins):
    loop = _loops.loop_layout(eqn)
    finals, _ = self._loop(eqn.params["jaxpr"], ins, loop.body_consts, loop.carries)
    return finals + [(None, {})] * (len(eqn.outvars) - loop.carries)

  def _while(self, eqn, ins):
    loop = _loops.loop_layout(eqn)
    cn, bn = loop.cond_consts, loop.body_consts
    self._inner(eqn.params["cond_jaxpr"], ins[:cn] + ins[cn + bn :])
    finals, _ = self._loop(eqn.params["body_jaxpr"], ins[cn:], bn, loop.carries)
    return finals

  def _cond(self, eqn, ins):
    results = [self._inner(branch, ins[1:]) for branch in eqn.params["branches"]]
    outs = []
    for i in range(len(eqn.outvars)):
      origins = {r[0][i] for r in results}
      origin = origins.pop() if len(origins) == 1 else None
      outs.append((origin, _merge(*(r[1][i] for r in results))))
    return outs


def analyze(closed: jcore.ClosedJaxpr, skip: int = 0) -> Dataflow:
  """Analyzes a traced program whose inputs are the flat leaves, in order.

  The first `skip` inputs are hoisted constants, not leaves: they are no buffer's origin.
  """
  jaxpr = closed.jaxpr
  n = len(jaxpr.invars) - skip
  walker = _Walker()
  origins = [None] * skip + list(range(n))
  _, sources = walker.walk(jaxpr, origins, [{}] * skip + [{i: IDENTITY} for i in range(n)])
  none: frozenset[int] = frozenset()
  # Without an `alias` (the only EXPLICIT links) no link is above IDENTITY: nothing to split.
  explicit: tuple[frozenset[int], ...] = (none,) * len(sources)
  plain = tuple(sources)
  if any(a.kind == Request.ALIAS for a in walker.annotations):
    explicit = tuple(
      frozenset(k for k, s in src.items() if s >= EXPLICIT)
      if any(s >= EXPLICIT for s in src.values())
      else none
      for src in sources
    )
    plain = tuple(_cap(src, IDENTITY) for src in sources)
  # An input some output's sources name is read (a source is a real data dependency); only when
  # one is not named does dead-code elimination decide whether anything reads it.
  named = set().union(*sources)
  used = (True,) * n if len(named) == n else tuple(_compat.used_inputs(jaxpr)[skip:])
  return Dataflow(tuple(walker.annotations), plain, explicit, used, LazyHosting(jaxpr, skip))


class Hosting:
  """Which input buffer can take which output, from one flat order of the program's operations
  (`_Readers`), answered on demand and remembered."""

  def __init__(self, jaxpr, skip: int):
    self.reads = _Readers(len(jaxpr.invars))
    self.outs = self.reads.walk(jaxpr, [None] * skip + list(range(len(jaxpr.invars) - skip)))
    self.returned = {v for v in self.outs if v is not None and v < self.reads.n_inputs}
    self._late: dict[tuple[int, int], list[int]] = {}
    self._blocked: dict[tuple[int, int], bool] = {}

  def _late_readers(self, i: int, j: int) -> list[int]:
    key = (i, j)
    late = self._late.get(key)
    if late is None:
      v = self.outs[j]
      made = -1 if v is None else self.reads.producer.get(v, -1)
      late = self._late[key] = [r for r in self.reads.readers.get(i, ()) if r > made]
    return late

  def blocked(self, i: int, j: int) -> bool:
    v = self.outs[j]
    if v == i:
      return False
    key = (i, j)
    hit = self._blocked.get(key)
    if hit is None:
      late = self._late_readers(i, j)
      hit = self._blocked[key] = i in self.returned or bool(
        late and v is not None and v >= self.reads.n_inputs and self.reads.depends(v, late)
      )
    return hit

  def dies(self, i: int, j: int) -> bool:
    return self.outs[j] == i or (i not in self.returned and not self._late_readers(i, j))


class _Readers:
  """One flat order of operations (calls inlined, loops and conds as one operation each): which
  operations read each value, and which value each produces."""

  BUDGET = 1 << 20  # operation visits `depends` may make in all before it answers "no"

  def __init__(self, n_inputs: int):
    self.n_inputs = n_inputs
    self.next_id = n_inputs
    self.readers: dict[int, list[int]] = {}  # value -> operations reading it, in order
    self.producer: dict[int, int] = {}  # value -> the operation that makes it
    self.ops: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (values read, values made)
    self.visits = 0

  def walk(self, jaxpr, ids: list) -> list:
    env = dict(zip(jaxpr.invars, ids))

    def get(v):
      return None if isinstance(v, jcore.Literal) else env.get(v)

    for eqn in jaxpr.eqns:
      ins = [get(v) for v in eqn.invars]
      name = eqn.primitive.name
      if (name in _primitives.IDENTITY or name in _primitives.TRANSPARENT) and (
        len(ins) == len(eqn.outvars)
      ):
        env.update(zip(eqn.outvars, ins))
        continue
      sub = _inlined(eqn)
      if sub is not None:
        env.update(zip(eqn.outvars, self.walk(sub, ins)))
        continue
      made = tuple(range(self.next_id, self.next_id + len(eqn.outvars)))
      self.next_id += len(made)
      k = len(self.ops)
      read = tuple(dict.fromkeys(v for v in ins if v is not None))
      self.ops.append((read, made))
      for v in read:
        self.readers.setdefault(v, []).append(k)
      for v in made:
        self.producer[v] = k
      env.update(zip(eqn.outvars, made))
    return [get(v) for v in jaxpr.outvars]

  def depends(self, value: int, ops: list[int]) -> bool:
    """Whether any of `ops` reads `value` or a value computed from it."""
    start, end = self.producer.get(value, -1) + 1, max(ops)
    targets, reached = set(ops), {value}
    for k in range(start, end + 1):
      self.visits += 1
      if self.visits > self.BUDGET:
        return False
      read, made = self.ops[k]
      if any(v in reached for v in read):
        if k in targets:
          return True
        reached.update(made)
    return False


def _inlined(eqn):
  """The sub-jaxpr a call runs on its operands one to one (its results are the call's), or None."""
  if eqn.primitive.name not in _primitives.CALL and eqn.primitive.name not in _INLINED:
    return None
  for key in _CALL_PARAMS:
    sub = open_jaxpr(eqn.params.get(key))
    if (
      sub is not None
      and len(sub.invars) == len(eqn.invars)
      and (len(sub.outvars) == len(eqn.outvars))
    ):
      return sub
  return None


_INLINED = frozenset({"shard_map", "custom_jvp_call", "custom_vjp_call"})
