"""Checkpoint policies as measurable changes (`variants.Change`), from what the step's jaxpr has.

Where the code checkpoints (`jax.checkpoint`, flax's `nn.remat` / `nnx.remat`, equinox's
`filter_checkpoint`: all bind JAX's checkpoint primitive), every checkpoint's policy is replaced
by each of JAX's named policies in turn, and by `save_only_these_names` for the names the code
marks with `checkpoint_name`. Where it has none, the body of each layer loop (`lax.scan`,
`fori_loop` with static bounds, flax's `nn.scan`) is checkpointed, with each policy in turn;
where it has no layer loop either, each repeated layer call of a model its code unrolls with a
Python `for` (`layers.calls`: flax linen's `x = Block()(x)` per layer, an equinox list of
layers) is wrapped in `jax.checkpoint` with each policy in turn, and `how` is the call's line
rewritten (`nn.remat(Block, policy=...)`, `jax.checkpoint(layer, policy=...)`).

On GPU targets the offload policies are measured too (`offload_dot_with_no_batch_dims`, and
`save_and_offload_only_these_names` for the marked names): residuals kept in pinned host memory
instead of the device's. XLA:CPU does not lower memory-kind transfers, so they are not offered
for CPU programs. Offload is measured for memory only: openxla/xla#46231 shows offloaded scan
residuals that gave wrong gradients with correct-looking memory figures.
"""

from __future__ import annotations

import os

import jax
import jax.extend as jex

from donate._base import compat as _compat
from donate._base import compat_remat as _compat_remat
from donate._base.jaxprs import subs
from donate._base.text import notebook_cell
from donate._profile import layers
from donate._profile.variants import Change

P = jax.checkpoint_policies
NAMED = (
  ("nothing_saveable", P.nothing_saveable, "save nothing: recompute the whole layer"),
  (
    "dots_with_no_batch_dims_saveable",
    P.dots_with_no_batch_dims_saveable,
    "save only matmul outputs without batch dimensions",
  ),
  ("dots_saveable", P.dots_saveable, "save only matmul outputs"),
)


def _walk(jaxpr):
  for e in jaxpr.eqns:
    yield e
    for s in subs(e):
      yield from _walk(s.jaxpr)


def facts(closed) -> tuple[bool, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
  """`(checkpoints, names, checkpoint lines, loop lines)` of a ClosedJaxpr: whether it binds a
  checkpoint, the `checkpoint_name`s it marks, where its checkpoints and its layer loops (scans of
  more than one step) are in the user's code."""
  names: set[str] = set()
  at: dict[str, set[str]] = {"checkpoint": set(), "scan": set()}
  jaxpr = closed.jaxpr if isinstance(closed, jex.core.ClosedJaxpr) else closed
  for e in _walk(jaxpr):
    name = e.primitive.name
    if name == "name" and isinstance(e.params.get("name"), str):
      names.add(e.params["name"])
    elif name == "scan" and e.params.get("length", 0) > 1:
      at["scan"].add(_compat.source_line(e.source_info))
    elif name in ("checkpoint", "remat2", "remat"):
      at["checkpoint"].add(_compat.source_line(e.source_info))
  has = (
    _compat_remat.binds_checkpoint(closed) if isinstance(closed, jex.core.ClosedJaxpr) else False
  )
  lines = tuple(sorted(x for x in at["checkpoint"] if x))
  return has, tuple(sorted(names)), lines, tuple(sorted(x for x in at["scan"] if x))


def _where(lines: tuple[str, ...]) -> str:
  lines = tuple(os.path.basename(notebook_cell(x)) for x in lines if x != "<unknown>")
  return f" (at {', '.join(lines[:3])}{', ...' if len(lines) > 3 else ''})" if lines else ""


OFFLOAD = "memory only: offloaded residuals can compute wrong gradients (openxla/xla#46231)"


def _policies(has: bool, names: tuple[str, ...], platform: str) -> list:
  policies = list(NAMED)
  listed = ", ".join(repr(n) for n in names)
  if has and names:
    named = (f"save_only_these_names({listed})", P.save_only_these_names(*names))
    policies.append((*named, "save only the named values"))
  if platform != "gpu":
    return policies
  offload = P.offload_dot_with_no_batch_dims("device", "pinned_host")
  policies.append(
    (
      'offload_dot_with_no_batch_dims("device", "pinned_host")',
      offload,
      f"keep matmul outputs in host memory; {OFFLOAD}",
    )
  )
  if has and names:
    words = f"keep the named values in host memory; {OFFLOAD}"
    to_host = P.save_and_offload_only_these_names(
      names_which_can_be_saved=(),
      names_which_can_be_offloaded=names,
      offload_src="device",
      offload_dst="pinned_host",
    )
    call = (
      f"save_and_offload_only_these_names(names_which_can_be_saved=(), "
      f'names_which_can_be_offloaded=[{listed}], offload_src="device", '
      'offload_dst="pinned_host")'
    )
    policies.append((call, to_host, words))
  return policies


def _call_changes(repeats, policies) -> tuple[Change, ...]:
  """Each repeated layer call checkpointed, under each policy (see the module)."""
  r = repeats[0]
  count = len(r.spans)
  more = f" (and {len(repeats) - 1} more loop(s) of layers)" if len(repeats) > 1 else ""
  found = []
  for name, policy, words in policies:
    change = f"checkpoint each of the {count} layer calls at {r.where}{more}, {name}: {words}"
    line = layers.rewritten(r, name)
    wrap = "nn.remat(Layer, policy=...)" if r.linen else "jax.checkpoint(layer, policy=...)"
    how = f"{line} at {r.where}" if line else f"call {wrap} at {r.where}"
    found.append(Change(change, how, call_policy=policy))
  return tuple(found)


def changes(closed, platform: str = "cpu") -> tuple[Change, ...]:
  """The checkpoint changes to measure for a step whose jaxpr is `closed`, compiled for
  `platform` (see the module)."""
  has, names, checkpoints, loops = facts(closed)
  if not has and not loops:
    jaxpr = closed.jaxpr if isinstance(closed, jex.core.ClosedJaxpr) else closed
    repeats = layers.calls(layers.forward(jaxpr.eqns))
    return _call_changes(repeats, _policies(False, (), platform)) if repeats else ()
  policies = _policies(has, names, platform)
  found = []
  for name, policy, words in policies:
    if has:
      change = f"checkpoint policy {name}: {words}"
      how = (
        f"policy=jax.checkpoint_policies.{name} in every jax.checkpoint / nn.remat / "
        f"eqx.filter_checkpoint{_where(checkpoints)}"
      )
    else:
      change = f"checkpoint each layer loop's body, {name}: {words}"
      how = (
        f"jax.lax.scan(jax.checkpoint(body, policy=jax.checkpoint_policies.{name}, "
        f"prevent_cse=False), ...) (flax: nn.scan(nn.remat(Layer, policy=..., "
        f"prevent_cse=False))){_where(loops)}"
      )
    which = {"policy": policy} if has else {"loop_policy": policy}
    found.append(Change(change, how, **which))
  return tuple(found)
