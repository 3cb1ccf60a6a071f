"""The records of a memory plan: live ranges, buffers, their allocations, pools and copies.

Frozen, slotted and printable; `passes` makes them and `memory_plan.MemoryPlan` holds them.
"""

from __future__ import annotations

import dataclasses

from donate._planner.text import count

ROLES = ("input", "donated input", "regular", "output", "comm")


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
    return (
      f"{self.name}: {self.type_str} {self.role} {self.live_range} from {self.scope}{self.producer}"
    )


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
  def nbytes(self) -> int:
    """The buffer's size in bytes."""
    return self.buffer.nbytes

  @property
  def size(self) -> int:
    """The old name of `nbytes`."""
    return self.nbytes

  @property
  def live_range(self) -> LiveRange:
    return self.buffer.live_range

  def __str__(self) -> str:
    return f"{self.name} @ {self.offset} +{self.nbytes} {self.live_range}"


@dataclasses.dataclass(frozen=True, slots=True)
class Pool:
  """One contiguous block of memory and the buffers placed in it.

  Attributes:
    name: ``"pool_<kind>_<group>"`` for comm pools, ``"arena"`` for regular buffers.
    kind: comm buffer kind, or ``"regular"``.
    group: mesh axis names (empty for the arena).
    nbytes: bytes the pool needs (the height of its offset assignment).
    lower_bound_bytes: the most bytes ever live at once; no assignment can be smaller.
    allocations: buffers with offsets, ordered by start (then creation).
    optimal: whether `nbytes` is proven minimal.
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
  nbytes: int
  lower_bound_bytes: int
  allocations: tuple[Allocation, ...]
  optimal: bool = True
  method: str = ""

  @property
  def buffers(self) -> tuple[Buffer, ...]:
    return tuple(a.buffer for a in self.allocations)

  @property
  def offsets(self) -> dict[str, int]:
    return {a.name: a.offset for a in self.allocations}

  @property
  def size(self) -> int:
    """The old name of `nbytes`."""
    return self.nbytes

  @property
  def lower_bound(self) -> int:
    """The old name of `lower_bound_bytes`."""
    return self.lower_bound_bytes

  def __str__(self) -> str:
    what = (
      "regular buffers" if self.kind == "regular" else f"kind={self.kind!r}, group={self.group!r}"
    )
    return (
      f"{self.name} = empty_pool({self.nbytes})  # {what}, lower bound {self.lower_bound_bytes}, "
      f"{count(len(self.allocations), 'buffer')}"
    )


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
