"""``mark_required``: make registered requirements and context annotations explicit in a jaxpr.

Two rewrites, at every nesting depth:

* the operands of every equation whose primitive was registered with ``requires_symmetric`` are
  wrapped in ``symmetric_p`` (source ``"requires_symmetric"``; group = the collective's axes);
* the outputs of every equation traced inside ``symmetric_memory`` are wrapped in ``symmetric_p``
  (source ``"context"``). For an equation with sub-jaxprs (a ``jit``, ``scan``, custom op), only
  the outer equation counts: its outputs are the values produced inside the context.

Wrapping an output renames the producer's output, so later uses stay untouched. The result
evaluates to the same values (``symmetric_p`` is the identity).
"""

from __future__ import annotations

import jax.extend as jex

from donate._base.compat import bound_axis_names
from donate._base.errors import DonationError, message
from donate._base.jaxprs import axes_of, is_var, replace_subs, subs
from donate._symm.prim import context_spec, contexts_used, note_marked, symmetric_p
from donate._symm.registry import requirements


def _mark_eqn(var, out, *, axes, kind, source, source_info):
  params = {"axis_name": axes, "kind": kind, "source": source}
  note_marked()
  return jex.core.new_jaxpr_eqn([var], [out], symmetric_p, params, jex.core.no_effects, source_info)


def _check_context_axes(axes, kind, bound, eqn) -> None:
  missing = [a for a in axes if a not in bound]
  if missing:
    names = ", ".join(repr(b) for b in bound) if bound else "(none: not inside a shard_map)"
    raise DonationError(
      message(
        f"symmetric_memory(kind={kind!r}) names axis {missing[0]!r}, which is not bound at "
        f"'{eqn.primitive.name}'",
        expected=f"one of the enclosing shard_map axes {names}",
        got=repr(missing[0]),
        fix="enter symmetric_memory inside jax.shard_map over a mesh with that axis",
      )
    )


def _wrap_inputs(eqn, req, new_eqns):
  axes = axes_of(eqn.params)
  invars = list(eqn.invars)
  for i, var in enumerate(invars):
    if is_var(var) and (req.argnums == (0,) or i in req.argnums):
      marked = jex.core.Var(var.aval)
      new_eqns.append(
        _mark_eqn(
          var,
          marked,
          axes=axes,
          kind=req.kind,
          source="requires_symmetric",
          source_info=eqn.source_info,
        )
      )
      invars[i] = marked
  return eqn.replace(invars=invars)


def _wrap_outputs(eqn, spec, new_eqns):
  axes, kind = spec
  outvars, marks = list(eqn.outvars), []
  for i, var in enumerate(outvars):
    if is_var(var):
      fresh = jex.core.Var(var.aval)
      marks.append(
        _mark_eqn(fresh, var, axes=axes, kind=kind, source="context", source_info=eqn.source_info)
      )
      outvars[i] = fresh
  new_eqns.append(eqn.replace(outvars=outvars))
  new_eqns.extend(marks)


def _rewrite(jaxpr, reqs, *, in_context: bool, bound: tuple[str, ...]):
  new_eqns: list = []
  changed = False
  for eqn in jaxpr.eqns:
    spec = None if in_context else context_spec(eqn)
    inner_bound = bound + tuple(getattr(eqn.params.get("mesh"), "axis_names", ()))
    replaced = {}
    for sub in subs(eqn):
      new_sub, sub_changed = _rewrite(
        sub.jaxpr, reqs, in_context=in_context or spec is not None, bound=inner_bound
      )
      if sub_changed:
        replaced[(sub.key, sub.index)] = new_sub
    eqn = replace_subs(eqn, replaced)
    changed |= bool(replaced)
    req = reqs.get(eqn.primitive.name)
    if req is not None and eqn.primitive is not symmetric_p:
      eqn, changed = _wrap_inputs(eqn, req, new_eqns), True
    if spec is not None:
      _check_context_axes(spec[0], spec[1], bound, eqn)
      _wrap_outputs(eqn, spec, new_eqns)
      changed = True
    else:
      new_eqns.append(eqn)
  return (jaxpr.replace(eqns=new_eqns) if changed else jaxpr), changed


def mark_required(closed_jaxpr):
  """Returns ``closed_jaxpr`` with registered collectives' inputs and context outputs marked.

  Unchanged (the same object) if nothing is registered and no ``symmetric_memory`` context was
  used. Recurses into ``jit``, ``scan``, ``while``, ``cond``, ``shard_map``, custom_jvp/vjp and
  ``checkpoint`` bodies.

  Args:
    closed_jaxpr: a ``jax.extend.core.ClosedJaxpr``, e.g. from ``jax.make_jaxpr``.

  Returns:
    A ``ClosedJaxpr`` computing the same values, with ``symmetric_p`` equations added.

  Raises:
    DonationError: a ``symmetric_memory`` context names an axis no enclosing ``shard_map`` binds.

  >>> import jax, numpy as np
  >>> from jax import lax
  >>> from jax.sharding import Mesh, PartitionSpec as P
  >>> from donate._symm import registry
  >>> mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
  >>> f = jax.shard_map(lambda x: lax.ppermute(x, "i", [(0, 0)]), mesh=mesh, in_specs=P("i"),
  ...                   out_specs=P("i"))
  >>> registry.register({"ppermute"}, (0,), "symm_mem")
  >>> marked = mark_required(jax.make_jaxpr(f)(np.ones(4, np.float32)))
  >>> [e.primitive.name for e in marked.eqns[0].params["jaxpr"].eqns]
  ['symmetric', 'ppermute']
  >>> registry.clear()
  """
  reqs = requirements()
  if not reqs and not contexts_used():
    return closed_jaxpr  # nothing registered and no context: nothing to mark
  new, changed = _rewrite(closed_jaxpr.jaxpr, reqs, in_context=False, bound=bound_axis_names())
  return closed_jaxpr.replace(jaxpr=new) if changed else closed_jaxpr
