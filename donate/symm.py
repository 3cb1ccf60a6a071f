"""Symmetric memory for collectives: annotate the values, place them on GPUs, check where they land.

Three ways to say "this value feeds a collective, give it symmetric memory":

* ``with_symmetric(x, axis_name)``: annotate a value, like ``with_sharding_constraint``;
* ``requires_symmetric(collective, argnums=0)``: declare once, per collective, which inputs need it
  (``registered_requirements`` lists the JAX collectives registered, ``clear_requirements`` undoes
  them);
* ``with symmetric_memory(axis_name):``: everything produced inside (e.g. a custom op's outputs).

``donate.jit`` does the rest by itself. To do it step by step with plain ``jax.jit``:

* ``mark_required(closed_jaxpr)``: registered collectives and contexts become explicit marks;
  ``comm_buffers(closed_jaxpr)``: each mark traced back to the op that materialises the value
  (one ``CommBuffer`` each);
* ``target_platform(shardings, default_backend)``: the platform a program compiles for;
  ``placement_policy(platform, comm_buffers)`` (a ``PlacementPolicy``) and
  ``compile_options_for(...)``: the XLA options that place the annotated collectives in collective
  memory on a GPU target; ``configure(...)``: XLA's process-wide per-collective setting, before
  JAX starts;
* ``placement_report(compiled_hlo_text, comm_buffers)``: where each annotated value landed
  (a ``PlacementReport`` of ``Placement``s; a missed placement warns ``SymmetricMemoryWarning``);
* ``xla_collective_memory(lowered, options)``: XLA's collective allocation and the
  ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB`` setting (``XlaCollectiveMemory``);
  ``sizing_table(rows)``: XLA's allocation beside the planner's pools (``SizingRow``);
* ``check_placement(fun, *args)``: all of the above for one program (a ``PlacementCheck``); see
  ``donate.targets`` for abstract H100/B200 meshes to compile for on any machine.

Outside a trace every annotation returns its input untouched, so eager code behaves as without the
library.

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
import dataclasses
import functools
from collections.abc import Sequence

import jax

from donate import planner
from donate._base.compat import bound_axis_names
from donate._base.errors import DonationError, message
from donate._base.errors import SymmetricMemoryWarning as SymmetricMemoryWarning
from donate._symm import check as _check
from donate._symm import xla as _xla
from donate._symm.check import PlacementCheck as PlacementCheck
from donate._symm.prim import check_bound, check_kind, mark, normalize_axes, scope_name
from donate._symm.registry import Requirement as Requirement
from donate._symm.registry import (
  builtin_argnums,
  collective_primitive_names,
  register,
  user_argnums,
  wrap_collective,
)
from donate._symm.registry import clear as _clear
from donate._symm.registry import requirements as _requirements
from donate._symm.report import CollectiveUse as CollectiveUse
from donate._symm.report import Placement as Placement
from donate._symm.report import PlacementReport as PlacementReport
from donate._symm.report import placement_report as placement_report
from donate._symm.rewrite import mark_required as mark_required
from donate._symm.size import SizingRow as SizingRow
from donate._symm.size import XlaCollectiveMemory as XlaCollectiveMemory
from donate._symm.size import sizing_table as sizing_table
from donate._symm.size import xla_collective_memory as xla_collective_memory
from donate._symm.trace import CommBuffer as CommBuffer
from donate._symm.trace import comm_buffers as comm_buffers
from donate._symm.xla import PlacementPolicy as PlacementPolicy
from donate._symm.xla import SpecEntry as SpecEntry
from donate._symm.xla import compile_options_for as compile_options_for
from donate._symm.xla import placement_policy as placement_policy
from donate._symm.xla import target_platform as target_platform
from donate._xla.hlo_dump import XlaAllocation as XlaAllocation

__all__ = [
  # annotations
  "with_symmetric",
  "requires_symmetric",
  "symmetric_memory",
  "registered_requirements",
  "clear_requirements",
  "Requirement",
  # the buffers they ask for
  "mark_required",
  "comm_buffers",
  "CommBuffer",
  # placement on a GPU target
  "target_platform",
  "placement_policy",
  "compile_options_for",
  "PlacementPolicy",
  "SpecEntry",
  "configure",
  # where the values landed, and how much collective memory it takes
  "placement_report",
  "PlacementReport",
  "Placement",
  "CollectiveUse",
  "SymmetricMemoryWarning",
  "xla_collective_memory",
  "XlaCollectiveMemory",
  "XlaAllocation",
  "sizing_table",
  "SizingRow",
  # all of it for one program
  "check_placement",
  "PlacementCheck",
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
  return _xla.configure(*collectives)


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
      raise DonationError(
        message(
          f"requires_symmetric found no collective primitive in {collective!r}",
          expected="a JAX collective",
          got=repr(collective),
        )
      )
    register(names, builtin_argnums(argnums, collective), kind)
    return collective
  if not callable(collective):
    raise DonationError(
      message(
        "requires_symmetric needs a collective",
        expected="a JAX collective, a primitive or a callable",
        got=type(collective).__name__,
        fix="pass the collective function itself",
      )
    )
  if axis_name is not None:
    normalize_axes(axis_name, where="requires_symmetric")
  return wrap_collective(collective, user_argnums(argnums, collective), kind, axis_name)


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


def check_placement(
  fun,
  *args,
  donate_argnums: int | Sequence[int] = (),
  enabled: bool = True,
  plan: bool = True,
  plan_time_limit: float = 0.5,
  **jit_kwargs,
) -> PlacementCheck:
  """Compiles ``fun`` for its arguments' target with the placement options, and reads the result.

  What ``donate.jit`` does on a GPU target, with plain ``jax.jit``: trace ``fun`` (registered
  collectives marked), find the comm buffers, take the target platform from the arguments'
  shardings, choose the options (``placement_policy``), compile with a buffer-assignment dump and
  read back where each annotated value landed and XLA's collective allocation.

  Args:
    fun: the program (a function you would pass to ``jax.jit``).
    *args: arrays or ``jax.ShapeDtypeStruct``s (e.g. sharded on ``donate.targets.gpu_mesh``).
    donate_argnums: positional arguments to donate (whole pytrees).
    enabled: False compiles without placement options (to compare).
    plan: also run ``planner.plan_memory`` on the same program for the pool size.
    plan_time_limit: seconds the planner's offset search may take per pool.
    **jit_kwargs: more ``jax.jit`` keywords (``out_shardings``, ...).

  Returns:
    A ``PlacementCheck``.

  >>> import jax.numpy as jnp
  >>> check = check_placement(lambda x: x + 1, jnp.ones(4))  # a CPU program: nothing to place
  >>> check.platform, check.policy.options, check.planned_bytes, check.memory.nbytes
  ('cpu', {}, 0, 0)
  """
  found = _check.check_placement(
    fun, *args, donate_argnums=donate_argnums, enabled=enabled, **jit_kwargs
  )
  if not plan:
    return found
  pools = planner.plan_memory(fun, *args, time_limit=plan_time_limit)
  return dataclasses.replace(found, planned_bytes=pools.collective_memory_bytes)
