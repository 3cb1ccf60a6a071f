"""What the package knows about primitives: one table of facts, and its own two primitives.

The table (``IDENTITY``, ``VIEW``, ``ELEMENTWISE``, ``IN_PLACE``, ``CALL``, ``CUSTOM``,
``PRNG_KEY``, ``KEY_PARTS``, ``LOOP``)
is the only place that names JAX primitives; every jaxpr walker (dataflow, liveness, the copy
explanations, the symmetric-memory trace-back) reads it. Names are as jaxprs spell them; a few
exist only in some JAX versions (``tests/test_primitives.py`` checks every name against the
installed JAX and the list of version-specific ones).

The annotation primitives `donate_buffer_p` and `alias_p` are identities on values. They exist so
that intent is recorded in the jaxpr at any nesting depth (inside `scan`, `cond`, nested `jit`,
`shard_map`, `custom_vjp`, `vmap` and `grad`), where the planner finds it. They lower to nothing:
the lowering returns the operand unchanged, and the planner turns the intent into buffer donors
and input/output aliases on the outermost module.
"""

from __future__ import annotations

import weakref

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from donate._base import compat as _compat
from donate._base import errors as _errors

# fmt: off
# The name tables, filled line by line (a formatter's one name per line would take 200 lines).
IDENTITY = frozenset({
    "pvary", "pbroadcast", "pcast", "symmetric", "donate_buffer", "donate_alias",
    "optimization_barrier",
})
"""The output is the operand's buffer itself (marks, casts between shard_map's varying types)."""

TRANSPARENT = frozenset({
    "sharding_constraint", "reshard", "mesh_cast", "device_put", "layout_constraint",
})
"""Sharding and layout annotations: each result is its operand, perhaps laid out anew. Dataflow
passes through them (an in-place update stays one through `with_sharding_constraint`)."""

VIEW = frozenset({"reshape", "squeeze", "bitcast_convert_type"})
"""Re-views the operand's bytes (a bitcast in XLA) when the byte size is unchanged."""

ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "add_any", "and", "asin", "asinh", "atan", "atan2", "atanh",
    "cbrt", "ceil", "clamp", "conj", "convert_element_type", "copy", "copy_p", "cos", "cosh",
    "digamma", "div", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "imag",
    "integer_pow", "lgamma", "log", "log1p", "logistic", "max", "min", "mul", "neg", "nextafter",
    "not", "or", "pow", "real", "reduce_precision", "rem", "round", "rsqrt", "select_n",
    "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "sqrt",
    "square", "stop_gradient", "sub", "tan", "tanh", "xor",
})
"""One output computed element by element: it may take over a dying operand of the same size."""

IN_PLACE = frozenset({
    "dynamic_update_slice", "scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul",
    "scatter-min", "scatter_min", "scatter-max", "scatter_max", "scatter-sub", "scatter_sub",
})
"""Writes into its first operand: XLA updates that buffer in place when it may."""

CALL = frozenset({"pjit", "jit", "closed_call", "core_call", "checkpoint", "remat", "remat2"})
"""Calls whose results are their body's results (no new buffer): walkers look inside."""

CUSTOM = frozenset({
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin",
    "custom_transpose_call", "pure_callback", "io_callback", "ffi_call", "custom_call",
})
"""Opaque producers (custom derivatives, callbacks, FFI): their outputs are new buffers together."""

PRNG_KEY = frozenset({
    "random_wrap", "random_unwrap", "random_split", "random_fold_in", "random_clone",
})
"""PRNG key operations: the key (or the raw `uint32` key data) each makes is derived from its
first operand, a key or a key's data (`jax.random.split`, `fold_in`, `wrap_key_data`,
`key_data`)."""

KEY_PARTS = frozenset({
    "slice", "squeeze", "reshape", "dynamic_slice", "gather", "broadcast_in_dim", "unstack",
    "split",
})
"""Ops that pick keys out of a batch of keys (`k1, k2 = jax.random.split(key)`: slice and
squeeze on jax 0.10, unstack on jax 0.12): every key they pick is still derived from the key that
batch was made from."""

LOOP = frozenset({"scan", "while"})
"""Loops; ``donate._base.loops.loop_layout`` decodes their operands."""

TRACE_BACK_VIEWS = VIEW | frozenset({
    "pvary", "pbroadcast", "pcast", "symmetric", "donate_buffer", "broadcast_in_dim",
    "convert_element_type", "transpose", "copy", "copy_p", "reduce_precision",
})
"""One-operand ops XLA fuses into their producer: a value's buffer is traced back through them."""

VERSION_SPECIFIC = frozenset({
    "pcast", "copy_p", "scatter_add", "scatter_mul", "scatter_min", "scatter_max", "scatter_sub",
    "pjit", "core_call", "checkpoint", "remat", "closed_call", "custom_vjp_call_jaxpr",
    "custom_transpose_call", "custom_call", "mesh_cast",
})
"""Names in the table that some supported (or older/newer) JAX versions do not define."""

OWN = frozenset({"symmetric", "donate_buffer", "donate_alias"})
"""This package's own primitives (defined here and in ``donate._symm``)."""
# fmt: on

# The jaxprs of `donate.jit` functions (as `jax.jit` traced them). A call of one inside another
# trace that `jax.jit` serves from its cache carries its donation in the call's `donated_invars`
# instead of `donate_buffer` markers: an enclosing `donate.jit` honours it as its own marker.
_donate_jit_jaxprs: weakref.WeakSet = weakref.WeakSet()


def remember_donate_jit(closed_jaxpr) -> None:
  """Records a jaxpr traced for a `donate.jit` function."""
  _donate_jit_jaxprs.add(closed_jaxpr)


def is_donate_jit(closed_jaxpr) -> bool:
  """Whether a call's jaxpr is one traced for a `donate.jit` function."""
  try:
    return closed_jaxpr in _donate_jit_jaxprs
  except TypeError:  # not weakly referenceable: not one of ours
    return False


donate_buffer_p = Primitive("donate_buffer")
alias_p = Primitive("donate_alias")


def _donate_buffer_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return donate_buffer_p.bind(x), t


def _donate_buffer_batch(args, dims):
  return donate_buffer_p.bind(args[0]), dims[0]


def _donate_buffer_transpose(ct, x):
  del x  # an identity: the cotangent passes through (`jax.linear_transpose` of a donating jit)
  return [ct]


donate_buffer_p.def_impl(lambda x, **_: x)
donate_buffer_p.def_abstract_eval(lambda x: x)
ad.primitive_jvps[donate_buffer_p] = _donate_buffer_jvp
ad.primitive_transposes[donate_buffer_p] = _donate_buffer_transpose
batching.primitive_batchers[donate_buffer_p] = _donate_buffer_batch
mlir.register_lowering(donate_buffer_p, lambda ctx, x, **_: [x])


def _alias_abstract(src, dst, *, where=None):
  del where
  if src.shape != dst.shape or src.dtype != dst.dtype:
    raise _errors.DonationError(
      _errors.message(
        f"alias(src, dst) needs src and dst of one shape and dtype ({_compat.source_line()})",
        expected=f"dst of src's type {src.str_short()}",
        got=f"dst {dst.str_short()}",
        fix="alias only a value computed to replace src, e.g. alias(x, x + 1)",
      )
    )
  return dst


def _alias_jvp(primals, tangents, **params):
  (src, dst), (_, t_dst) = primals, tangents
  return alias_p.bind(src, dst, **params), t_dst


def _alias_batch(args, dims, **params):
  src, dst = args
  sd, dd = dims
  if sd is batching.not_mapped and dd is batching.not_mapped:
    return alias_p.bind(src, dst, **params), dd
  size = src.shape[sd] if sd is not batching.not_mapped else dst.shape[dd]
  src = batching.bdim_at_front(src, sd, size)
  dst = batching.bdim_at_front(dst, dd, size)
  return alias_p.bind(src, dst, **params), 0


def _alias_transpose(ct, src, dst, **params):
  del dst, params  # the result is `dst`: its cotangent is the result's, `src`'s none
  return [ad.Zero(src.aval) if ad.is_undefined_primal(src) else None, ct]


alias_p.def_impl(lambda src, dst, **_: dst)
alias_p.def_abstract_eval(_alias_abstract)
ad.primitive_jvps[alias_p] = _alias_jvp
ad.primitive_transposes[alias_p] = _alias_transpose
batching.primitive_batchers[alias_p] = _alias_batch
mlir.register_lowering(alias_p, lambda ctx, src, dst, **_: [dst])


def donate_buffer(x):
  """Donates the input buffer that `x` comes from, from anywhere in a `donate.jit` function.

  `x` must trace back to an input leaf of the outermost `donate.jit` function (through nested
  `jit`, `scan`/`fori_loop`/`while_loop` carries, `cond` operands, `shard_map`, `checkpoint`, custom
  derivatives, `vmap` and `grad`); that leaf is donated even if `donate_argnums` did not name it.
  Use the returned value from then on: reading the original `x` in a later operation is a
  `DonationError` (the buffer has been given away). Works on pytrees; outside `jit` it returns `x`.

  Args:
    x: an array or a pytree of arrays.

  Returns:
    The same value, to be used instead of `x`.

  >>> import jax.numpy as jnp, donate
  >>> @donate.jit
  ... def step(w):
  ...   w = donate.donate_buffer(w)
  ...   return w * 2
  >>> w = jnp.ones(4)
  >>> step(w).tolist(), w.is_deleted()
  ([2.0, 2.0, 2.0, 2.0], True)
  """
  return jax.tree.map(lambda v: donate_buffer_p.bind(v), x)


def alias(src, dst, *, where: str | None = None):
  """Declares that `dst` is written into `src`'s buffer, as if the update were in place.

  The output that `dst` flows to reuses the input buffer `src` comes from (chains resolve to the
  root: `c = alias(b, ...)` with `b = alias(a, ...)` lands in `a`). `src` and `dst` need one shape
  and dtype; `src` is consumed, so reading it afterwards is a `DonationError`. Works on pytrees of
  the same structure; outside `jit` it returns `dst`.

  Args:
    src: the value whose buffer is given up.
    dst: the value that takes it over.
    where: how plans name this annotation (default: the caller's source line).

  Returns:
    `dst`, to be used from then on.

  >>> import jax.numpy as jnp, donate
  >>> @donate.jit
  ... def swap_update(a, b):
  ...   return donate.alias(b, b.at[0].set(1.0)), donate.alias(a, a + 1.0)
  >>> a, b = jnp.zeros(3), jnp.zeros(3)
  >>> x, y = swap_update(a, b)
  >>> x.tolist(), y.tolist(), a.is_deleted(), b.is_deleted()
  ([1.0, 0.0, 0.0], [1.0, 1.0, 1.0], True, True)
  """
  return jax.tree.map(lambda s, d: alias_p.bind(s, d, where=where), src, dst)
