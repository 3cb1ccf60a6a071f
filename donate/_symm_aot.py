"""The whole check on one program, with plain ``jax.jit``: what ``donate.jit`` does on a GPU target.

``check_placement(fun, *args)`` traces ``fun`` (registered collectives marked), finds the comm
buffers, picks the target platform from the arguments' shardings, chooses the per-compile options,
lowers the marked program with ``jax.jit``, compiles it with a buffer-assignment dump, and reads
back: the placement of every annotated value, the un-annotated collectives placed too, XLA's
collective allocation, and the planner's pool for the same program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend as jex
from jax import tree_util

from donate import _hlo_text
from donate._symm_place import PlacementPolicy
from donate._symm_place import placement_policy
from donate._symm_place import target_platform
from donate._symm_report import PlacementReport
from donate._symm_report import placement_report
from donate._symm_rewrite import mark_required
from donate._symm_size import SizingRow
from donate._symm_size import XlaCollectiveMemory
from donate._symm_size import xla_collective_memory
from donate._symm_trace import comm_buffers


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementCheck:
  """Everything ``check_placement`` found for one compiled program."""
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
    head = text[:text.find("\n")]
    return head.count("may-alias") + head.count("must-alias")

  def sizing(self, program: str) -> SizingRow:
    return SizingRow(program, self.memory.nbytes, self.planned_bytes, self.annotated_bytes)

  def collectives_table(self) -> list[tuple[str, str, int, str, str]]:
    """(instruction, kind, operand bytes, placement, annotated) per compiled collective."""
    return [(u.instruction, u.kind, u.nbytes, f"S({u.memory_space})" if u.memory_space else
             "default", "yes" if u.annotated else "no") for u in self.report.collectives]


def _shardings(leaves, jit_kwargs) -> list:
  found = [getattr(x, "sharding", None) for x in leaves]
  for key in ("in_shardings", "out_shardings"):
    found += [s for s in tree_util.tree_leaves(jit_kwargs.get(key))
              if isinstance(s, jax.sharding.Sharding)]
  return found


def check_placement(fun, *args, donate_argnums: int | Sequence[int] = (), enabled: bool = True,
                    plan: bool = True, plan_time_limit: float = 0.5,
                    **jit_kwargs) -> PlacementCheck:
  """Compiles ``fun`` for its arguments' target with the placement options, and reads the result.

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
  wrapped = lambda *xs: tree_util.tree_unflatten(out_tree, marked(*xs))
  lowered = jax.jit(wrapped, donate_argnums=flat_donate, **jit_kwargs).lower(*leaves)
  compiled, memory = xla_collective_memory(lowered, policy.options)
  report = placement_report(compiled.as_text(), bufs)
  planned = 0
  if plan:
    from donate import planner
    planned = planner.plan_memory(fun, *args, time_limit=plan_time_limit).collective_memory_bytes
  return PlacementCheck(platform, policy, report, memory, planned,
                        sum(b.nbytes for b in bufs), compiled)


def collective_spaces(compiled) -> frozenset[int]:
  """The collective memory spaces used in a compiled program (empty if nothing was placed)."""
  return _hlo_text.collective_memory_spaces(_hlo_text.parse_module(compiled.as_text()))
