"""Optimizer state kept in host memory, as a measurable change (`variants.Change.host`).

The arguments a profile calls optimizer state (Adam's `mu` and `nu`: updated from the backward
pass, read by no forward pass) are placed in pinned host memory at the step's boundary, with the
outputs that carry their new values (the output leaf of the same shape whose pytree path ends as
the argument's does): their shardings `.with_memory_kind("pinned_host")`. Inside, the step moves
them to the device with `jax.device_put` before anything reads them, and its new values back
with `jax.device_put` to the host sharding, as JAX's host-offloading guide writes an optimizer
step. The step itself is the traced program (its jaxpr evaluated as it is: the same operations,
donations and shardings), so the user's function is not traced again.

It is measured where JAX can express it for the target (`unsupported` says why not elsewhere):
XLA:CPU compiles a pinned_host placement but counts it as device memory (`memory_analysis()`'s
host fields stay 0: all its memory is the host's), and the compile-only GPU devices of H100 and
B200 targets report no memory kinds (`Device.addressable_memories()` is empty), so JAX drops
`pinned_host` from their shardings (`with_memory_kind("pinned_host").memory_kind` is None, jax
0.10.2). There the remedy is named with the reason and the state's bytes, not measured. Offload
is measured for memory only (openxla/xla#46231: offloaded values that computed wrong gradients
with correct-looking memory figures).
"""

from __future__ import annotations

import jax
import jax.extend as jex
import numpy as np
from jax import tree_util

from donate._base import compat as _compat

HOST = "pinned_host"
NOT_ON_CPU = (
  "not measured on cpu: XLA:CPU compiles a pinned_host placement but counts it as device "
  "memory (memory_analysis() host fields 0)"
)
NO_MEMORY_KINDS = (
  "not measured on this target: its devices report no memory kinds (compile-only devices), "
  "so JAX drops pinned_host from their shardings"
)


def unsupported(profile) -> str | None:
  """Why the state cannot be measured in host memory for `profile`'s target; None where it can."""
  if profile.platform == "cpu":
    return NOT_ON_CPU
  program = profile.program
  leaves = tree_util.tree_leaves((getattr(program, "args", ()), getattr(program, "kwargs", {})))
  sharding = next((x.sharding for x in leaves if getattr(x, "sharding", None) is not None), None)
  if sharding is None or sharding.with_memory_kind(HOST).memory_kind != HOST:
    return NO_MEMORY_KINDS
  return None


CAVEAT = "measured for memory only: offloaded values can compute wrong results (openxla/xla#46231)"
HOW = (
  "in_shardings/out_shardings of the optimizer state: sharding.with_memory_kind('pinned_host'); "
  "in the step, jax.device_put(opt_state, sharding.with_memory_kind('device')) before the update "
  "and jax.device_put(new_opt_state, host_sharding) after"
)


def _suffix(a: str, b: str) -> int:
  n = 0
  while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
    n += 1
  return n


def placement(profile) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None:
  """`(argument leaves, (result leaf, its argument leaf) pairs)` (flat indices of the traced
  program's arguments and results) to keep in host memory: the optimizer state and its new
  values; None where the profile has none, or no traced program to place them in."""
  program = profile.program
  traced = getattr(getattr(program, "made", None), "traced", None)
  lowered = getattr(getattr(program, "made", None), "lowered", None)
  if traced is None or lowered is None:
    return None
  numbers = {
    e.index for e in profile.at_peak if e.kind == "argument" and e.category == "optimizer state"
  }
  if not numbers:
    return None
  kept, n_consts = _compat.lowered_kept_leaves(lowered)
  n_traced = _compat.traced_num_consts(traced)  # traced constants lead the jaxpr's inputs
  leaves = sorted(
    kept[k - n_consts] - n_traced
    for k in numbers
    if k is not None and n_consts <= k < n_consts + len(kept) and kept[k - n_consts] >= n_traced
  )
  ins = tree_util.tree_flatten_with_path(traced.args_info[0])[0]
  outs = tree_util.tree_flatten_with_path(traced.out_info)[0]
  found: list[tuple[int, int]] = []
  for i in leaves:
    path, info = ins[i]
    own = tree_util.keystr(path[1:])  # the path inside its argument
    name = tree_util.keystr(path)
    best = max(
      (
        (_suffix(name, tree_util.keystr(p)), j)
        for j, (p, o) in enumerate(outs)
        if np.shape(o) == np.shape(info) and o.dtype == info.dtype
      ),
      default=(0, None),
    )
    if best[1] is not None and best[0] >= len(own) and best[1] not in dict(found):
      found.append((best[1], i))
  return tuple(leaves), tuple(sorted(found))


def lowered_on_host(traced, host_in, pairs, fallback) -> jax.stages.Lowered:
  """The program of `traced` with argument leaves `host_in` and the result leaves of `pairs`
  `(result, argument)` in pinned host memory (see the module); `fallback(i)` is the sharding of
  argument leaf `i` where the trace left it to the compiler."""
  closed, consts, donated = _compat.traced_program(traced)
  ins, outs, _ = _compat.traced_flat_shardings(traced)
  ins = tuple(s if s is not None else fallback(i) for i, s in enumerate(ins))
  host_in = set(host_in)
  out_host = {j: ins[i].with_memory_kind(HOST) for j, i in pairs}

  def step(*xs):
    xs = tuple(
      jax.device_put(x, ins[i].with_memory_kind("device")) if i in host_in else x
      for i, x in enumerate(xs)
    )
    ys = jex.core.jaxpr_as_fun(closed)(*consts, *xs)
    return [jax.device_put(y, out_host[j]) if j in out_host else y for j, y in enumerate(ys)]

  in_shardings = tuple(s.with_memory_kind(HOST) if i in host_in else s for i, s in enumerate(ins))
  out_shardings = [out_host.get(j, s) for j, s in enumerate(outs)]
  avals = closed.in_avals[len(consts) :]
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
  donate = tuple(i for i, d in enumerate(donated) if d)
  jitted = _compat.jax_jit(
    step, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate
  )
  return jitted.lower(*specs)
