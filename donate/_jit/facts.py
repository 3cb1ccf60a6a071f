"""What planning reads of one traced call of a `donate.jit` function (`read_facts`), and the plan
made from it (`Facts.plan`): its jaxpr and dataflow, the argument leaves and outputs as the
planner sees them, their shardings and the leaves donation is asked for."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from donate import _symm
from donate._base import compat as _compat
from donate._base import errors as _errors
from donate._base import text as _text
from donate._jit import binding as _binding
from donate._jit import gate as _gate
from donate._jit import options as _options
from donate._jit import route as _route
from donate._plan import dataflow as _dataflow
from donate._plan import donation_plan as _donation_plan
from donate._plan import pairing as _pairing
from donate._plan.decision_types import Cause


@dataclasses.dataclass(frozen=True, eq=False)
class Function:
  """What every signature of one `donate.jit` function shares (no reference back to it)."""

  fun: Callable  # the user's function
  name: str  # its name in messages
  jitted: Callable  # the gate: jax.jit of the gated stand-in, with the user's keywords
  gate: _gate.Gate
  binding: _binding.Binding
  options: _options.Options

  @functools.cached_property
  def jit_miss(self) -> Callable:
    """What the gate's own dispatch runs on a miss: a call run as `jax.jit` runs it, returning
    `(outputs, fastpath data, drop)`."""
    return _compat.jit_cache_miss(self.jitted)


@dataclasses.dataclass(frozen=True, eq=False)
class Facts:
  """What planning reads of one traced call: its jaxpr (and the one marked for symmetric
  memory), its dataflow, the leaves and outputs as the planner sees them, their shardings."""

  fn: Function
  traced: Any
  marked: Any  # the traced jaxpr with symmetric-memory marks (itself when there are none)
  flow: Any  # _dataflow.Dataflow
  leaves: list
  outputs: list
  in_sh: list
  out_sh: list
  has_layouts: bool
  requested: Any  # the leaves donate_argnums/donate_argnames ask for
  xla_decides: bool  # pairs XLA decides after partitioning (sharded leaves)

  def plan(self, first_come: str = ""):
    """`(plan, comm)`: the donation plan with the symmetric-memory notes, and the values marked
    for symmetric memory. `first_come` (why only `jax.jit`'s own lowering can run this call):
    pair as `jax.jit` does."""
    options = self.fn.options
    plan = _pairing.make_plan(
      self.fn.name, self.leaves, self.outputs, self.requested, self.flow,
      keep_unused=options.keep_unused, adopt_inner=options.adopt_inner,
      xla_decides=self.xla_decides, first_come=first_come,
      disabled=bool(jax.config.jax_debug_nans),  # type: ignore[attr-defined]  # set at run time
    )  # fmt: skip
    comm = _symm.comm_buffers(self.marked)
    if comm:
      notes = plan.notes + tuple(_symm.comm_buffer_report(comm))
      size = _symm.collective_memory_bytes(comm)
      plan = dataclasses.replace(plan, notes=notes, collective_memory_bytes=size)
    if options.strict_unusable:
      _check_strict(self.fn.name, plan)
    return plan, comm


def _check_strict(name: str, plan) -> None:
  """Strict mode refuses a donated host leaf, and donation while JAX donates nothing."""
  if any(d.cause == Cause.NOT_A_DEVICE_BUFFER for d in plan.decisions if d.requested):
    raise _errors.DonationError(plan.explain_host())
  disabled = [d.path for d in plan.decisions if d.requested and d.cause == Cause.JAX_DEBUG_NANS]
  if disabled:
    raise _errors.DonationError(
      _errors.message(
        f"{name}: strict mode, and JAX donates nothing while jax_debug_nans is on",
        expected="donation of " + ", ".join(disabled),
        got="jax_debug_nans=True",
        fix="turn jax_debug_nans off to donate, or drop strict=True while debugging NaNs",
      )
    )


def read_facts(fn: Function, call: _binding.Call, traced, leaves=None) -> Facts:
  """What planning reads of a traced call; `leaves`: the argument leaves' `LeafInfo`s when read
  already (`_jit.quick` reads them before the call's arrays are let go), else the call's own."""
  marked = _symm.mark_required(traced.jaxpr)
  flow = _dataflow.analyze(marked, skip=_compat.traced_num_consts(traced))
  if leaves is None:
    leaves = _binding.leaf_infos(fn.binding.paths(call), call.leaves)
  leaves, outputs, in_sh, out_sh, has_layouts = _arguments(leaves, traced)
  # The devices of the inputs the program keeps (jax.jit prunes the others before it assigns them)
  kept = leaves if fn.options.keep_unused else [x for x, u in zip(leaves, flow.used) if u]
  xla_decides = _route.xla_decides(kept, outputs)
  requested = fn.binding.donated_leaves(call)
  return Facts(fn, traced, marked, flow, leaves, outputs, in_sh, out_sh, has_layouts, requested,
                xla_decides)  # fmt: skip


def _arguments(leaves: list, traced):
  """The argument leaves (their shardings completed) and outputs as the planner sees them, and
  the traced shardings."""
  in_sh, out_sh, has_layouts = _compat.traced_flat_shardings(traced)
  leaves = [
    dataclasses.replace(leaf, sharding_obj=s)
    if leaf.sharding_obj is None and s is not None
    else leaf
    for leaf, s in zip(leaves, in_sh)
  ]
  # The output tree rebuilt from the traced avals (as JAX rebuilds it from tracers): a pytree
  # class that checks its children when built sees arrays, never stand-ins.
  out_avals = list(traced.jaxpr.out_avals)
  out_paths = ["out" + k for k in _binding.key_paths(traced.out_tree, out_avals)]
  # (shape, dtype, memory space) -> the output's facts; (id of the type's sharding, memory
  # space) -> the sharding jax.jit states for it: each read once per call (the avals keep their
  # shardings alive)
  facts: dict[tuple, tuple[tuple[int, ...], str, int, str | None]] = {}
  typed: dict[tuple, Any] = {}
  found: list[dict] = []

  def meshes() -> dict:  # read for typed outputs only
    if not found:
      found.append(_route.concrete_meshes(leaves))
    return found[0]

  outputs = []
  for p, a, s in zip(out_paths, out_avals, out_sh):
    if not hasattr(a, "shape"):
      outputs.append(_donation_plan.OutputInfo(p, (), type(a).__name__, 0))
      continue
    space = getattr(a, "memory_space", None)
    key = (a.shape, a.dtype, space)
    fact = facts.get(key)
    if fact is None:
      shape, dtype, nbytes = tuple(a.shape), _text.dtype_name(a.dtype), _binding.aval_nbytes(a)
      fact = facts[key] = (shape, dtype, nbytes, _binding.memory_space(a))
    if s is None:
      t = (id(getattr(a, "sharding", None)), space)
      if t not in typed:
        typed[t] = _route.typed_out_sharding(a, meshes)
      s = typed[t]
    shape, dtype, nbytes, memory = fact
    outputs.append(_donation_plan.OutputInfo(p, shape, dtype, nbytes, s, memory_space=memory))
  return leaves, outputs, in_sh, out_sh, has_layouts
