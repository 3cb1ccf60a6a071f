"""Memory plans: comm-buffer pools per (kind, group), the regular arena, listing, plot and HTML.

`plan` is pure data in, pure data out. It reads as a list of passes:

1. `classify`: give every value from the liveness walk a name, a role and a live range;
2. `copy_out`: comm buffers never leave the program; an output that is one gets copied out;
3. `group`: one pool per (kind, group) of comm buffers, one arena for the rest, and in-place
   reuse of dying regular buffers by elementwise results (comm buffers take no part);
4. `allocate`: offsets per pool from `assign_offsets`, each pool planned in isolation.
"""

from __future__ import annotations

import collections
import dataclasses
import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from donate import _errors
from donate._planner.liveness import Liveness, Value
from donate._planner.offsets import assign_offsets

ROLES = ("input", "donated input", "regular", "output", "comm")
ARENA = "arena"
_VALIDATE_MAX = 600  # pairwise overlap asserts up to this many allocations per pool


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class LiveRange:
  """A half-open range of time steps ``[start, end)``.

  >>> r = LiveRange(2, 5)
  >>> str(r), len(r), r.overlaps(LiveRange(5, 7)), r.overlaps(LiveRange(4, 6))
  ('[2, 5)', 3, False, True)
  """
  start: int
  end: int

  def __post_init__(self):
    assert 0 <= self.start < self.end, f"empty or negative live range [{self.start}, {self.end})"

  def __len__(self) -> int:
    return self.end - self.start

  def overlaps(self, other: LiveRange) -> bool:
    return self.start < other.end and other.start < self.end

  def __str__(self) -> str:
    return f"[{self.start}, {self.end})"


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
  """One value that needs memory.

  Attributes:
    name: argument path (``"x"``, ``"params['w']"``), output path (``"out[0]"``) or ``"bufN"``.
    role: ``"input"`` (caller-owned), ``"donated input"``, ``"regular"`` (an intermediate),
      ``"output"`` or ``"comm"`` (lives in a comm-buffer pool).
    producer: primitive name, ``"argument"``, ``"constant"``, ``"copy-out"`` or ``"copy-in"``.
    shape: shape as its jaxpr sees it (per-device blocks inside ``shard_map``).
    dtype: dtype name.
    nbytes: size in bytes.
    live_range: steps during which the buffer must exist.
    scope: where it was produced, e.g. ``"shard_map/"``.
    kind: comm buffer kind (e.g. ``"symm_mem"``), None for regular buffers.
    group: mesh axis names the comm buffer communicates over, None for regular buffers.
    is_output: whether the program returns it (a comm one is copied out instead).

  >>> import jax, jax.numpy as jnp
  >>> from donate import planner
  >>> plan = planner.plan_memory(lambda x: jnp.sin(x).sum(), jnp.ones((2, 3)))
  >>> print(plan.buffer("x"))
  x: float32[2,3] input [0, 2) from argument
  >>> print(plan.buffer("out"))
  out: float32[] output [1, 2) from reduce_sum
  """
  name: str
  role: str
  producer: str
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  live_range: LiveRange
  scope: str = ""
  kind: str | None = None
  group: tuple[str, ...] | None = None
  is_output: bool = False

  @property
  def type_str(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.shape))}]"

  @property
  def is_comm(self) -> bool:
    return self.role == "comm"

  def __str__(self) -> str:
    return (f"{self.name}: {self.type_str} {self.role} {self.live_range} "
            f"from {self.scope}{self.producer}")


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
  """A buffer placed at `offset` in a pool; `reuses` names the buffer it takes over in place.

  >>> import jax, jax.numpy as jnp
  >>> from donate import planner
  >>> plan = planner.plan_memory(lambda x: jnp.sin(x) * 2, jnp.ones(4), alignment=16)
  >>> [str(a) for a in plan.arena.allocations]
  ['x @ 0 +16 [0, 2)', 'buf1 @ 16 +16 [0, 2)', 'out @ 16 +16 [1, 2)']
  >>> plan.arena.allocations[-1].reuses
  'buf1'
  """
  buffer: Buffer
  offset: int
  reuses: str | None = None

  @property
  def name(self) -> str:
    return self.buffer.name

  @property
  def size(self) -> int:
    return self.buffer.nbytes

  @property
  def live_range(self) -> LiveRange:
    return self.buffer.live_range

  def __str__(self) -> str:
    return f"{self.name} @ {self.offset} +{self.size} {self.live_range}"


@dataclasses.dataclass(frozen=True, slots=True)
class Pool:
  """One contiguous block of memory and the buffers placed in it.

  Attributes:
    name: ``"pool_<kind>_<group>"`` for comm pools, ``"arena"`` for regular buffers.
    kind: comm buffer kind, or ``"regular"``.
    group: mesh axis names (empty for the arena).
    size: bytes the pool needs (the height of its offset assignment).
    lower_bound: the most bytes ever live at once; no assignment can be smaller.
    allocations: buffers with offsets, ordered by start (then creation).
    optimal: whether `size` is proven minimal.
    method: how offsets were found.

  >>> import jax, jax.numpy as jnp
  >>> from donate import planner
  >>> pool = planner.plan_memory(lambda x: jnp.sin(x) * 2, jnp.ones(4), alignment=16).arena
  >>> print(pool)
  arena = empty_pool(32)  # regular buffers, lower bound 32, 3 buffers
  >>> pool.offsets
  {'x': 0, 'buf1': 16, 'out': 16}
  """
  name: str
  kind: str
  group: tuple[str, ...]
  size: int
  lower_bound: int
  allocations: tuple[Allocation, ...]
  optimal: bool = True
  method: str = ""

  @property
  def buffers(self) -> tuple[Buffer, ...]:
    return tuple(a.buffer for a in self.allocations)

  @property
  def offsets(self) -> dict[str, int]:
    return {a.name: a.offset for a in self.allocations}

  def __str__(self) -> str:
    what = ("regular buffers" if self.kind == "regular"
            else f"kind={self.kind!r}, group={self.group!r}")
    return (f"{self.name} = empty_pool({self.size})  # {what}, lower bound {self.lower_bound}, "
            f"{_count(len(self.allocations), 'buffer')}")


@dataclasses.dataclass(frozen=True, slots=True)
class Copy:
  """A copy the plan inserts: a comm output copied out into a regular buffer, or an argument
  copied into symmetric memory.

  >>> print(Copy("buf1", "out", 3, "out"))
  out = copy_out(buf1)  # at step 3
  """
  source: str
  target: str
  step: int
  reason: str

  def __str__(self) -> str:
    fn = "copy_out" if self.reason == "out" else "copy_in"
    return f"{self.target} = {fn}({self.source})  # at step {self.step}"


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
  >>> [(p.name, p.size) for p in plan.pools], plan.collective_memory_bytes, plan.total_bytes
  ([('pool_symm_mem_i', 64)], 64, 192)
  >>> print(str(plan).splitlines()[2])
    buf1 = alloc_from_pool(pool_symm_mem_i, 0, 64)  # float32[4,4] comm [0, 2), shard_map/mul, freed after step 1 (shard_map/psum_invariant)
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
    return sum(p.size for p in self.pools)

  @property
  def regular_bytes(self) -> int:
    return self.arena.size

  @property
  def total_bytes(self) -> int:
    return self.collective_memory_bytes + self.regular_bytes

  @property
  def lower_bound_bytes(self) -> int:
    return sum(p.lower_bound for p in self.pools) + self.arena.lower_bound

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


# Pass 1: classify -------------------------------------------------------------------------------


def classify(lv: Liveness, *, arg_names: Sequence[str], out_names: Sequence[str],
             donated: set[int], comm: Mapping[int, tuple[str, tuple[str, ...]]]) -> list[Buffer]:
  """Names every value and gives it a role and the live range the planner reserves for it.

  Returns one buffer per value, in the order of `lv.values`.

  Invariant: caller-owned inputs live over the whole program, outputs to its end, every other
  value from its producer to its last use. A comm argument keeps its argument role (and its kind
  and group) for `copy_out` to deal with.
  """
  end, used, buffers = lv.num_steps, set(), []
  for v in lv.values:
    name = _unique(_value_name(v, arg_names, out_names), used)
    is_arg = v.producer in ("argument", "constant")
    is_donated = is_arg and (v.id in lv.donated or v.arg_index in donated)
    if is_arg:
      role = "donated input" if is_donated else "input"
    else:
      role = "comm" if v.id in comm else "output" if v.is_output else "regular"
    keep = (v.is_output and role != "comm") or role == "input"
    kind, group = comm.get(v.id, (None, None))
    buffers.append(Buffer(name, role, v.producer, v.shape, v.dtype, v.nbytes,
                          LiveRange(v.start, end if keep else v.last_use), v.scope, kind, group,
                          v.is_output))
  assert all(b.live_range.end <= end for b in buffers)
  return buffers


def _value_name(v: Value, arg_names: Sequence[str], out_names: Sequence[str]) -> str:
  if v.arg_index is not None and v.arg_index < len(arg_names):
    return arg_names[v.arg_index]
  if v.out_index is not None and v.out_index < len(out_names):
    return out_names[v.out_index]
  return f"buf{v.id}"


def _unique(name: str, used: set[str]) -> str:
  candidate, n = name, 1
  while candidate in used:
    candidate, n = f"{name}#{n}", n + 1
  used.add(candidate)
  return candidate


# Pass 2: copy comm buffers in and out ----------------------------------------------------------


def copy_out(buffers: list[Buffer], lv: Liveness, *,
             strict: bool) -> tuple[list[Buffer], list[Copy]]:
  """Comm buffers never leave the program: each comm output gets a regular copy at its last use.

  Comm arguments get the mirror image: a comm copy made at step 0 that lives as long as the
  argument is read. In strict mode both raise one `DonationError` naming every such buffer.
  New buffers are appended, so `buffers[i]` still belongs to `lv.values[i]`.

  Invariant (asserted): afterwards every comm buffer is produced and consumed inside the program.
  """
  outs = [i for i, b in enumerate(buffers) if b.is_comm and b.is_output]
  args = [i for i, b in enumerate(buffers) if not b.is_comm and b.kind is not None]
  if strict and (outs or args):
    raise _errors.DonationError(_errors.message(
        "comm buffers cannot be program outputs or arguments (their pool is freed when the "
        "program ends)", path=", ".join(buffers[i].name for i in outs + args),
        expected="values that feed a collective and are consumed inside the program",
        got="; ".join([f"{buffers[i].name} ({buffers[i].type_str}) returned" for i in outs] +
                      [f"{buffers[i].name} ({buffers[i].type_str}) an argument" for i in args]),
        fix="return the collective's result instead, or pass strict=False to let the plan copy "
            "comm buffers out (and arguments in)"))
  buffers, copies, used = list(buffers), [], {b.name for b in buffers}
  for i in outs:
    b, step = buffers[i], buffers[i].live_range.end - 1
    source = _unique(f"buf{lv.values[i].id}", used)  # the copy takes over the output's name
    buffers[i] = dataclasses.replace(b, name=source, is_output=False)
    buffers.append(dataclasses.replace(b, role="output", producer="copy-out", kind=None,
                                       group=None, scope="",
                                       live_range=LiveRange(step, lv.num_steps)))
    copies.append(Copy(source, b.name, step, "out"))
  for i in args:
    b = buffers[i]
    target = _unique(f"{b.name}.symm", used)
    buffers[i] = dataclasses.replace(b, kind=None, group=None)
    buffers.append(dataclasses.replace(b, name=target, role="comm", producer="copy-in",
                                       is_output=False,
                                       live_range=LiveRange(0, lv.values[i].last_use)))
    copies.append(Copy(b.name, target, 0, "in"))
  assert not any(b.is_comm and (b.is_output or b.producer in ("argument", "constant"))
                 for b in buffers)
  return buffers, copies


# Pass 3: group ----------------------------------------------------------------------------------


def pool_key(b: Buffer) -> tuple[str, tuple[str, ...]]:
  return (b.kind, b.group) if b.is_comm else ("regular", ())


def group(buffers: Sequence[Buffer]) -> dict[tuple[str, tuple[str, ...]], list[int]]:
  """Indices of `buffers` per pool key, comm pools in order of first use, the arena last."""
  pools: dict[tuple[str, tuple[str, ...]], list[int]] = collections.defaultdict(list)
  for i in sorted(range(len(buffers)), key=lambda i: buffers[i].live_range.start):
    pools[pool_key(buffers[i])].append(i)
  arena = pools.pop(("regular", ()), [])
  return {**pools, ("regular", ()): arena}


def inplace_reuse(buffers: Sequence[Buffer], lv: Liveness,
                  index: Mapping[int, int]) -> dict[int, int]:
  """Chooses in-place reuse: buffer index -> index of the dying buffer whose memory it takes.

  A regular elementwise result may take over an operand of the same size that dies at that very
  step (an intermediate or a donated input). Each buffer is taken over at most once.

  Invariant (asserted): comm buffers, caller-owned inputs and copies take no part.
  """
  takes: dict[int, int] = {}
  taken: set[int] = set()
  for cand in lv.inplace:
    out = index.get(cand.out)
    for op in (index.get(v) for v in cand.operands):
      if (out is not None and op is not None and op not in taken
          and _can_take_over(buffers[out], buffers[op], cand.step)):
        takes[out] = op
        taken.add(op)
        break
  assert not any(buffers[i].is_comm or buffers[j].is_comm for i, j in takes.items())
  return takes


def _can_take_over(out: Buffer, op: Buffer, step: int) -> bool:
  """Whether `out`, produced at `step`, may be written into `op`'s memory."""
  return (out.role in ("regular", "output") and out.producer != "copy-out"
          and op.role in ("regular", "donated input") and op.nbytes == out.nbytes
          and op.live_range.end == step + 1 and out.live_range.start == step)


def _slots(indices: Sequence[int], buffers: Sequence[Buffer], takes: Mapping[int, int]):
  """Merges in-place chains into slots: (root of each index, {root: (size, start, end)})."""
  root = {}
  for i in sorted(indices, key=lambda i: buffers[i].live_range.start):
    root[i] = root.get(takes[i], takes[i]) if i in takes else i
  span: dict[int, list[int]] = {}
  for i in indices:
    r, lr = root[i], buffers[i].live_range
    s = span.setdefault(r, [buffers[r].nbytes, lr.start, lr.end])
    s[1], s[2] = min(s[1], lr.start), max(s[2], lr.end)
  return root, span


# Pass 4: allocate -------------------------------------------------------------------------------


def allocate(name: str, key: tuple[str, tuple[str, ...]], indices: Sequence[int],
             buffers: Sequence[Buffer], takes: Mapping[int, int], *, alignment: int,
             time_limit: float) -> Pool:
  """Assigns offsets to one pool's buffers, in isolation from every other pool.

  Invariant (asserted for pools of up to a few hundred buffers): two buffers whose live ranges
  overlap never overlap in memory, unless one takes the other over in place.
  """
  root, span = _slots(indices, buffers, takes)
  roots = list(span)
  if roots:
    result = assign_offsets([span[r][0] for r in roots], [span[r][1] for r in roots],
                            [span[r][2] for r in roots], alignment=alignment, time_limit=time_limit)
    offset_of = dict(zip(roots, result.offsets))
    size, bound, optimal, method = result.height, result.lower_bound, result.optimal, result.method
  else:
    offset_of, size, bound, optimal, method = {}, 0, 0, True, "empty"
  order = sorted(indices, key=lambda i: (buffers[i].live_range.start, i))
  allocs = tuple(Allocation(buffers[i], offset_of[root[i]],
                            buffers[takes[i]].name if i in takes else None) for i in order)
  assert all(a.offset % alignment == 0 and a.offset + a.size <= size for a in allocs)
  if len(allocs) <= _VALIDATE_MAX:
    _assert_disjoint(allocs)
  return Pool(name, key[0], key[1], size, bound, allocs, optimal, method)


def _assert_disjoint(allocs: Sequence[Allocation]) -> None:
  chain = {a.name: a.reuses for a in allocs}

  def related(x: str, y: str) -> bool:
    return any(_reaches(chain, p, q) for p, q in ((x, y), (y, x)))

  for i, a in enumerate(allocs):
    for b in allocs[i + 1:]:
      if (a.live_range.overlaps(b.live_range) and a.offset < b.offset + b.size
          and b.offset < a.offset + a.size):
        assert related(a.name, b.name), f"{a} and {b} overlap in time and memory"


def _reaches(chain: Mapping[str, str | None], src: str, dst: str) -> bool:
  while src is not None:
    if src == dst:
      return True
    src = chain.get(src)
  return False


def pool_name(kind: str, group: Sequence[str]) -> str:
  """``pool_<kind>_<axes>`` as an identifier, e.g. ``pool_symm_mem_x``."""
  return re.sub(r"\W", "_", "_".join(["pool", kind, *map(str, group)]))


def plan(lv: Liveness, *, name: str, arg_names: Sequence[str], out_names: Sequence[str],
         donated: set[int], comm: Mapping[int, tuple[str, tuple[str, ...]]], strict: bool,
         alignment: int, time_limit: float, inplace: bool = True) -> MemoryPlan:
  """Runs the passes: classify, copy out, group, allocate.

  Args:
    lv: the liveness walk of the program.
    name: the function's name, for the listing.
    arg_names, out_names: names of the flat arguments and outputs.
    donated: flat argument indices the program may overwrite.
    comm: value id -> (kind, group) for values that must live in a comm pool.
    strict: raise instead of copying comm buffers in or out.
    alignment: every offset is a multiple of this.
    time_limit: seconds each pool's offset search may take.
    inplace: let elementwise results take over dying regular buffers.
  """
  if alignment < 1:
    raise _errors.DonationError(_errors.message(
        "alignment must be a positive number of bytes", expected="an int >= 1", got=repr(alignment),
        fix="pass e.g. alignment=64"))
  buffers = classify(lv, arg_names=arg_names, out_names=out_names, donated=donated, comm=comm)
  buffers, copies = copy_out(buffers, lv, strict=strict)
  index = {v.id: i for i, v in enumerate(lv.values)}  # `copy_out` keeps value order
  takes = inplace_reuse(buffers, lv, index) if inplace else {}
  pools = [allocate(ARENA if key == ("regular", ()) else pool_name(*key), key, idx, buffers, takes,
                    alignment=alignment, time_limit=time_limit)
           for key, idx in group(buffers).items()]
  return MemoryPlan(name, tuple(buffers), tuple(pools[:-1]), pools[-1], tuple(copies), lv.steps,
                    alignment)


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
  return f"  {b.name} = alloc_from_pool({pool.name}, {a.offset}, {a.size})  # " + ", ".join(parts)


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}" + ("" if n == 1 else "s")


def listing(plan: MemoryPlan) -> str:
  """The plan as text in the spirit of Inductor's generated code (see `MemoryPlan`)."""
  copies_from = {c.source: c for c in plan.copies}
  lines = [f"# memory plan for {plan.name}: {_count(len(plan.steps), 'step')}, "
           f"alignment {plan.alignment}"]
  for pool in (*plan.pools, plan.arena):
    lines.append(str(pool))
    lines.extend(_line(a, pool, plan, copies_from) for a in pool.allocations)
  lines.extend(str(c) for c in plan.copies)
  for pool in (*plan.pools, plan.arena):
    lines.append(f"# {pool.name}: {pool.size} bytes (lower bound {pool.lower_bound})")
  lines.append(f"# collective memory: {plan.collective_memory_bytes} bytes; regular: "
               f"{plan.regular_bytes} bytes; total: {plan.total_bytes} bytes "
               f"(lower bound {plan.lower_bound_bytes})")
  return "\n".join(lines)


def to_html(plan: MemoryPlan) -> str:
  """An HTML summary: one table per pool, then the totals."""
  esc, copies_from = html.escape, {c.source: c for c in plan.copies}
  parts = [f"<div><b>memory plan for {esc(plan.name)}</b>: {len(plan.steps)} steps, "
           f"alignment {plan.alignment}"]
  head = "".join(f"<th>{h}</th>" for h in ("buffer", "offset", "size", "type", "role", "live",
                                            "producer", "fate"))
  for pool in (*plan.pools, plan.arena):
    parts.append(f"<p><code>{esc(pool.name)}</code>: {pool.size} bytes, lower bound "
                 f"{pool.lower_bound}" + ("" if pool.kind == "regular" else
                                          f", kind {esc(pool.kind)}, group {esc(str(pool.group))}")
                 + "</p>")
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in (
            a.name, a.offset, a.size, a.buffer.type_str, a.buffer.role, a.live_range,
            a.buffer.scope + a.buffer.producer, _fate(a, plan, copies_from))) + "</tr>"
        for a in pool.allocations)
    parts.append(f"<table><tr>{head}</tr>{rows}</table>")
  if plan.copies:
    parts.append("<p>" + "<br>".join(esc(str(c)) for c in plan.copies) + "</p>")
  parts.append(f"<p>collective memory {plan.collective_memory_bytes} bytes, regular "
               f"{plan.regular_bytes} bytes, total {plan.total_bytes} bytes (lower bound "
               f"{plan.lower_bound_bytes})</p></div>")
  return "".join(parts)


_COLORS = {"comm": "#d62728", "input": "#7f7f7f", "donated input": "#9467bd", "regular": "#1f77b4",
           "output": "#2ca02c"}


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
      ax.add_patch(Rectangle((lr.start, a.offset), len(lr), a.size, alpha=0.7,
                             facecolor=_COLORS.get(a.buffer.role, "#1f77b4"), edgecolor="black"))
      if len(pool.allocations) <= 40:
        ax.text(lr.start + len(lr) / 2, a.offset + a.size / 2, a.name, ha="center", va="center",
                fontsize=7, clip_on=True)
    ax.axhline(pool.lower_bound, color="black", linestyle=":", linewidth=1)
    ax.set_xlim(0, steps)
    ax.set_ylim(0, max(pool.size, 1))
    ax.set_xlabel("step")
    ax.set_ylabel("bytes")
    ax.set_title(f"{pool.name}: {pool.size} bytes (lower bound {pool.lower_bound}, dotted)",
                 fontsize=9)
  roles = sorted({a.buffer.role for p in pools for a in p.allocations}, key=ROLES.index)
  fig.legend(handles=[Rectangle((0, 0), 1, 1, facecolor=_COLORS[r], alpha=0.7, label=r)
                      for r in roles], loc="outside lower center", ncols=max(len(roles), 1),
             fontsize=8)
  return fig
