"""Symmetric-memory annotations for collectives (source document 2, the symmetric-memory RFC).

Three ways to say "this value feeds a collective, give it symmetric memory":

* ``with_symmetric(x, axis_name)``: annotate a value, like ``with_sharding_constraint``;
* ``requires_symmetric(collective, argnums=0)``: declare once, per collective, which inputs need it;
* ``with symmetric_memory(axis_name):``: everything produced inside (e.g. a custom op's outputs).

``donate.jit`` then traces the function, calls ``mark_required`` (registered collectives and
contexts become explicit marks), finds the buffers with ``comm_buffers`` (each mark traced back to
the op that materialises the value) and lowers with the marks visible in StableHLO. On a GPU target
(``target_platform``), ``compile_options_for`` gives the XLA options that place the annotated
collectives in collective memory, ``placement_report`` reads from the compiled program where each
annotated value landed, and ``xla_collective_memory`` sizes XLA's collective allocation;
``check_placement`` runs all of it with plain ``jax.jit`` (see ``donate.targets`` for abstract
H100/B200 meshes). Outside a trace every annotation returns its input untouched, so eager code
behaves as without the library.

>>> import jax, jax.numpy as jnp, numpy as np
>>> from jax.sharding import Mesh, PartitionSpec as P
>>> from donate import symm
>>> mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
>>> def step(x):
...   return jax.lax.psum(symm.with_symmetric(jnp.sin(x), "i"), "i")
>>> f = jax.shard_map(step, mesh=mesh, in_specs=P("i"), out_specs=P())
>>> [(b.kind, b.group, b.producer, b.nbytes, b.feeds_collective)
...  for b in symm.comm_buffers(jax.make_jaxpr(f)(np.ones(4, np.float32)))]
[('symm_mem', ('i',), 'sin', 16, True)]
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import jax

from donate._errors import DonationError
from donate._errors import message
from donate._symm import COLLECTIVE_MEMORY_SPACE as COLLECTIVE_MEMORY_SPACE
from donate._symm import CommBuffer as CommBuffer
from donate._symm import SymmetricMemoryWarning as SymmetricMemoryWarning
from donate._symm import collective_memory_bytes as collective_memory_bytes
from donate._symm import collective_memory_env as collective_memory_env
from donate._symm import collective_memory_mb as collective_memory_mb
from donate._symm import comm_buffer_report as comm_buffer_report
from donate._symm import comm_buffers as comm_buffers
from donate._symm import gpu_compile_options as gpu_compile_options
from donate._symm import mark
from donate._symm import mark_required as mark_required
from donate._symm import symmetric_p as symmetric_p
from donate._symm_compat import bound_axis_names
from donate._symm_prim import check_bound
from donate._symm_prim import check_kind
from donate._symm_prim import normalize_axes
from donate._symm_prim import scope_name
from donate._symm_registry import Requirement as Requirement
from donate._symm_registry import builtin_argnums
from donate._symm_registry import clear as _clear
from donate._symm_registry import collective_primitive_names
from donate._symm_registry import register
from donate._symm_registry import requirements as _requirements
from donate._symm_place import PlacementPolicy as PlacementPolicy
from donate._symm_place import compile_options_for as compile_options_for
from donate._symm_place import configure as _configure
from donate._symm_place import placement_policy as placement_policy
from donate._symm_place import target_platform as target_platform
from donate._symm_aot import PlacementCheck as PlacementCheck
from donate._symm_aot import check_placement as check_placement
from donate._symm_report import Placement as Placement
from donate._symm_report import PlacementReport as PlacementReport
from donate._symm_report import placement_report as placement_report
from donate._symm_size import SizingRow as SizingRow
from donate._symm_size import XlaCollectiveMemory as XlaCollectiveMemory
from donate._symm_size import collective_allocation as collective_allocation
from donate._symm_size import sizing_table as sizing_table
from donate._symm_size import xla_collective_memory as xla_collective_memory
from donate._symm_size import xla_dump_options as xla_dump_options

__all__ = [
    "COLLECTIVE_MEMORY_SPACE", "CommBuffer", "Placement", "PlacementCheck", "PlacementPolicy", "PlacementReport",
    "Requirement", "SizingRow", "SymmetricMemoryWarning", "XlaCollectiveMemory",
    "check_placement", "clear_requirements", "collective_allocation", "collective_memory_bytes",
    "collective_memory_env", "collective_memory_mb", "comm_buffer_report", "comm_buffers",
    "compile_options_for", "configure", "gpu_compile_options", "mark_required",
    "placement_policy", "placement_report", "registered_requirements", "requires_symmetric",
    "sizing_table", "symmetric_memory", "symmetric_p", "target_platform", "with_symmetric",
    "xla_collective_memory", "xla_dump_options",
]


def configure(*collectives: str):
  """Places matching collectives of every program in collective memory (process-wide, GPU).

  XLA has per-compile options only for all-gather, collective-permute and ragged all-to-all
  (``compile_options_for`` uses them); all-reduce, reduce-scatter and all-to-all are placed
  selectively only by XLA's process-wide ``--xla_enable_nccl_symmetric_buffers_for_collectives``,
  which XLA reads from ``XLA_FLAGS`` once, when JAX starts its first backend. ``configure`` sets
  it. Call it right after ``import donate``, before any array or compile exists; every later
  program's matching collectives, annotated or not, are placed (``placement_report`` says so).

  Args:
    *collectives: entries ``"Op[:max_bytes[:dtype]]"``, Op one of AllReduce, AllGather,
      ReduceScatter, AllToAll, CollectivePermute, RaggedAllToAll (e.g. ``"AllReduce:8388608:F32"``:
      float32 all-reduces of at most 8 MiB). No entries clears the setting.

  Returns:
    The parsed entries.

  Raises:
    DonationError: a bad entry; jaxlib < 0.12 (its XLA does not know the flag and would abort
      the process); or the call came too late (JAX has started a backend, XLA_FLAGS was read).

  >>> import donate, jax, jax.numpy as jnp
  >>> _ = jnp.ones(2)  # a backend exists now, so XLA_FLAGS has been read
  >>> try:
  ...   configure("AllReduce:8388608:F32")
  ... except donate.DonationError as e:
  ...   print("too late" in str(e) or "jaxlib" in str(e))
  True
  """
  return _configure(*collectives)


def with_symmetric(x, axis_name, *, kind: str = "symm_mem"):
  """Annotates ``x`` (a pytree) as living in symmetric memory for the group ``axis_name``.

  Like ``jax.lax.with_sharding_constraint``: returns ``x``'s values unchanged and records the
  intent in the jaxpr (one ``symmetric`` equation per leaf). Differentiable (the tangent is marked
  too), batchable, and usable in ``scan`` and ``shard_map`` bodies. Outside any trace it returns
  ``x`` itself.

  Args:
    x: an array or pytree of arrays.
    axis_name: the mesh axis name, or a tuple of names, of the collective's group.
    kind: the comm-buffer type; one pool is planned per (kind, group).

  Returns:
    ``x``, marked.

  Raises:
    DonationError: an axis name is not bound where ``with_symmetric`` is traced (use it inside
      ``jax.shard_map`` over a mesh with that axis).

  >>> import jax, jax.numpy as jnp, numpy as np
  >>> x = jnp.arange(4.0)
  >>> with_symmetric(x, "i") is x   # eager: untouched
  True
  >>> jax.make_jaxpr(lambda v: with_symmetric(v, "i"), axis_env=[("i", 1)])(x).eqns[0].primitive
  symmetric
  """
  return mark(x, axis_name, kind=kind, source="with_symmetric")


def _parameter_names(sig) -> list[str]:
  return list(sig.parameters) if sig is not None else []


def _call_axis_name(fn, sig, bound, axis_name):
  if axis_name is not None:
    return axis_name
  arguments = bound.arguments if bound is not None else {}
  for key in ("axis_name", "axes"):
    if key in arguments:
      return arguments[key]
  raise DonationError(message(
      f"requires_symmetric cannot find the group of a call to {getattr(fn, '__name__', fn)}",
      expected="an 'axis_name' (or 'axes') argument in the call", got="neither",
      fix="pass axis_name=... to requires_symmetric"))


def _bind(fn, sig, args, kwargs):
  if sig is None:
    return None
  try:
    return sig.bind(*args, **kwargs)
  except TypeError:
    return None


def _wrap_collective(fn, argnums: tuple[int, ...], kind: str, axis_name):
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    sig = None
  names = _parameter_names(sig)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    bound = _bind(fn, sig, args, kwargs)
    axes = _call_axis_name(fn, sig, bound, axis_name)
    if bound is None:
      args = list(args)
      for i in argnums:
        args[i] = mark(args[i], axes, kind=kind, source="requires_symmetric")
      return fn(*args, **kwargs)
    for i in argnums:
      if i < len(names) and names[i] in bound.arguments:
        bound.arguments[names[i]] = mark(bound.arguments[names[i]], axes, kind=kind,
                                         source="requires_symmetric")
    return fn(*bound.args, **bound.kwargs)

  wrapper.__donate_requirement__ = Requirement(getattr(fn, "__name__", "collective"), argnums, kind)
  return wrapper


def _argnums(argnums, fn) -> tuple[int, ...]:
  nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
  if not nums or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in nums):
    raise DonationError(message(
        f"requires_symmetric({getattr(fn, '__name__', fn)}) got bad argnums",
        expected="a non-negative int or a tuple of them", got=repr(argnums),
        fix="pass argnums=0 for the first argument"))
  return nums


def requires_symmetric(collective=None, argnums=0, *, kind: str = "symm_mem", axis_name=None):
  """Declares, once per collective, which of its inputs must live in symmetric memory.

  For JAX's collectives (``lax.psum``, ``pmax``, ``pmin``, ``pmean``, ``all_gather``,
  ``psum_scatter``, ``ppermute``, ``all_to_all``), a ``jax.extend.core.Primitive`` or a primitive
  name: registers the primitive(s) it binds, so ``mark_required`` (run by ``donate.jit``) marks the
  operands of every such call at any depth; returns ``collective`` unchanged.

  For any other callable (your own collective, a custom_vjp op): returns a wrapper that applies
  ``with_symmetric`` to the ``argnums`` arguments, with the group taken from the call's
  ``axis_name`` (or ``axes``) argument unless ``axis_name`` is given here. Also a decorator:
  ``@requires_symmetric`` or ``@requires_symmetric(argnums=1)``.

  Args:
    collective: the collective (function, primitive or primitive name); None for decorator use.
    argnums: index or indices of the inputs that must be symmetric (0 for JAX's collectives).
    kind: the comm-buffer type.
    axis_name: the group, for user collectives without an ``axis_name`` argument.

  Returns:
    ``collective`` itself (JAX collectives) or a marking wrapper (user collectives).

  >>> from jax import lax
  >>> requires_symmetric(lax.ppermute) is lax.ppermute
  True
  >>> sorted(registered_requirements())
  ['ppermute']
  >>> @requires_symmetric
  ... def my_allreduce(x, axis_name):
  ...   return lax.psum(x, axis_name)
  >>> my_allreduce.__donate_requirement__.argnums
  (0,)
  >>> clear_requirements()
  """
  if collective is None:
    return functools.partial(requires_symmetric, argnums=argnums, kind=kind, axis_name=axis_name)
  check_kind(kind, where="requires_symmetric")
  names = collective_primitive_names(collective)
  if names is not None:
    if not names:
      raise DonationError(message(
          f"requires_symmetric found no collective primitive in {collective!r}",
          expected="a JAX collective", got=repr(collective)))
    register(names, builtin_argnums(argnums, collective), kind)
    return collective
  if not callable(collective):
    raise DonationError(message(
        "requires_symmetric needs a collective", expected="a JAX collective, a primitive or a "
        "callable", got=type(collective).__name__, fix="pass the collective function itself"))
  if axis_name is not None:
    normalize_axes(axis_name, where="requires_symmetric")
  return _wrap_collective(collective, _argnums(argnums, collective), kind, axis_name)


def registered_requirements() -> dict[str, Requirement]:
  """Returns the primitives registered by ``requires_symmetric``, keyed by primitive name.

  >>> registered_requirements()
  {}
  """
  return _requirements()


def clear_requirements() -> None:
  """Undoes every ``requires_symmetric`` registration of JAX collectives (for tests).

  Wrappers already returned for user collectives keep marking their inputs.

  >>> clear_requirements(); registered_requirements()
  {}
  """
  _clear()


@contextlib.contextmanager
def symmetric_memory(axis_name, *, kind: str = "symm_mem"):
  """Context manager: values produced inside it become symmetric (for group ``axis_name``).

  Every equation traced inside carries a recognisable ``jax.named_scope`` in its name stack;
  ``mark_required`` wraps the outputs of those equations in ``symmetric_p`` (source
  ``"context"``) and ``comm_buffers`` reports them. A custom op called inside (custom_vjp/jvp
  function, callback, FFI call, nested ``jit``) gets all of its outputs made symmetric; outputs
  that never reach a collective are reported as over-allocated. Outside a trace it does nothing.
  Under ``jax.grad``, backward-pass equations that JAX records inside the same scope may be marked
  too (they are reported as never reaching a collective); put the context inside the
  differentiated function's forward code only, or use ``with_symmetric`` for precise marks.

  Args:
    axis_name: the mesh axis name(s) of the group.
    kind: the comm-buffer type.

  Raises:
    DonationError: at entry if named axes are bound here but ``axis_name`` is not one of them;
      otherwise in ``mark_required`` if no enclosing ``shard_map`` binds it.

  >>> import jax, jax.numpy as jnp
  >>> with symmetric_memory("i"):
  ...   y = jnp.sin(jnp.ones(2))   # eager: nothing happens
  >>> float(y[0]) == float(jnp.sin(1.0))
  True
  """
  axes = normalize_axes(axis_name, where="symmetric_memory")
  check_kind(kind, where="symmetric_memory")
  if bound_axis_names():
    check_bound(axes, where="symmetric_memory")
  with jax.named_scope(scope_name(axes, kind)):
    yield
