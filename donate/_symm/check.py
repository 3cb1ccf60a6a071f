"""The whole check on one program, with plain ``jax.jit``: what ``donate.jit`` does on a GPU target.

``check_placement(fun, *args)`` traces ``fun`` (registered collectives marked), finds the comm
buffers, picks the target platform from the arguments' shardings, chooses the per-compile options,
lowers the marked program with ``jax.jit``, compiles it with a buffer-assignment dump, and reads
back: the placement of every annotated value, the un-annotated collectives placed too and XLA's
collective allocation. ``donate.symm.check_placement`` adds the planner's pool for the same program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend as jex
from jax import tree_util

from donate._base import compat as _compat
from donate._symm.report import PlacementReport, placement_report
from donate._symm.rewrite import mark_required
from donate._symm.size import SizingRow, XlaCollectiveMemory, xla_collective_memory
from donate._symm.trace import comm_buffers
from donate._symm.xla import PlacementPolicy, placement_policy, target_platform


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementCheck:
  """Everything ``check_placement`` found for one compiled program.

  Attributes:
    platform: the target platform (``"cuda"`` on an H100/B200 mesh).
    policy: the options chosen, and what else they place.
    report: where each annotated value landed, read from the compiled program.
    memory: XLA's collective-memory allocation for the program, per device.
    planned_bytes: the planner's collective pools for the same program (0 if not planned).
    annotated_bytes: the bytes of the annotated buffers, without reuse.
    compiled: the ``jax.stages.Compiled`` program.
  """

  platform: str
  policy: PlacementPolicy
  report: PlacementReport
  memory: XlaCollectiveMemory
  planned_bytes: int
  annotated_bytes: int
  compiled: Any = dataclasses.field(repr=False, compare=False)

  @property
  def aliases(self) -> int:
    """Number of input/output aliases in the compiled program (donation reached it)."""
    text = self.compiled.as_text()
    head = text[: text.find("\n")]
    return head.count("may-alias") + head.count("must-alias")

  def sizing(self, program: str) -> SizingRow:
    return SizingRow(program, self.memory.nbytes, self.planned_bytes, self.annotated_bytes)

  def collectives_table(self) -> list[tuple[str, str, int, str, str]]:
    """(instruction, kind, operand bytes, placement, annotated) per compiled collective."""
    return [
      (
        u.instruction,
        u.kind,
        u.nbytes,
        f"S({u.memory_space})" if u.memory_space else "default",
        "yes" if u.annotated else "no",
      )
      for u in self.report.collectives
    ]


def _shardings(leaves, jit_kwargs) -> list:
  found = [getattr(x, "sharding", None) for x in leaves]
  for key in ("in_shardings", "out_shardings"):
    found += [
      s for s in tree_util.tree_leaves(jit_kwargs.get(key)) if isinstance(s, jax.sharding.Sharding)
    ]
  return found


def check_placement(
  fun, *args, donate_argnums: int | Sequence[int] = (), enabled: bool = True, **jit_kwargs
) -> PlacementCheck:
  """Compiles ``fun`` for its arguments' target with the placement options, and reads the result.

  The arguments are those of ``donate.symm.check_placement`` without the planner's (its
  ``planned_bytes`` is 0 here).

  >>> import jax, jax.numpy as jnp
  >>> check = check_placement(lambda x: x * 2, jnp.ones(4), donate_argnums=0)
  >>> check.platform, check.report.records, check.memory.nbytes, check.aliases
  ('cpu', (), 0, 1)
  """
  leaves = tree_util.tree_leaves(args)
  closed = mark_required(jax.make_jaxpr(fun)(*args))
  bufs = comm_buffers(closed)
  platform = target_platform(_shardings(leaves, jit_kwargs), jax.default_backend())
  policy = placement_policy(platform, bufs, enabled=enabled)
  nums = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
  starts = [0]
  for a in args:
    starts.append(starts[-1] + len(tree_util.tree_leaves(a)))
  flat_donate = tuple(i for n in nums for i in range(starts[n], starts[n + 1]))
  marked = jex.core.jaxpr_as_fun(closed)
  out_tree = tree_util.tree_structure(jax.eval_shape(fun, *args))

  def wrapped(*xs):
    return tree_util.tree_unflatten(out_tree, marked(*xs))

  lowered = _compat.jax_jit(wrapped, donate_argnums=flat_donate, **jit_kwargs).lower(*leaves)
  compiled, memory = xla_collective_memory(lowered, policy.options)
  report = placement_report(compiled.as_text(), bufs)
  return PlacementCheck(platform, policy, report, memory, 0, sum(b.nbytes for b in bufs), compiled)
