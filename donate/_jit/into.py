"""Preallocated outputs: `g.into(out)(*args)` writes each result into the caller's buffer.

The buffers in `out` become an extra first argument, and each result is declared an `alias` of its
buffer, so the planner pairs them explicitly and XLA writes the result straight into the caller's
memory (a loop that fills a `[T, ...]` output slice by slice updates that buffer in place). The
result arrays live at the buffers' addresses, so a caller can keep a stable address across steps by
passing the previous step's results back in. Shape, dtype and structure are checked while tracing,
before anything is consumed.
"""

from __future__ import annotations

import inspect

import jax
from jax import tree_util

from donate._base import errors as _errors
from donate._base.primitives import alias


def _is_none(x) -> bool:
  return x is None


def _check_and_alias(out, result):
  out_leaves, out_tree = tree_util.tree_flatten_with_path(out, is_leaf=_is_none)
  res_leaves, res_tree = tree_util.tree_flatten(result)
  if (
    out_tree.num_leaves != res_tree.num_leaves
    or tree_util.tree_structure(tree_util.tree_unflatten(out_tree, [0] * out_tree.num_leaves))
    != res_tree
  ):
    raise _errors.DonationError(
      _errors.message(
        "into(out): out does not match the structure of the function's output",
        expected=str(res_tree),
        got=str(out_tree),
        fix="pass a pytree shaped like the output, with None for outputs to allocate",
      )
    )
  written = []
  for (path, buf), res in zip(out_leaves, res_leaves):
    if buf is None:
      written.append(res)
      continue
    if tuple(buf.shape) != tuple(res.shape) or buf.dtype != res.dtype:
      raise _errors.DonationError(
        _errors.message(
          "into(out): a preallocated buffer does not fit its output",
          path="into" + tree_util.keystr(path),
          expected=f"{res.dtype}{list(res.shape)}",
          got=f"{buf.dtype}{list(buf.shape)}",
          fix="allocate it like the output (jnp.empty(shape, dtype)) or pass None",
        )
      )
    written.append(alias(buf, res, where="into(out)"))
  return tree_util.tree_unflatten(res_tree, written)


def check_buffers(out):
  """Every preallocated buffer is a `jax.Array` (or None): checked before anything is traced."""
  for path, buf in tree_util.tree_flatten_with_path(out, is_leaf=_is_none)[0]:
    if buf is not None and not isinstance(buf, jax.Array):
      raise _errors.DonationError(
        _errors.message(
          "into(out): a preallocated buffer must be a jax.Array",
          path="out" + tree_util.keystr(path),
          expected="a jax.Array",
          got=type(buf).__name__,
          fix="allocate it with jnp.empty/jnp.zeros on the device",
        )
      )


def with_out(fun, name: str):
  """`(into, *args, **kwargs) -> fun(*args, **kwargs)` written into `into`.

  >>> import jax.numpy as jnp
  >>> f = with_out(lambda x: x + 1, "f")
  >>> f.__name__, list(__import__("inspect").signature(f).parameters)
  ('f.into', ['into', 'x'])
  """

  def with_out_(into, *args, **kwargs):
    return _check_and_alias(into, fun(*args, **kwargs))

  with_out_.__name__ = with_out_.__qualname__ = name + ".into"
  try:
    signature = inspect.signature(fun)
  except (TypeError, ValueError):
    signature = None
  if signature is not None:  # keep the parameter names for paths and argnames
    out_param = inspect.Parameter("into", inspect.Parameter.POSITIONAL_ONLY)
    # What inspect.signature reads first: set on the function on purpose.
    with_out_.__signature__ = signature.replace(  # type: ignore[attr-defined]
      parameters=[out_param, *signature.parameters.values()]
    )
  return with_out_


class Into:
  """`g.into(out)`: call it like `g`; `.plan(...)` and `.lower(...)` as on `g`.

  `jitted` is the `donate.jit` of `with_out(g's function)`, made once per `g`.
  """

  def __init__(self, jitted, out):
    self._jitted, self._out = jitted, out

  def __call__(self, *args, **kwargs):
    return self._jitted(self._out, *args, **kwargs)

  def plan(self, *args, **kwargs):
    return self._jitted.plan(self._out, *args, **kwargs)

  def lower(self, *args, **kwargs):
    return self._jitted.lower(self._out, *args, **kwargs)
