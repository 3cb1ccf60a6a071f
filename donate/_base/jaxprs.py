"""Jaxpr plumbing shared by every walker (dataflow, liveness, symmetric trace-back and rewrite).

Version differences between the supported JAX releases are handled here and nowhere else.

For an equation with sub-jaxprs (``jit``, ``scan``, ``while``, ``cond``, ``shard_map``,
``custom_jvp_call``, ``custom_vjp_call``, ``checkpoint``, ...) ``subs(eqn)`` lists each sub-jaxpr
with two maps: which outer operand feeds each inner input, and which outer result each inner
output becomes. ``transparent`` says whether a buffer passes through unchanged (a call, a
``shard_map`` body's local shard, a ``cond`` branch) or is a new buffer (a loop's carry or
stacked outputs).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax.extend as jex
import numpy as np

from donate._base import compat as _compat
from donate._base import loops as _loops
from donate._base import primitives as _primitives


@dataclasses.dataclass(frozen=True, slots=True)
class Sub:
  """A sub-jaxpr of an equation and how its variables connect to the equation's.

  Attributes:
    key: the param name holding it (``"jaxpr"``, ``"branches"``, ...).
    index: position in a tuple param (``cond`` branches), else None.
    jaxpr: the open ``Jaxpr``.
    in_map: for each inner input, the index of the outer operand feeding it, or None.
    out_map: for each inner output, the index of the outer result it becomes, or None.
    transparent: True if buffers pass through unchanged between inside and outside.
  """

  key: str
  index: int | None
  jaxpr: Any
  in_map: tuple[int | None, ...]
  out_map: tuple[int | None, ...]
  transparent: bool


def open_jaxpr(value):
  """The open `Jaxpr` of a `Jaxpr` or `ClosedJaxpr` param value; None for anything else."""
  return _open(value)


def _open(value):
  if isinstance(value, jex.core.ClosedJaxpr):
    return value.jaxpr
  if isinstance(value, jex.core.Jaxpr):
    return value
  return None


def _param_jaxprs(eqn):
  """Yields ``(key, index, open_jaxpr)`` for every jaxpr held in ``eqn.params``."""
  for key, value in eqn.params.items():
    if _open(value) is not None:
      yield key, None, _open(value)
    elif isinstance(value, (tuple, list)):
      for i, item in enumerate(value):
        if _open(item) is not None:
          yield key, i, _open(item)


def _identity(n_inner: int, n_outer: int, offset: int = 0) -> tuple[int | None, ...]:
  return tuple(i + offset if i + offset < n_outer else None for i in range(n_inner))


def _while_in_map(eqn, key: str, n_inner: int) -> tuple[int | None, ...]:
  loop = _loops.loop_layout(eqn)
  assert loop is not None, "a while equation has a loop layout"
  cn, bn = loop.cond_consts, loop.body_consts
  nconsts, const_at = (cn, 0) if key == "cond_jaxpr" else (bn, cn)
  return tuple(const_at + i if i < nconsts else cn + bn + i - nconsts for i in range(n_inner))


def _maps(eqn, key: str, jaxpr) -> tuple[tuple, tuple, bool]:
  name, n_in, n_out = eqn.primitive.name, len(eqn.invars), len(eqn.outvars)
  inner_in, inner_out = len(jaxpr.invars), len(jaxpr.outvars)
  if name == "cond":
    return _identity(inner_in, n_in, 1), _identity(inner_out, n_out), True
  if name == "while":
    out = _identity(inner_out, n_out) if key == "body_jaxpr" else (None,) * inner_out
    return _while_in_map(eqn, key, inner_in), out, False
  if inner_in != n_in:
    return (None,) * inner_in, (None,) * inner_out, False
  out = _identity(inner_out, n_out) if inner_out == n_out else (None,) * inner_out
  transparent = name in _primitives.CALL or name == "shard_map"
  return _identity(inner_in, n_in), out, transparent


def subs(eqn) -> list[Sub]:
  """Lists the sub-jaxprs of ``eqn`` with their variable maps.

  >>> import jax
  >>> eqn = jax.make_jaxpr(lambda x: jax.jit(jax.numpy.sin)(x))(1.0).eqns[0]
  >>> [(s.key, s.in_map, s.transparent) for s in subs(eqn)]
  [('jaxpr', (0,), True)]
  """
  found = []
  for key, index, jaxpr in _param_jaxprs(eqn):
    in_map, out_map, transparent = _maps(eqn, key, jaxpr)
    found.append(Sub(key, index, jaxpr, in_map, out_map, transparent))
  return found


def _rebuilt(old, new_open):
  if isinstance(old, jex.core.ClosedJaxpr):
    return old.replace(jaxpr=new_open)
  return new_open


def replace_subs(eqn, new: dict[tuple[str, int | None], Any]):
  """Returns ``eqn`` with the sub-jaxprs keyed ``(key, index)`` replaced by new open jaxprs.

  >>> import jax
  >>> eqn = jax.make_jaxpr(lambda x: jax.jit(jax.numpy.sin)(x))(1.0).eqns[0]
  >>> replace_subs(eqn, {}) is eqn
  True
  """
  if not new:
    return eqn
  params = dict(eqn.params)
  for (key, index), jaxpr in new.items():
    old = params[key]
    if index is None:
      params[key] = _rebuilt(old, jaxpr)
    else:
      items = list(old)
      items[index] = _rebuilt(items[index], jaxpr)
      params[key] = type(old)(items)
  return eqn.replace(params=params)


def is_var(atom) -> bool:
  """True for a jaxpr variable (not a literal, not a dropped output).

  >>> import jax
  >>> is_var(jax.make_jaxpr(jax.numpy.sin)(1.0).jaxpr.invars[0])
  True
  """
  return isinstance(atom, jex.core.Var) and not isinstance(atom, jex.core.DropVar)


def nbytes(aval) -> int:
  """Bytes of an array aval (0 for tokens and other non-arrays).

  >>> import jax
  >>> nbytes(jax.core.ShapedArray((2, 3), "float32"))
  24
  """
  shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
  if shape is None or dtype is None:
    return 0
  try:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes (PRNG keys) and symbolic shapes.
    return 0


def axes_of(params) -> tuple[str, ...]:
  """The mesh axis names a collective's params name (``axes`` or ``axis_name``), as strings.

  >>> axes_of({"axes": ("i", 0)})
  ('i',)
  >>> axes_of({"axis_name": "j"})
  ('j',)
  """
  value = params.get("axes", params.get("axis_name", ()))
  value = (value,) if isinstance(value, str) else tuple(value or ())
  return tuple(a for a in value if isinstance(a, str))


_COLUMN = re.compile(r"^(.*:\d+):\d+$")


def short_source_line(source_info) -> str:
  """The user's ``file:line`` (no function, no column) of an equation's ``source_info``, or ``""``.

  >>> import jax, jax.numpy as jnp
  >>> eqn = jax.make_jaxpr(jnp.sin)(1.0).eqns[0]
  >>> isinstance(short_source_line(eqn.source_info), str)
  True
  """
  if source_info is None:
    return ""
  try:
    text = _compat.source_line(source_info)
  except Exception:  # pylint: disable=broad-except  # pragma: no cover - best effort only.
    return ""
  text = text.split(" (")[0] if text and not text.startswith("<") else ""
  match = _COLUMN.match(text)
  return match.group(1) if match else text
