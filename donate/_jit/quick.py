"""A plain signature routed before its plan is made (`.trace()` and `.lower()`).

`signature.prepare` plans every leaf into records with words, then routes. A lowering reads only
the route: whether `jax.jit`'s own program runs the call, or the aliases to set on its module.
Most calls are plain (device arrays on one device, outputs whose shardings the program decides,
no annotations, donation asked for by `donate_argnums`/`donate_argnames` alone, every requested
leaf paired, a donor or unread); for those `prepare` routes from the pairs `_plan.quick` finds,
and the plan is made when first read (`signature.LazyPlan`: by `.plan`, a compile, a call), so
`trace()` and `lower()` make none. Any other call returns None and `signature.prepare` plans it.
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
  found = _quick.pairs_of(flow, leaves, outputs, requested, options.keep_unused)
  if found is None:
    return None
  prepared = _routed(fn, call, traced, paths, arrays, flow, requested, in_sh, leaves, *found)
  if CHECK:
    check(prepared, _signature.prepare(fn, call, traced))
  return prepared


def _routed(fn, call, traced, paths, arrays, flow, requested, in_sh, leaves, pairs, donors, fcfs):
  """The `Prepared` of the call: `jax.jit`'s own program where its first-come pairs are the
  plan's or differ from them only in buffers under `copy_threshold`, else its lowering with the
  plan's aliases (`signature._prepare`'s routes, from the same pairs)."""
  structure = call.without_leaves()
  why = "" if fcfs == pairs else _small_difference(fn.options.copy_threshold, leaves, pairs, fcfs)
  realiased = fcfs != pairs and not why
  later = _Later(fn, structure, traced, paths, arrays, why)
  dropped = frozenset() if fn.options.keep_unused else frozenset(_unread(flow))
  return _signature.Prepared(
    fn, structure, traced, _signature.LazyPlan(later), None, realiased,
    later.first_come if realiased else None, tuple(in_sh), (), None, dropped,
    _signature.Quick(requested, pairs, frozenset(donors)),
  )  # fmt: skip


class _Later:
  """What the plan made later reads (`signature.read_facts`' facts, from the call's structure
  and paths and its arrays' types, avals and shardings, not the arrays): called, the plan,
  paired as `why` says (`jax.jit`'s own pairs when it says why)."""

  __slots__ = ("fn", "structure", "traced", "paths", "arrays", "why")

  def __init__(self, fn, structure, traced, paths, arrays, why: str):
    self.fn, self.structure, self.traced = fn, structure, traced
    self.paths, self.arrays, self.why = paths, arrays, why

  def __call__(self):
    return self.first_come(self.why)

  def first_come(self, why: str):
    """The plan paired first come, first served as `jax.jit` pairs it (`why`), or by dataflow
    (`why` empty)."""
    types, avals, shardings = self.arrays
    infos = _binding.device_leaf_infos(list(self.paths), list(zip(types, avals, shardings)))
    facts = _facts.read_facts(self.fn, self.structure, self.traced, infos)
    return facts.plan(first_come=why)[0]


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
  assert quick.quick is not None and plan.pairs() == ours.pairs()
  assert not quick.realiased or plan.pairs() == quick.quick.pairs
