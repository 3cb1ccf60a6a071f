"""`MemoryPlan`, the planner's answer, and its views: a text listing, HTML tables and a plot.

The listing is in the spirit of Inductor's generated code, one line per allocation, good enough
to be a golden test text; the HTML is what notebooks show; the plot draws each pool as memory
against time.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping, Sequence
from typing import Any

from donate._planner.records import ROLES, Allocation, Buffer, Copy, Pool
from donate._planner.text import count, size_text


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryPlan:
  """Where every buffer of a traced program lives, pool by pool.

  Attributes:
    name: the planned function's name.
    buffers: every buffer, in order of creation.
    pools: one comm-buffer pool per (kind, group), in order of first use.
    arena: the pool of regular buffers (inputs, intermediates, outputs).
    copies: comm outputs copied out (and arguments copied into symmetric memory).
    steps: one label per time step, e.g. ``"shard_map/psum"``.
    alignment: every offset is a multiple of this.

  >>> import jax, jax.numpy as jnp, numpy as np
  >>> from jax.sharding import Mesh, PartitionSpec as P
  >>> from donate import planner
  >>> from donate.symm import with_symmetric
  >>> mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
  >>> def body(x):
  ...   return jax.lax.psum(with_symmetric(x * 2, "i"), "i") + 1
  >>> f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())
  >>> plan = planner.plan_memory(f, jnp.ones((4, 4)))
  >>> [(p.name, p.nbytes) for p in plan.pools], plan.collective_memory_bytes, plan.total_bytes
  ([('pool_symm_mem_i', 64)], 64, 192)
  >>> print(str(plan).splitlines()[2])
    buf1 = alloc_from_pool(pool_symm_mem_i, 0, 64)  # float32[4,4] comm [0, 2), shard_map/mul,
    freed after step 1 (shard_map/psum_invariant)
  >>> len(plan.plot().axes)  # one picture per pool, then the arena
  2
  """

  name: str
  buffers: tuple[Buffer, ...]
  pools: tuple[Pool, ...]
  arena: Pool
  copies: tuple[Copy, ...]
  steps: tuple[str, ...]
  alignment: int

  @property
  def collective_memory_bytes(self) -> int:
    """Sum of the comm-buffer pool sizes."""
    return sum(p.nbytes for p in self.pools)

  @property
  def regular_bytes(self) -> int:
    return self.arena.nbytes

  @property
  def total_bytes(self) -> int:
    return self.collective_memory_bytes + self.regular_bytes

  @property
  def lower_bound_bytes(self) -> int:
    return sum(p.lower_bound_bytes for p in self.pools) + self.arena.lower_bound_bytes

  def buffer(self, name: str) -> Buffer:
    """The buffer called `name`."""
    for b in self.buffers:
      if b.name == name:
        return b
    raise KeyError(name)

  def pool(self, kind: str, group: str | Sequence[str]) -> Pool:
    """The comm pool for (`kind`, `group`)."""
    group = (group,) if isinstance(group, str) else tuple(group)
    for p in self.pools:
      if (p.kind, p.group) == (kind, group):
        return p
    raise KeyError((kind, group))

  def __str__(self) -> str:
    return listing(self)

  def _repr_html_(self) -> str:
    return to_html(self)

  def plot(self, *, width: float = 8.0):
    """Draws every pool as memory (bytes) against time (steps); returns a matplotlib Figure."""
    return plot(self, width=width)


# Listing, HTML and plot ------------------------------------------------------------------------


def _fate(a: Allocation, plan: MemoryPlan, copies_from: Mapping[str, Copy]) -> str:
  b, end = a.buffer, a.live_range.end
  if b.name in copies_from and copies_from[b.name].reason == "out":
    c = copies_from[b.name]
    return f"copied out to {c.target} at step {c.step}, then freed"
  if b.role == "input":
    return "caller-owned"
  if b.is_output or b.role == "output":
    return "returned"
  label = plan.steps[end - 1] if end - 1 < len(plan.steps) else "end"
  return f"freed after step {end - 1} ({label})"


def _line(a: Allocation, pool: Pool, plan: MemoryPlan, copies_from: Mapping[str, Copy]) -> str:
  b = a.buffer
  what = f"{b.scope}{b.producer}" if b.producer != "argument" else "argument"
  parts = [f"{b.type_str} {b.role} {b.live_range}", what]
  if a.reuses:
    parts.append(f"reuses {a.reuses} in place")
  parts.append(_fate(a, plan, copies_from))
  return f"  {b.name} = alloc_from_pool({pool.name}, {a.offset}, {a.nbytes})  # " + ", ".join(parts)


def listing(plan: MemoryPlan) -> str:
  """The plan as text in the spirit of Inductor's generated code (see `MemoryPlan`)."""
  copies_from = {c.source: c for c in plan.copies}
  lines = [
    f"# memory plan for {plan.name}: {count(len(plan.steps), 'step')}, alignment {plan.alignment}"
  ]
  for pool in (*plan.pools, plan.arena):
    lines.append(str(pool))
    lines.extend(_line(a, pool, plan, copies_from) for a in pool.allocations)
  lines.extend(str(c) for c in plan.copies)
  for pool in (*plan.pools, plan.arena):
    lines.append(f"# {pool.name}: {size_text(pool.nbytes, pool.lower_bound_bytes)}")
  lines.append("# " + _totals(plan, ":", "; "))
  return "\n".join(lines)


def _totals(plan: MemoryPlan, colon: str, sep: str) -> str:
  """The comm pools' bytes, the arena's, and both with their lower bound."""
  items = (
    ("collective memory", size_text(plan.collective_memory_bytes)),
    ("regular", size_text(plan.regular_bytes)),
    ("total", size_text(plan.total_bytes, plan.lower_bound_bytes)),
  )
  return sep.join(f"{label}{colon} {value}" for label, value in items)


def to_html(plan: MemoryPlan) -> str:
  """An HTML summary: one table per pool, then the totals."""
  esc, copies_from = html.escape, {c.source: c for c in plan.copies}
  parts = [
    f"<div><b>memory plan for {esc(plan.name)}</b>: {len(plan.steps)} steps, "
    f"alignment {plan.alignment}"
  ]
  head = "".join(
    f"<th>{h}</th>"
    for h in ("buffer", "offset", "size", "type", "role", "live", "producer", "fate")
  )
  for pool in (*plan.pools, plan.arena):
    parts.append(
      f"<p><code>{esc(pool.name)}</code>: {size_text(pool.nbytes)}, lower bound "
      f"{pool.lower_bound_bytes}"
      + ("" if pool.kind == "regular" else f", kind {esc(pool.kind)}, group {esc(str(pool.group))}")
      + "</p>"
    )
    rows = "".join(
      "<tr>"
      + "".join(
        f"<td>{esc(str(c))}</td>"
        for c in (
          a.name,
          a.offset,
          a.nbytes,
          a.buffer.type_str,
          a.buffer.role,
          a.live_range,
          a.buffer.scope + a.buffer.producer,
          _fate(a, plan, copies_from),
        )
      )
      + "</tr>"
      for a in pool.allocations
    )
    parts.append(f"<table><tr>{head}</tr>{rows}</table>")
  if plan.copies:
    parts.append("<p>" + "<br>".join(esc(str(c)) for c in plan.copies) + "</p>")
  parts.append(f"<p>{_totals(plan, '', ', ')}</p></div>")
  return "".join(parts)


_COLORS = {
  "comm": "#d62728",
  "input": "#7f7f7f",
  "donated input": "#9467bd",
  "regular": "#1f77b4",
  "output": "#2ca02c",
}


def plot(plan: MemoryPlan, *, width: float = 8.0) -> Any:
  """Draws each pool as memory against time; returns the matplotlib `Figure`.

  Uses `matplotlib.figure.Figure` directly, so no GUI backend (nor pyplot state) is involved.
  """
  from matplotlib.figure import Figure
  from matplotlib.patches import Rectangle

  pools = (*plan.pools, plan.arena)
  fig = Figure(figsize=(width, 2.2 * len(pools) + 0.5), layout="constrained")
  steps = max(len(plan.steps), 1)
  for ax, pool in zip(fig.subplots(len(pools), 1, squeeze=False)[:, 0], pools):
    for a in pool.allocations:
      lr = a.live_range
      ax.add_patch(
        Rectangle(
          (lr.start, a.offset),
          len(lr),
          a.nbytes,
          alpha=0.7,
          facecolor=_COLORS.get(a.buffer.role, "#1f77b4"),
          edgecolor="black",
        )
      )
      if len(pool.allocations) <= 40:
        ax.text(
          lr.start + len(lr) / 2,
          a.offset + a.nbytes / 2,
          a.name,
          ha="center",
          va="center",
          fontsize=7,
          clip_on=True,
        )
    ax.axhline(pool.lower_bound_bytes, color="black", linestyle=":", linewidth=1)
    ax.set_xlim(0, steps)
    ax.set_ylim(0, max(pool.nbytes, 1))
    ax.set_xlabel("step")
    ax.set_ylabel("bytes")
    ax.set_title(
      f"{pool.name}: {size_text(pool.nbytes, pool.lower_bound_bytes, 'dotted')}", fontsize=9
    )
  roles = sorted({a.buffer.role for p in pools for a in p.allocations}, key=ROLES.index)
  fig.legend(
    handles=[Rectangle((0, 0), 1, 1, facecolor=_COLORS[r], alpha=0.7, label=r) for r in roles],
    loc="outside lower center",
    ncols=max(len(roles), 1),
    fontsize=8,
  )
  return fig
