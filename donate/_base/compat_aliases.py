"""The other half of `compat`: the aliases donate's plan sets on a module JAX lowered.

With `compat`, the only module that imports ``jax._src`` (each import says why no public API
serves).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from typing import Any

import jax.extend as jex

# `jax.export` reads the module of `Lowered._lowering` (a `pxla.MeshComputation`, checked by type)
# and keeps the user's argument and result order, so donate's pairs (when they are not `jax.jit`'s
# first come, first served) go onto `main`'s argument attributes of that module, lowered for the
# plan alone (`lowering_parameters_for`). Reading and writing a module needs JAX's MLIR context
# (its dialects registered); no public API gives one.
from jax._src.interpreters import mlir as _mlir

from donate._base.compat import lowered_closed_over_refs, lowered_kept_leaves

_ALIAS, _DONOR = "tf.aliasing_output", "jax.buffer_donor"
_OURS = (_ALIAS, _DONOR)


@dataclasses.dataclass(frozen=True)
class _PlanKey:
  """A lowering rule that never runs: it makes `mlir.LoweringParameters` (part of the key of
  JAX's lowering caches, `pjit._pjit_lower` and `pxla._cached_lowering_to_hlo`) name one alias
  plan, for a primitive no jaxpr holds."""

  key: tuple

  def __call__(self, *args, **kwargs):  # pragma: no cover - its primitive is never bound
    raise AssertionError("donate's alias-plan key is not a lowering rule")


_PLAN_PRIMITIVE = jex.core.Primitive("donate_alias_plan")  # never bound: names a cache entry


def lowering_parameters_for(
  parameters, managed: set[int], aliases: dict[int, int], donors: set[int], pinned: set[int]
):
  """JAX's lowering parameters (`Traced.lower(_private_parameters=...)`, those given or the
  default) whose cache entries belong to one alias plan alone: the one `lowered_with_aliases`
  then sets, given the same `managed`, `aliases`, `donors` and `pinned`. With JAX's own, the
  module (and its executable) would be the one JAX's caches hand every other lowering of the
  trace (`jax.jit`'s first-come program of it); keyed by the plan, it is the plan's own, changed
  in place, and found ready by a second lowering of the plan. No public API lowers with other
  aliases or without JAX's caches.
  """
  key = (frozenset(managed), frozenset(aliases.items()), frozenset(donors), frozenset(pinned))
  rule = ((_PLAN_PRIMITIVE, _PlanKey(key)),)
  if parameters is None:  # JAX's default parameters, but for the rule
    return _mlir.LoweringParameters(override_lowering_rules=rule)
  rules = tuple(parameters.override_lowering_rules or ()) + rule
  return dataclasses.replace(parameters, override_lowering_rules=rules)


def lowered_with_aliases(
  jax_lowered,
  n_traced: int,
  managed: set[int],
  aliases: dict[int, int],
  donors: set[int],
  pinned: Container[int] = frozenset(),
):
  """`jax_lowered`, lowered under `lowering_parameters_for` (its module is the plan's own),
  changed so that each argument leaf of `managed` is aliased to user output `aliases[i]`, or
  offered as a buffer donor when in `donors`, or neither.

  `n_traced` traced constants precede the argument leaves in the lowering's kept inputs, which
  end `main`'s arguments but for the refs the function closes over (dimension variables, effect
  tokens and constants come first); effect tokens come first among its results. An output aliased
  to a leaf of `pinned` whose sharding the module leaves to propagation gets the leaf's sharding
  attribute (an alias needs both sides sharded alike; `jax.jit` states it by `out_shardings`).
  A module that already says exactly that (the plan lowered before) is left as it is.
  """
  lowering = jax_lowered._lowering
  kept, _ = lowered_kept_leaves(jax_lowered)  # hoisted constants lead `main`, not counted here
  ir = _mlir.ir
  original = lowering.stablehlo()
  context = original.context  # the lowering's own (a new context costs milliseconds)
  with context, ir.Location.unknown(context):
    main: Any = ir.SymbolTable(original.operation)["main"]  # a func.FuncOp, typed as any OpView
    if "arg_attrs" not in main.attributes:
      return jax_lowered
    args: list[Any] = list(ir.ArrayAttr(main.attributes["arg_attrs"]))  # one per argument
    n_args = len(args) - lowered_closed_over_refs(jax_lowered)
    if n_args < len(kept):
      return jax_lowered
    tokens = _leading_tokens(lowering, main)
    results = None
    if pinned and "res_attrs" in main.attributes:
      results = list(ir.ArrayAttr(main.attributes["res_attrs"]))
    changed = False
    first = n_args - len(kept)
    i32 = ir.IntegerType.get_signless(32)
    for k, i in enumerate(kept):
      leaf = i - n_traced
      if leaf not in managed:
        continue
      attrs = ir.DictAttr(args[first + k])
      n_attrs = len(attrs)  # a wide pytree's arguments have one of donate's or none
      others = n_attrs > 1 or (n_attrs == 1 and _ALIAS not in attrs and _DONOR not in attrs)
      if others:
        others = n_attrs > (_ALIAS in attrs) + (_DONOR in attrs)
        if others and "jax.global_constant" in attrs:
          continue
      target = tokens + aliases[leaf] if leaf in aliases else None
      new = {n: v for n, v in _as_dict(attrs).items() if n not in _OURS} if others else {}
      if target is not None:
        new[_ALIAS] = ir.IntegerAttr.get(i32, target)
      elif leaf in donors:
        new[_DONOR] = ir.BoolAttr.get(True)
      made = ir.DictAttr.get(new)
      if made != attrs:  # (attributes are unique in their context: compared by identity)
        changed = True
        args[first + k] = made
      if target is not None and leaf in pinned and results is not None and target < len(results):
        out = ir.DictAttr(results[target])
        given = [n for n in _SHARDING_ATTRS if n in attrs]
        if given and not any(n in out for n in _SHARDING_ATTRS):
          results[target] = ir.DictAttr.get({**_as_dict(out), given[0]: attrs[given[0]]})
          changed = True
    if changed:
      main.attributes["arg_attrs"] = ir.ArrayAttr.get(args)
      if results is not None:
        main.attributes["res_attrs"] = ir.ArrayAttr.get(results)
  return jax_lowered


def _leading_tokens(lowering, main) -> int:
  """How many effect tokens lead `main`'s results: none without ordered effects (the result
  types, a list built on each read, 4 ms at 10,000 results, are then not read)."""
  if not lowering.compile_args.get("ordered_effects", True):
    return 0
  types = main.type.results
  tokens = 0
  while tokens < len(types) and "token" in str(types[tokens]):
    tokens += 1
  return tokens


def _as_dict(attrs) -> dict[str, Any]:
  """A DictAttr's entries as a dict. Read by index and by name: iterating a DictAttr (through
  its NamedAttributes) costs about ten times as much, 60 ms for 10,000 arguments."""
  names = [attrs[k].name for k in range(len(attrs))]
  return {name: attrs[name] for name in names}


_SHARDING_ATTRS = ("sdy.sharding", "mhlo.sharding")  # Shardy's, and GSPMD's
