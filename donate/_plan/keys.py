"""How `jax.jit` matches donated inputs with outputs (`mlir._set_up_aliases`), for the planner.

An input and an output match by their aval on one device without weak type (shape and dtype)
and, when every input and output has one, their memory kind (`key`, `grouped`); an output can
live in an input's buffer only when their layouts across devices agree too (`compatible`).
`jax.jit` pairs each output, in order, with the first donated input of its key (`fcfs_pairs`),
and offers a leftover input to XLA as a buffer donor for an output with as many elements per
device (`shard_size`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from donate._plan.decision_types import Kind  # noqa: F401 (the doctests build leaves)
from donate._plan.donation_plan import LeafInfo, OutputInfo, shard_shape


def key(x, per_device: bool = True) -> tuple:
  """How `jax.jit` groups inputs and outputs for aliasing: the aval without weak type (shape and
  dtype; on one device, `shard_shape`, with `per_device`) and, when every input and output has
  one, the memory kind (`grouped`)."""
  return (shard_shape(x) if per_device else tuple(x.shape), x.dtype, x.group_kind)


def per_device(outputs: Sequence[OutputInfo]) -> bool:
  """Whether `jax.jit`'s pairs are matched by the avals on one device (`key`): when every
  output's sharding is stated. Otherwise, over several devices, `jax.jit` offers every donated
  input to XLA, which pairs them after partitioning by shapes only it knows; the whole shapes
  stand in for them (on one device the two are the same)."""
  return all(o.sharding_obj is not None for o in outputs)


def grouped(leaves: Sequence[LeafInfo], outputs: Sequence[OutputInfo]):
  """`(leaves, outputs)` with `group_kind` set as `jax.jit` keys donations
  (`mlir._set_up_aliases`): by memory kind only when every argument and result has one.

  >>> leaf = LeafInfo("a", (4,), "float32", 16, "cpu:0", None, Kind.DEVICE, "ArrayImpl")
  >>> grouped([leaf], [OutputInfo("out", (4,), "float32", 16)])[0][0].group_kind is None
  True
  """
  if any(o.sharding_obj is None for o in outputs):  # an output without one: no memory kind
    return list(leaves), list(outputs)
  both: list[Any] = [*leaves, *outputs]
  kinds = [getattr(x.sharding_obj, "memory_kind", None) for x in both]
  if any(k is None for k in kinds) or len(set(kinds)) == 1:
    return list(leaves), list(outputs)  # one memory kind everywhere: it separates nothing
  n = len(leaves)
  return (
    [dataclasses.replace(leaf, group_kind=k) for leaf, k in zip(leaves, kinds[:n])],
    [dataclasses.replace(o, group_kind=k) for o, k in zip(outputs, kinds[n:])],
  )


def donor_key(x) -> tuple:
  """How `jax.jit` offers a leftover donated input to XLA as a donor: to an output of as many
  elements per device (`shard_size`), of the same memory kind when every one is known."""
  return (shard_size(x), x.group_kind)


def shard_size(x) -> int:
  """Elements per device: what `jax.jit` compares when it offers a donor."""
  return math.prod(shard_shape(x))  # an expression of the dimension variables when symbolic


def compatible(leaf: LeafInfo, out: OutputInfo) -> bool:
  """Whether the output can live in the leaf's buffer: same key, the same memory space in their
  types (a value put in host memory inside the function says so), and same layout across devices
  when both shardings are known."""
  if leaf.dtype != out.dtype or tuple(leaf.shape) != tuple(out.shape):  # `key`, field by field
    return False
  if leaf.group_kind != out.group_kind or leaf.memory_space != out.memory_space:
    return False
  a, b = leaf.sharding_obj, out.sharding_obj
  if a is None or b is None:
    return True
  if getattr(a, "memory_kind", None) != getattr(b, "memory_kind", None):
    return False
  try:
    return bool(a.is_equivalent_to(b, len(leaf.shape)))
  except Exception:  # different device sets or sharding kinds that cannot be compared
    return False


def fcfs_pairs(
  leaves: Sequence[LeafInfo], outputs: Sequence[OutputInfo], donated: Sequence[int]
) -> dict[int, int]:
  """What `jax.jit` pairs on one device: each output, in order, takes the first donated input of
  its shape and dtype not yet taken. Returns {leaf: output}.

  >>> leaf = lambda p: LeafInfo(p, (4,), "float32", 16, "cpu:0", None, Kind.DEVICE, "ArrayImpl")
  >>> out = lambda p: OutputInfo(p, (4,), "float32", 16)
  >>> fcfs_pairs([leaf("a"), leaf("b")], [out("out[0]"), out("out[1]")], [0, 1])
  {0: 0, 1: 1}
  """
  leaves, outputs = grouped(leaves, outputs)
  one = per_device(outputs)
  queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
  for i in sorted(donated):
    queues[key(leaves[i], one)].append(i)
  pairs = {}
  for j, out in enumerate(outputs):
    queue = queues.get(key(out, one))
    if queue:
      pairs[queue.popleft()] = j
  return pairs
