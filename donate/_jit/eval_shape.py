"""`jax.eval_shape` of a `donate.jit` function answers as of a `jax.jit` one.

JAX's `eval_shape` asks a function of JAX's own compiled type for its `trace(...).out_info`, which
keeps the function's `out_shardings` and output layouts, and wraps any other callable in a fresh
`jax.jit` whose outputs state neither: a `donate.jit(f, out_shardings=s)` would come back without
`s` (on a mesh that is not all Explicit) and without its layouts. JAX tests the exact type, which
no other class can have, so importing donate sets `jax.eval_shape` to JAX's own function behind a
test of donate's type: a `donate.jit` function answers with its own `eval_shape` (JAX's, of the
`jax.jit` donate traces through: the same out_info, and the same trace cache), anything else
reaches JAX's function unchanged. `from jax import eval_shape` run before donate is imported keeps
JAX's function.
"""

from __future__ import annotations

import functools

import jax

_JAX_EVAL_SHAPE = jax.eval_shape
_types: tuple[type, ...] = ()


def eval_shape(fun, *args, **kwargs):
  if isinstance(fun, _types):
    return fun.eval_shape(*args, **kwargs)
  return _JAX_EVAL_SHAPE(fun, *args, **kwargs)


# JAX's name, documentation and signature; pickled as this module's (so it unpickles as itself)
functools.update_wrapper(eval_shape, _JAX_EVAL_SHAPE, assigned=("__name__", "__doc__"))


def install(jit_type: type) -> None:
  """Sets `jax.eval_shape` to `eval_shape`: JAX's own, with `jit_type`'s functions answering for
  themselves."""
  global _types
  _types = (jit_type,)
  jax.eval_shape = eval_shape
