"""The third part of `compat`: the step traced again with its checkpoints changed, for the memory
doctor's remedies (`donate._profile.variants`, `remat`, `layers`).

With `compat` and `compat_aliases`, the only modules that import ``jax._src`` (each import says
why no public API serves).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any

import jax
import jax.extend as jex
from jax._src import ad_checkpoint as _ad_checkpoint
from jax._src import config as _config
from jax._src import source_info_util as _source_info_util
from jax._src.lax.control_flow import loops as _loops

from donate._base.compat import is_valid_jax_value

# A memory profile measures remedies by tracing the user's step again with a change applied
# below the user's code: every `jax.checkpoint` with another policy, every `lax.scan` body
# checkpointed. The change has to be made where the checkpoint is bound, before autodiff reads
# its policy (a traced training step holds the policy's outcome, not the policy): `remat_p` and
# `scan_p` are private, and no public API binds them with other parameters. `jit`'s trace cache
# would answer the new trace with the old jaxpr: `hlo_source_file_canonicalization_regex` is in
# the trace context and, set to a pattern that matches nothing, changes nothing else.
_RETRACE_LOCK = threading.RLock()
_RETRACES = itertools.count()


def _binds_checkpoint(jaxpr) -> bool:
  for e in jaxpr.eqns:
    if e.primitive is _ad_checkpoint.remat_p:
      return True
    for v in e.params.values():
      for j in v if isinstance(v, (tuple, list)) else (v,):
        inner = getattr(j, "jaxpr", j)
        if isinstance(inner, jex.core.Jaxpr) and _binds_checkpoint(inner):
          return True
  return False


def _checkpointed(closed, policy):
  """`closed` (a ClosedJaxpr) as one `jax.checkpoint` of itself with `policy`, same types."""
  body = jax.checkpoint(jex.core.jaxpr_as_fun(closed), policy=policy, prevent_cse=False)
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.in_avals]
  return jax.make_jaxpr(body)(*avals)


# The what-if of checkpointing each layer of a model unrolled by a Python loop: the function
# `jax.grad` / `jax.vjp` differentiates is traced to a jaxpr first, then evaluated with each
# repeated layer call's equations inside one `jax.checkpoint`, as if the user had wrapped the
# layer. Autodiff must see the checkpoint, so the change is made where JAX's `vjp` and
# `linearize` start (`ad.linearize`, private; no public API reaches inside a traced `grad`), and
# equations are bound as `core.eval_jaxpr` binds them (their source info kept).
from jax._src.interpreters import ad as _ad  # noqa: E402


def _bind_eqn(eqn, env: dict) -> None:
  """Binds one equation on the values of `env` and writes its outputs there."""
  read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]  # noqa: E731
  params = eqn.primitive.get_bind_params(eqn.params)
  name_stack = _source_info_util.current_name_stack() + eqn.source_info.name_stack
  context = _source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)
  with context, eqn.ctx.manager:
    ans = eqn.primitive.bind(*map(read, eqn.invars), **params)
  outs = ans if eqn.primitive.multiple_results else (ans,)
  for v, x in zip(eqn.outvars, outs):
    if not isinstance(v, jex.core.DropVar):
      env[v] = x


def _eval_grouped(closed, spans, policy, args) -> list:
  """Evaluates `closed` on `args` with the equations of each `[start, stop)` of `spans` inside
  one `jax.checkpoint(..., policy=policy)`."""
  jaxpr, env = closed.jaxpr, dict[Any, Any]()
  env.update(zip(jaxpr.constvars, closed.consts))
  env.update(zip(jaxpr.invars, args))
  read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]  # noqa: E731
  starts = dict(spans)
  i, eqns = 0, jaxpr.eqns
  while i < len(eqns):
    if i not in starts:
      _bind_eqn(eqns[i], env)
      i += 1
      continue
    stop = starts[i]
    group = eqns[i:stop]
    made = {v for e in group for v in e.outvars}
    ins = list(
      dict.fromkeys(
        v for e in group for v in e.invars if not isinstance(v, jex.core.Literal) and v not in made
      )
    )
    later = {
      v
      for v in (*(v for e in eqns[stop:] for v in e.invars), *jaxpr.outvars)
      if not isinstance(v, jex.core.Literal)
    }
    outs = [v for e in group for v in e.outvars if v in later]

    def layer(*vals, group=group, ins=ins, outs=outs):
      local = dict(zip(ins, vals))
      for e in group:
        _bind_eqn(e, local)
      return [local[v] for v in outs]

    results = jax.checkpoint(layer, policy=policy)(*map(read, ins))
    env.update(zip(outs, results))
    i = stop
  return [read(v) for v in jaxpr.outvars]


def _layers_checkpointed(traceable, policy, split):
  """`traceable` (what `ad.linearize` differentiates) with the spans `split(eqns)` finds in its
  jaxpr each checkpointed with `policy`; non-array outputs (an aux's) kept as they are."""

  def fun(*args):
    leaves, tree = jax.tree_util.tree_flatten(args)
    kept: dict = {}

    def flat(*xs):
      out = traceable(*jax.tree_util.tree_unflatten(tree, xs))
      ol, kept["tree"] = jax.tree_util.tree_flatten(out)
      arrays = [isinstance(x, jax.core.Tracer) or is_valid_jax_value(x) for x in ol]
      kept["static"] = [None if a else x for x, a in zip(ol, arrays)]
      return [x for x, a in zip(ol, arrays) if a]

    specs = [
      jax.ShapeDtypeStruct(
        jax.typeof(x).shape, jax.typeof(x).dtype, weak_type=jax.typeof(x).weak_type
      )
      for x in leaves
    ]
    closed = jax.make_jaxpr(flat)(*specs)
    spans = [s for r in split(closed.jaxpr.eqns) for s in r.spans]
    arrays = iter(_eval_grouped(closed, spans, policy, leaves))
    out = [next(arrays) if x is None else x for x in kept["static"]]
    return jax.tree_util.tree_unflatten(kept["tree"], out)

  return fun


@contextlib.contextmanager
def retracing(policy=None, loop_policy=None, calls=None):
  """While open, traces of a `jax.jit` function are made afresh; every `jax.checkpoint` bound
  uses `policy` (when given: a `jax.checkpoint_policies` policy), every `lax.scan` body without
  a checkpoint is checkpointed with `loop_policy` (when given), and, with `calls` `(policy,
  split)`, every function differentiated by `jax.grad` / `jax.vjp` has the equation spans
  `split(eqns)` finds (`layers.calls`) checkpointed with that policy. Process-wide while open:
  other threads tracing meanwhile see it too."""
  remat_p, scan_p = _ad_checkpoint.remat_p, _loops.scan_p
  saved = {p: p.__dict__.get("bind") for p in (remat_p, scan_p)}
  bind_remat, bind_scan = remat_p.bind, scan_p.bind
  linearize = _ad.linearize

  def linearize_layers(traceable, *args, **kwargs):
    return linearize(_layers_checkpointed(traceable, *calls), *args, **kwargs)

  def remat_bind(*args, **params):
    return bind_remat(*args, **{**params, "policy": policy})

  def scan_bind(*args, jaxpr, **params):
    if not _binds_checkpoint(jaxpr.jaxpr):
      jaxpr = _checkpointed(jaxpr, loop_policy)
    return bind_scan(*args, jaxpr=jaxpr, **params)

  with _RETRACE_LOCK:
    if policy is not None:
      remat_p.bind = remat_bind
    if loop_policy is not None:
      scan_p.bind = scan_bind
    if calls is not None:
      _ad.linearize = linearize_layers
    try:
      with _config.hlo_source_file_canonicalization_regex(f"donate-retrace-{next(_RETRACES)}^"):
        yield
    finally:
      _ad.linearize = linearize
      for prim, old in saved.items():
        if old is None:
          prim.__dict__.pop("bind", None)
        else:
          prim.bind = old


def binds_checkpoint(closed) -> bool:
  """Whether a ClosedJaxpr, or a jaxpr inside it, binds `jax.checkpoint`'s primitive."""
  return _binds_checkpoint(closed.jaxpr)
