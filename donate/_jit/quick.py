"""A plain signature routed before its plan is made (`.trace()` and `.lower()`).

`signature.prepare` plans every leaf into records with words, then routes. A lowering reads only
the route: whether `jax.jit`'s own program runs the call, or the aliases to set on its module.
Most calls are plain (device arrays on one device, outputs whose shardings the program decides,
no annotations, donation asked for by `donate_argnums`/`donate_argnames` alone, every requested
leaf paired, a donor or unread); for those `prepare` routes from the pairs `_plan.quick` finds,
and the plan is made when first read (`signature.LazyPlan`: by `.plan`, a compile, a call), so
`trace()` and `lower()` make none. When every requested leaf is under `copy_threshold`,
`jax.jit`'s own program runs the call whatever dataflow pairs (a pair that differs from its
first-come one costs a copy smaller than the threshold): the route is found from the leaves' sizes
alone (`_plan.quick.first_come_of`), and whether the plan pairs by dataflow or first come is
decided when it is made. Any other call returns None and `signature.prepare` plans it.
A call, or `.plan()`, compiles and reads the plan at once: the wrapper plans those in full.

The plan made later is the one `signature.prepare` makes from the same facts (the argument
leaves' facts are read now, the arrays themselves are not kept). With `DONATE_CHECK_QUICK` set
(the test suite sets it), every routed signature is checked against `signature.prepare`'s.
"""

from __future__ import annotations

import math
import os

import jax

from donate import _symm
from donate._base import compat as _compat
from donate._jit import binding as _binding
from donate._jit import facts as _facts
from donate._jit import route as _route
from donate._jit import signature as _signature
from donate._plan import quick as _quick
from donate._plan.decision_types import Action

CHECK = bool(os.environ.get("DONATE_CHECK_QUICK"))


def prepare(fn: _facts.Function, call: _binding.Call, traced) -> _signature.Prepared | None:
  """The signature of a plain call, routed, its plan made when first read; None for any other.
  Python's cyclic collector is paused meanwhile, as `signature.prepare` pauses it."""
  with _signature.collector_paused():
    return _prepare(fn, call, traced)


def _prepare(fn: _facts.Function, call: _binding.Call, traced) -> _signature.Prepared | None:
  options = fn.options
  debug_nans = jax.config.jax_debug_nans  # type: ignore[attr-defined]  # set at run time
  if options.strict_unusable or options.strict_copies or debug_nans:
    return None
  in_sh, out_sh, has_layouts = _compat.traced_flat_shardings(traced)
  if has_layouts or any(s is not None for s in out_sh):
    return None
  closed = traced.jaxpr
  if not _symm.nothing_to_mark() and _symm.mark_required(closed) is not closed:
    return None  # registered collectives, or values in a `symmetric_memory` context
  arrays, leaves = _leaves(call.leaves)
  outputs = None if leaves is None else _outputs(closed.out_avals)
  if arrays is None or leaves is None or outputs is None:
    return None
  flow = _quick.dataflow_of(closed, _compat.traced_num_consts(traced))
  if flow is None:
    return None
  paths, donated = fn.binding.structure(call)  # (a pytree class may check its children)
  requested = frozenset(donated)
  route = _route_of(fn.options, flow, leaves, outputs, requested)
  if route is None:
    return None
  prepared = _routed(fn, call, traced, paths, arrays, flow, requested, in_sh, *route)
  if CHECK:
    check(prepared, _signature.prepare(fn, call, traced))
  return prepared


def _route_of(options, flow, leaves, outputs, requested):
  """`(pairs, donors, fcfs, why)`: the plan's pairs and buffer donors, `jax.jit`'s first-come
  pairs, and why `jax.jit`'s own program runs it ("" where the plan's pairs are `jax.jit`'s or
  re-paired; None where it runs `jax.jit`'s own program, the plan pairing by dataflow or first
  come as `_Later` decides); None where the plan (or `jax.jit`'s first-come one that runs it)
  leaves a requested leaf unusable.

  When every requested leaf is under `copy_threshold`, no pair can differ from `jax.jit`'s in a
  buffer worth its copy: `jax.jit`'s own program runs the call whatever dataflow pairs, so only
  its first-come pairs are found (from sizes, without the dataflow's links)."""
  keep_unused, threshold = options.keep_unused, options.copy_threshold
  if all(leaves[i][2] < threshold for i in requested):
    first = _quick.first_come_of(flow, leaves, outputs, requested, keep_unused)
    return None if first is None else (*first, first[0], None)
  found = _quick.pairs_of(flow, leaves, outputs, requested, keep_unused)
  if found is None:
    return None
  pairs, donors, fcfs = found
  why = "" if fcfs == pairs else _small_difference(threshold, leaves, pairs, fcfs)
  if not why:
    return pairs, donors, fcfs, why
  first = _quick.first_come_of(flow, leaves, outputs, requested, keep_unused)
  return None if first is None else (*first, fcfs, why)  # the first-come plan runs


def _routed(fn, call, traced, paths, arrays, flow, requested, in_sh, pairs, donors, fcfs, why):
  """The `Prepared` of the call: `jax.jit`'s own program where its first-come pairs are the
  plan's or differ from them only in buffers under `copy_threshold` (`why` says why, or is None:
  see `_route_of`), else its lowering with the plan's aliases (`signature._prepare`'s routes,
  from the same pairs). `pairs` and `donors` are the plan's."""
  structure = call.without_leaves()
  realiased = fcfs != pairs and why == ""
  later = _Later(fn, structure, traced, paths, arrays, why, fcfs)
  dropped = frozenset() if fn.options.keep_unused else frozenset(_unread(flow))
  return _signature.Prepared(
    fn, structure, traced, _signature.LazyPlan(later), None, realiased,
    later.first_come if realiased else None, tuple(in_sh), (), None, dropped,
    _signature.Quick(requested, pairs, frozenset(donors)),
  )  # fmt: skip


class _Later:
  """What the plan made later reads (`signature.read_facts`' facts, from the call's structure
  and paths and its arrays' types, avals and shardings, not the arrays): called, the plan,
  paired as `why` says (`jax.jit`'s own pairs when it says why). `why` None: every requested
  leaf is under `copy_threshold`; the plan pairs by dataflow where that gives `jax.jit`'s
  first-come pairs (`fcfs`), else first come with the small difference's words, as
  `signature.prepare` decides."""

  __slots__ = ("fn", "structure", "traced", "paths", "arrays", "why", "fcfs")

  def __init__(self, fn, structure, traced, paths, arrays, why: str | None, fcfs: dict):
    self.fn, self.structure, self.traced = fn, structure, traced
    self.paths, self.arrays, self.why, self.fcfs = paths, arrays, why, fcfs

  def __call__(self):
    facts = self._facts()
    if self.why is not None:
      return facts.plan(first_come=self.why)[0]
    plan = facts.plan()[0]
    if plan.pairs() == self.fcfs:
      return plan
    return facts.plan(first_come=_route.small_difference(self.fn.options.copy_threshold))[0]

  def first_come(self, why: str):
    """The plan paired first come, first served as `jax.jit` pairs it (`why`), or by dataflow
    (`why` empty)."""
    return self._facts().plan(first_come=why)[0]

  def _facts(self) -> _facts.Facts:
    types, avals, shardings = self.arrays
    infos = _binding.device_leaf_infos(list(self.paths), list(zip(types, avals, shardings)))
    return _facts.read_facts(self.fn, self.structure, self.traced, infos)


def _small_difference(threshold: int, leaves, pairs, fcfs) -> str:
  """Why `jax.jit`'s own program runs a plan whose pairs differ from its own only in buffers
  under `copy_threshold` (`route.first_come_only`'s words), else ""."""
  for one, other in ((fcfs, pairs), (pairs, fcfs)):
    for i, j in one.items():
      if other.get(i) != j and leaves[i][2] >= threshold:
        return ""
  return _route.small_difference(threshold)


def _unread(flow) -> list[int]:
  return [i for i, u in enumerate(flow.used) if not u]


def _leaves(leaves: list) -> tuple[tuple[list, list, list], list] | tuple[None, None]:
  """`((types, avals, shardings), facts)`: each leaf's type, aval and sharding, and what pairing
  reads of it, when every leaf is a device array on one device in its memory; else
  `(None, None)`."""
  types, avals, shardings, facts = [], [], [], []
  seen: dict[tuple, object] = {}
  one: dict[int, bool] = {}  # id(sharding) -> on one device (the leaves keep them alive)
  device_types = _binding._DEVICE_TYPES  # noqa: SLF001 (concrete array types seen)
  for x in leaves:
    t = type(x)
    if t not in device_types and not _binding._is_device_array(x):  # noqa: SLF001
      return None, None
    aval, sharding = x.aval, x.sharding
    k = id(sharding)
    single = one.get(k)
    if single is None:
      single = one[k] = _route.num_devices(sharding) == 1
    if not single:
      return None, None
    key = (aval.shape, aval.dtype, k)
    fact = seen.get(key)
    if fact is None:
      if _binding.memory_space(aval) is not None:
        return None, None
      shape = tuple(aval.shape)
      fact = seen[key] = ((shape, aval.dtype), math.prod(shape), _binding.aval_nbytes(aval))
    types.append(t)
    avals.append(aval)
    shardings.append(sharding)
    facts.append(fact)
  return (types, avals, shardings), facts


def _outputs(avals) -> list | None:
  """What pairing reads of each output, when each is an array in device memory whose sharding
  its type does not state (`route.typed_out_sharding` is None); else None."""
  out = []
  seen: dict[tuple, object] = {}
  typed: dict[int, bool] = {}
  for a in avals:
    if not hasattr(a, "shape"):
      return None
    s = getattr(a, "sharding", None)
    k = id(s)
    plain = typed.get(k)
    if plain is None:
      mesh = getattr(s, "mesh", None)
      plain = typed[k] = (
        mesh is None or mesh.empty or jax.sharding.AxisType.Explicit not in mesh.axis_types
      )
    if not plain:
      return None
    key = (a.shape, a.dtype, getattr(a, "memory_space", None))
    fact = seen.get(key)
    if fact is None:
      if _binding.memory_space(a) is not None:
        return None
      shape = tuple(a.shape)
      fact = seen[key] = ((shape, a.dtype), math.prod(shape))
    out.append(fact)
  return out


def check(quick: _signature.Prepared, full: _signature.Prepared) -> None:
  """Asserts that a routed signature is the one `signature.prepare` makes for the same call (run
  on every routed signature with `DONATE_CHECK_QUICK` set, as the test suite sets it)."""
  assert (quick.native, quick.realiased, quick.dropped) == (
    full.native,
    full.realiased,
    full.dropped,
  ), (quick, full)
  assert full.inner is None and not full.comm and full.placement is None
  assert quick.in_shardings == full.in_shardings
  assert quick.as_jax_jit == full.as_jax_jit
  assert quick.donated == full.donated
  if quick.realiased:
    assert quick._alias_plan() == full._alias_plan()  # noqa: SLF001
  assert not full.plan.unusable
  planned = quick.planned
  plan, ours = full.plan, planned.anew() if isinstance(planned, _signature.LazyPlan) else planned
  assert str(plan) == str(ours) and plan.decisions == ours.decisions and plan.notes == ours.notes
  assert quick.quick is not None and plan.pairs() == ours.pairs() == quick.quick.pairs
  donors = {i for i, d in enumerate(plan.decisions) if d.action == Action.DONOR}
  assert donors == quick.quick.donors, (donors, quick.quick.donors)
