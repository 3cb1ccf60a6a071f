"""How a planned signature runs: `jax.jit`'s own program, the gate's lowering with the plan's
aliases, or a replay of a marked program (see `signature`). Pure functions of the plan and the
facts it was made from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from donate._base import compat as _compat
from donate._base.text import format_bytes
from donate._plan import keys as _keys
from donate._plan.decision_types import Kind, Request


class FirstCome:
  """`jax.jit`'s own first-come pairs for a plan's call, computed once for both checks (whether
  the plan is `jax.jit`'s own, and whether it differs only in small buffers). Leaves and outputs
  are the plan's own facts, keyed by memory kind as `jax.jit` keys donations."""

  def __init__(self, options, plan, requested, flow):
    self.options, self.plan, self.flow = options, plan, flow
    self.leaves = [d.info for d in plan.decisions]
    self.jax_donated = _jax_donated(options, requested, flow)
    self.donates_more = not _consumed(plan) <= set(self.jax_donated)
    self._pairs: tuple[dict[int, int], dict[int, int]] | None = None

  def pairs(self) -> tuple[dict[int, int], dict[int, int]]:
    """`(first come, planned)`: {leaf: output} of `jax.jit`'s pairing and of the plan."""
    if self._pairs is None:
      fcfs = _keys.fcfs_pairs(self.leaves, self.plan.outputs, self.jax_donated)
      self._pairs = fcfs, self.plan.pairs()
    return self._pairs


def is_native(first: FirstCome, xla_decides: bool) -> bool:
  """Whether `jax.jit`'s own lowering makes the plan: same donated leaves, same pairs."""
  if any(a.kind != Request.INNER_JIT or first.options.adopt_inner for a in first.flow.annotations):
    return False
  if jax.config.jax_debug_nans:  # type: ignore[attr-defined]  # set at run time
    return not _consumed(first.plan)  # jax.jit donates nothing then
  if first.donates_more:
    return False
  fcfs, planned = first.pairs()
  if xla_decides:
    # jax.jit offers every donated input to XLA as a donor and XLA pairs them first come, first
    # served after partitioning: jax.jit's own path makes the plan when its pairs agree with that.
    return all(fcfs.get(i) == j for i, j in planned.items())
  leaves = first.leaves
  return {i: j for i, j in fcfs.items() if leaves[i].kind != Kind.HOST} == planned


def _jax_donated(options, requested, flow) -> list[int]:
  """The requested leaves `jax.jit` donates: those the program keeps (`keep_unused`, or read)."""
  if options.keep_unused:
    return list(requested)
  used = flow.used
  return [i for i in requested if used[i]]


def _consumed(plan) -> set[int]:
  """The leaves the plan consumes (aliased or offered as donors)."""
  return {i for i, d in enumerate(plan.decisions) if d.consumed}


def first_come_only(
  first: FirstCome, requested, has_layouts: bool, n_consts: int, replay: bool, native: bool
) -> str:
  """Why this call must pair first come, first served as `jax.jit` does (empty: it need not).

  Custom layouts (an alias needs both sides laid out alike), hoisted constants in a replayed
  program, and refs in `donate_argnums` (what `jax.jit` makes of them: a warning, or XLA's own
  error) are left to `jax.jit`'s own lowering; so is a plan that differs from `jax.jit`'s only in
  buffers under `copy_threshold`, whose copies cost less than running another program.
  """
  if native:
    return ""
  if has_layouts:
    return "custom layouts, which only jax.jit's own lowering handles"
  if replay and n_consts:
    return "constants hoisted into arguments, which only jax.jit's own lowering handles"
  if any(first.leaves[i].kind == Kind.REF for i in requested):
    return "jax.Refs in donate_argnums, which only jax.jit's own lowering handles"
  differ = None if replay else _small_difference(first)
  if differ:
    return small_difference(first.options.copy_threshold)
  return "" if differ is None else SAME_PAIRS


def small_difference(threshold: int) -> str:
  """Why `jax.jit`'s own lowering runs a plan whose pairs differ from its own only in buffers
  under `copy_threshold`."""
  return (
    f"it differs from jax.jit's only in buffers under copy_threshold ({format_bytes(threshold)})"
  )


def _small_difference(first: FirstCome) -> set[int] | None:
  """The leaves whose pairs differ from `jax.jit`'s first-come pairs when all of them are under
  `copy_threshold` bytes and the plan donates nothing `jax.jit` does not, else None."""
  if first.donates_more:
    return None
  fcfs, planned = first.pairs()
  differ = {i for i, j in fcfs.items() if planned.get(i) != j}
  differ.update(i for i, j in planned.items() if fcfs.get(i) != j)
  threshold, leaves = first.options.copy_threshold, first.leaves
  small = all(isinstance(leaves[i].nbytes, int) and leaves[i].nbytes < threshold for i in differ)
  return differ if small else None


# `first_come_only`'s answer for a plan whose pairs are `jax.jit`'s own already (annotations that
# changed nothing): `jax.jit` runs it, and the plan needs no note.
SAME_PAIRS = "same pairs"


def refs_beside_donors(plan, leaves, closed) -> bool:
  """Whether a program in which `jax.jit` offers donated buffers to XLA as donors (`xla_decides`)
  writes refs back: XLA may pair a donor with a ref's write-back and then rejects its own aliases
  (an internal error on jax 0.10 and 0.12). The replayed call states the shardings of the
  planned pairs instead (`_signature._inner`)."""
  refs = any(leaf.kind == Kind.REF for leaf in leaves) or any(
    isinstance(c, jax.Ref) for c in closed.consts
  )
  return refs and any(d.consumed for d in plan.decisions)


def pinned_out_shardings(plan, leaves, out_sh) -> tuple:
  """The output shardings of the replayed call: each planned output that reuses a donated
  buffer over several devices gets that buffer's sharding when none was given.

  `jax.jit` makes an input/output alias only for an output whose sharding is stated; an output
  left to sharding propagation gets its input as a mere donor, which XLA pairs first come, first
  served after partitioning (the full copy dataflow pairing avoids). An output planned into a
  buffer is computed from it in place, so it takes the buffer's sharding.
  """
  out_sh = list(out_sh)
  for i, j in plan.pairs().items():
    s = leaves[i].sharding_obj
    if out_sh[j] is None and s is not None and num_devices(s) > 1:
      out_sh[j] = s
  return tuple(out_sh)


def concrete_meshes(leaves) -> dict:
  """{abstract mesh: the concrete mesh of an argument on it}, each sharding object read once (a
  wide pytree's leaves share one or two)."""
  meshes: dict = {}
  seen: set[int] = set()
  for leaf in leaves:
    s = leaf.sharding_obj
    if s is None or id(s) in seen:
      continue
    seen.add(id(s))
    mesh = getattr(s, "mesh", None)
    if isinstance(mesh, jax.sharding.Mesh):
      meshes.setdefault(mesh.abstract_mesh, mesh)
  return meshes


def typed_out_sharding(aval, meshes: Callable[[], dict]):
  """The sharding `jax.jit` states at lowering for an output whose `out_shardings` entry was left
  unspecified, else None (left to propagation).

  An output typed on a mesh with Explicit axes gets its type's sharding over the call's devices
  (`pxla._concretize_abstract_out_shardings`), unconstrained along the dimensions an Auto axis
  could shard; a fully stated one is aliased like an output whose sharding was given, never
  offered to XLA as a mere donor, and a donation no output can take is warned about at lowering.
  The concrete mesh is that of an argument on the same mesh (`meshes()`, `concrete_meshes` of
  the call's leaves; None when there is none)."""
  typed: Any = getattr(aval, "sharding", None)
  mesh = getattr(typed, "mesh", None)
  if mesh is None or mesh.empty or jax.sharding.AxisType.Explicit not in mesh.axis_types:
    return None
  if jax.sharding.AxisType.Auto in mesh.axis_types and None in tuple(typed.spec):
    return None  # an unconstrained dimension: XLA's propagation decides
  if getattr(getattr(aval, "memory_space", None), "name", "Device") != "Device":
    return None  # typed in another memory (its kind is not read here): as if not stated
  concrete = meshes().get(mesh)
  return None if concrete is None else jax.sharding.NamedSharding(concrete, typed.spec)


def xla_decides(leaves, outputs) -> bool:
  """Whether `jax.jit` offers every donated input to XLA as a donor, to pair after partitioning:
  the program spans several devices and not every output sharding is stated."""
  return any(o.sharding_obj is None for o in outputs) and _multi_device(leaves, outputs)


def _multi_device(leaves, outputs) -> bool:
  shardings: dict = {}  # each sharding object once: a wide pytree's leaves share one or two
  for x in (*leaves, *outputs):
    s = x.sharding_obj
    if s is not None:
      shardings.setdefault(id(s), s)
  return any(num_devices(s) > 1 for s in shardings.values())


def num_devices(sharding) -> int:
  """Devices a sharding spans; abstract meshes (no devices) count by their size."""
  if _compat.is_single_device_sharding(sharding):
    return 1
  try:
    return len(sharding.device_set)
  except Exception:  # an AbstractMesh has no devices
    mesh = getattr(sharding, "mesh", None)
    return int(getattr(mesh, "size", 1) or 1)
