"""Liveness and buffer planning: comm-buffer pools per (kind, group) and the regular arena.

`plan_memory` traces a function like `jax.jit` would, walks the jaxpr (recursing into calls,
loops, conds and `shard_map`) to find every buffer's live range, and packs the buffers into
memory: one pool per (comm kind, group) for values marked with `donate.with_symmetric` (or by a
custom op run under `donate.symmetric_memory`), planned in isolation, and one arena for everything
else. `assign_offsets` is the offset engine under every pool.

>>> import jax, jax.numpy as jnp
>>> from donate import planner
>>> plan = planner.plan_memory(lambda x: jnp.sin(x) * 2, jnp.ones(16), alignment=64)
>>> plan.arena.nbytes, plan.collective_memory_bytes  # x, and sin's buffer reused in place by * 2
(128, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from donate._base import errors as _errors
from donate._base import text as _text
from donate._jit import binding as _binding
from donate._planner import liveness, passes
from donate._planner.memory_plan import MemoryPlan as MemoryPlan
from donate._planner.offsets import OffsetAssignment as OffsetAssignment
from donate._planner.offsets import assign_offsets as assign_offsets
from donate._planner.records import Allocation as Allocation
from donate._planner.records import Buffer as Buffer
from donate._planner.records import Copy as Copy
from donate._planner.records import LiveRange as LiveRange
from donate._planner.records import Pool as Pool

__all__ = [
  "Allocation",
  "Buffer",
  "Copy",
  "LiveRange",
  "MemoryPlan",
  "OffsetAssignment",
  "Pool",
  "assign_offsets",
  "plan_memory",
]


def plan_memory(
  fun: Callable[..., Any],
  *args: Any,
  strict: bool = False,
  alignment: int = 64,
  time_limit: float = 2.0,
  inplace: bool = True,
  donate_argnums: int | Sequence[int] = (),
  **kwargs: Any,
) -> MemoryPlan:
  """Traces `fun` on `args` and plans where every buffer lives.

  Buffers are the values that need memory: arguments, intermediates (including those inside
  `jit`, `scan`, `while_loop`, `cond` and `shard_map` bodies, whose live ranges fall inside the
  span of their equation) and outputs. Sizes are those the jaxpr sees, so values inside
  `shard_map` count their per-device blocks.

  Comm buffers (values that must live in symmetric memory) go into one pool per (kind, group),
  planned in isolation: they never share memory with regular buffers or with another pool, and
  take no part in in-place reuse. A comm buffer the program returns is copied out into a regular
  buffer at its last use (`strict=True` raises instead); a comm argument is copied in.

  Args:
    fun: the function to plan, as you would pass it to `jax.jit`.
    *args: arrays or `jax.ShapeDtypeStruct`s (any pytree of them); nothing is executed.
    strict: raise `donate.DonationError` instead of copying comm buffers out (or in).
    alignment: every offset is a multiple of this many bytes.
    time_limit: seconds each pool's offset assignment may take (a deadline: the best packing
      found by then is used; fast greedy packings come first, then the search).
    inplace: let an elementwise result take over a same-sized regular operand dying at that step.
    donate_argnums: positional arguments whose buffers the program may free after their last
      use (in-function `donate.donate_buffer` marks count too).
    **kwargs: keyword arguments for `fun`.

  Returns:
    A `MemoryPlan`: `pools` (comm), `arena` (regular), `copies`, `buffers`, the totals, a text
    listing (`str(plan)`), `plan.plot()` and an HTML view for notebooks.

  Raises:
    DonationError: in strict mode, for comm buffers that are outputs or arguments; for a value
      marked for two different (kind, group) pools.

  >>> import jax, jax.numpy as jnp
  >>> from donate import planner
  >>> def f(x, y):
  ...   return jnp.tanh(x @ y) + 1
  >>> plan = planner.plan_memory(f, jax.ShapeDtypeStruct((8, 8), jnp.float32), jnp.ones((8, 8)))
  >>> [(b.name, b.role, str(b.live_range)) for b in plan.buffers]
  [('x', 'input', '[0, 3)'), ('y', 'input', '[0, 3)'), ('buf2', 'regular', '[0, 2)'),
   ('buf3', 'regular', '[1, 3)'), ('out', 'output', '[2, 3)')]
  >>> plan.arena.nbytes, plan.arena.lower_bound_bytes  # tanh and + reuse the matmul's buffer
  (768, 768)
  """
  closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*args, **kwargs)
  closed, comm = _comm_buffers(closed)
  lv = liveness.live_ranges(closed)
  return passes.plan(
    lv,
    name=getattr(fun, "__name__", type(fun).__name__),
    arg_names=_arg_names(fun, args, kwargs),
    out_names=_out_names(out_shape),
    donated=_donated_leaves(args, kwargs, donate_argnums),
    comm=_comm_values(comm, lv),
    strict=strict,
    alignment=alignment,
    time_limit=time_limit,
    inplace=inplace,
  )


def _arg_names(fun, args, kwargs) -> list[str]:
  """Names of the flat arguments as JAX's `args_info` gives them: parameter name plus pytree path,
  e.g. ``params['w']`` (`donate.jit`'s plans name them the same way)."""
  names = _binding.ArgumentNames.read(fun)
  return [
    names.of(path[1].idx if path[0].idx == 0 else path[1].key) + _text.key_path(path[2:])
    for path, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
  ]


def _out_names(out_shape) -> list[str]:
  return [
    "out" + jax.tree_util.keystr(path)
    for path, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]
  ]


def _donated_leaves(args, kwargs, donate_argnums) -> set[int]:
  """Flat indices of the leaves of the donated positional arguments."""
  nums = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
  bad = [n for n in nums if not -len(args) <= n < len(args)]
  if bad:
    raise _errors.DonationError(
      _errors.message(
        "donate_argnums out of range",
        expected=f"indices into {len(args)} positional arguments",
        got=repr(bad),
        fix="donate only positional arguments that exist",
      )
    )
  donated = {n % len(args) for n in nums}
  flat: set[int] = set()
  first = 0
  for i, arg in enumerate(args):
    count = len(jax.tree_util.tree_leaves(arg))
    if i in donated:
      flat.update(range(first, first + count))
    first += count
  return flat


def _comm_buffers(closed):
  """Makes registered and context requirements explicit, then lists the comm buffers."""
  from donate import _symm  # the symmetric-memory trace-back (a sibling module)

  mark_required = getattr(_symm, "mark_required", None)
  if mark_required is not None:
    closed = mark_required(closed)
  return closed, _symm.comm_buffers(closed)


def _comm_values(comm_buffers, lv: liveness.Liveness) -> dict[int, tuple[str, tuple[str, ...]]]:
  """Value id -> (kind, group) for every value that must live in a comm-buffer pool."""
  comm: dict[int, tuple[str, tuple[str, ...]]] = {}
  for cb in comm_buffers:
    key = (cb.kind, tuple(cb.group))
    for value_id in lv.instances.get(cb.var, ()):
      if comm.setdefault(value_id, key) != key:
        raise _errors.DonationError(
          _errors.message(
            "a value is marked for two comm-buffer pools",
            path=f"{cb.producer} output",
            expected=f"one (kind, group), {comm[value_id]}",
            got=repr(key),
            fix="mark a copy of the value for the second group, e.g. with_symmetric(x + 0, ...)",
          )
        )
  return comm
