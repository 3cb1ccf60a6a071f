"""Which collectives need symmetric inputs: ``requires_symmetric``'s registry and wrappers.

For JAX's collectives the registry holds primitive names (``register``, ``requirements``,
``clear``); ``donate._symm.rewrite.mark_required`` marks their operands. A user collective is not
registered: ``wrap_collective`` returns a wrapper that marks the chosen arguments at each call.

JAX's collective functions bind different primitives on different JAX versions (``lax.psum`` binds
``psum_invariant`` on JAX 0.10 and 0.12, ``psum`` on older ones; ``all_gather`` may bind
``all_gather_invariant``), so a function is mapped to its primitives by tracing a tiny example
under a one-device ``shard_map`` and reading the collective primitive names off the jaxpr.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from donate._base.errors import DonationError, message
from donate._symm.prim import mark

COLLECTIVE_PRIMITIVES = frozenset(
  {
    "psum",
    "psum_invariant",
    "psum2",
    "pmax",
    "pmin",
    "pmean",
    "all_gather",
    "all_gather_invariant",
    "reduce_scatter",
    "psum_scatter",
    "ppermute",
    "all_to_all",
    "ragged_all_to_all",
    "pbroadcast",
    "psend",
    "precv",
  }
)
"""Primitive names of JAX's communication collectives, across the supported JAX versions."""

_EXAMPLE_AXIS = "_donate_probe"


def _examples():
  """Tiny calls of each JAX collective over a one-device axis, keyed by the function object."""
  a = _EXAMPLE_AXIS
  return {
    lax.psum: lambda x: lax.psum(x, a),
    lax.pmax: lambda x: lax.pmax(x, a),
    lax.pmin: lambda x: lax.pmin(x, a),
    lax.pmean: lambda x: lax.pmean(x, a),
    lax.all_gather: lambda x: lax.all_gather(x, a),
    lax.psum_scatter: lambda x: lax.psum_scatter(x, a),
    lax.ppermute: lambda x: lax.ppermute(x, a, [(0, 0)]),
    lax.all_to_all: lambda x: lax.all_to_all(x, a, 0, 0),
  }


def _traced_collectives(example) -> frozenset[str]:
  """Collective primitive names bound by ``example`` for varying and invariant inputs."""
  mesh = Mesh(np.array(jax.devices()[:1]), (_EXAMPLE_AXIS,))
  names = set()
  # Varying and invariant inputs, with and without shard_map's type checks (check_vma=False
  # binds the unchecked forms, e.g. psum instead of psum_invariant).
  for spec in (P(_EXAMPLE_AXIS), P()):
    for check_vma in (True, False):
      body = jax.shard_map(
        example, mesh=mesh, in_specs=spec, out_specs=P(_EXAMPLE_AXIS), check_vma=check_vma
      )
      closed = jax.make_jaxpr(body)(jnp.ones((1, 1), jnp.float32))
      inner = closed.eqns[0].params["jaxpr"]
      names |= {e.primitive.name for e in inner.eqns if e.primitive.name in COLLECTIVE_PRIMITIVES}
  return frozenset(names)


def collective_primitive_names(collective) -> frozenset[str] | None:
  """Returns the primitive names a JAX collective binds, or None if it is not one of JAX's.

  ``collective`` may be a JAX collective function, a ``jax.extend.core.Primitive`` or a
  primitive name.

  >>> from jax import lax
  >>> "ppermute" in collective_primitive_names(lax.ppermute)
  True
  >>> collective_primitive_names(print) is None
  True
  """
  if isinstance(collective, jex.core.Primitive):
    return frozenset({collective.name})
  if isinstance(collective, str):
    return frozenset({collective})
  example = _examples().get(collective)
  if example is None:
    return None
  return _traced_collectives(example)


@dataclasses.dataclass(frozen=True, slots=True)
class Requirement:
  """One registration: inputs ``argnums`` of primitive ``primitive`` must be symmetric.

  >>> Requirement("ppermute", (0,), "symm_mem").kind
  'symm_mem'
  """

  primitive: str
  argnums: tuple[int, ...]
  kind: str


_requirements: dict[str, Requirement] = {}
_lock = threading.Lock()


def register(names, argnums: tuple[int, ...], kind: str) -> None:
  """Registers primitives ``names`` so ``mark_required`` marks their ``argnums`` operands.

  >>> register({"ppermute"}, (0,), "symm_mem"); "ppermute" in requirements()
  True
  >>> clear()
  """
  with _lock:
    for name in names:
      _requirements[name] = Requirement(name, tuple(argnums), kind)


def any_registered() -> bool:
  """Whether any collective is registered now (`requirements()` without its copy)."""
  return bool(_requirements)


def requirements() -> dict[str, Requirement]:
  """Returns a snapshot of the registered requirements, keyed by primitive name.

  >>> requirements()
  {}
  """
  with _lock:
    return dict(_requirements)


def clear() -> None:
  """Forgets every registration (wrappers returned for user functions keep working).

  >>> clear(); requirements()
  {}
  """
  with _lock:
    _requirements.clear()


def builtin_argnums(argnums, collective) -> tuple[int, ...]:
  """Checks ``argnums`` for a JAX collective: only argument 0 (the operand pytree) is data.

  >>> builtin_argnums(0, "psum")
  (0,)
  """
  nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
  if nums != (0,):
    raise DonationError(
      message(
        f"requires_symmetric({getattr(collective, '__name__', collective)}) got argnums "
        f"{argnums!r}, but a JAX collective's only array argument is its first",
        expected="argnums=0",
        got=repr(argnums),
        fix="pass argnums=0 (every operand is marked)",
      )
    )
  return nums


def user_argnums(argnums, fn) -> tuple[int, ...]:
  """Checks ``argnums`` for a user collective: non-negative ints.

  >>> user_argnums(1, print), user_argnums((0, 2), print)
  ((1,), (0, 2))
  """
  nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
  if not nums or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in nums):
    raise DonationError(
      message(
        f"requires_symmetric({getattr(fn, '__name__', fn)}) got bad argnums",
        expected="a non-negative int or a tuple of them",
        got=repr(argnums),
        fix="pass argnums=0 for the first argument",
      )
    )
  return nums


def _call_axis_name(fn, bound, axis_name):
  if axis_name is not None:
    return axis_name
  arguments = bound.arguments if bound is not None else {}
  for key in ("axis_name", "axes"):
    if key in arguments:
      return arguments[key]
  raise DonationError(
    message(
      f"requires_symmetric cannot find the group of a call to {getattr(fn, '__name__', fn)}",
      expected="an 'axis_name' (or 'axes') argument in the call",
      got="neither",
      fix="pass axis_name=... to requires_symmetric",
    )
  )


def _bind(sig, args, kwargs):
  if sig is None:
    return None
  try:
    return sig.bind(*args, **kwargs)
  except TypeError:
    return None


def wrap_collective(fn, argnums: tuple[int, ...], kind: str, axis_name):
  """Returns ``fn`` wrapped to mark its ``argnums`` arguments symmetric at each call.

  The group is ``axis_name``, or else the call's ``axis_name`` (or ``axes``) argument. The wrapper
  carries its ``Requirement`` as ``__donate_requirement__``.

  >>> def my_allreduce(x, axis_name):
  ...   return x
  >>> wrap_collective(my_allreduce, (0,), "symm_mem", None).__donate_requirement__
  Requirement(primitive='my_allreduce', argnums=(0,), kind='symm_mem')
  """
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    sig = None
  names = list(sig.parameters) if sig is not None else []

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    bound = _bind(sig, args, kwargs)
    axes = _call_axis_name(fn, bound, axis_name)
    if bound is None:
      args = list(args)
      for i in argnums:
        args[i] = mark(args[i], axes, kind=kind, source="requires_symmetric")
      return fn(*args, **kwargs)
    for i in argnums:
      if i < len(names) and names[i] in bound.arguments:
        bound.arguments[names[i]] = mark(
          bound.arguments[names[i]], axes, kind=kind, source="requires_symmetric"
        )
    return fn(*bound.args, **bound.kwargs)

  # The mark `registered_requirement` reads back: an attribute set on the function on purpose.
  requirement = Requirement(getattr(fn, "__name__", "collective"), argnums, kind)
  wrapper.__donate_requirement__ = requirement  # type: ignore[attr-defined]
  return wrapper
