"""Sizing collective memory: from the planner's pools, and from XLA's buffer assignment.

``collective_memory_bytes`` sums pool (or buffer) sizes; ``collective_memory_mb`` and
``collective_memory_env`` turn bytes into the ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB`` setting
that sizes the GPU client's collective allocator (read once, when JAX starts its GPU backend).

``xla_dump_options(dir)`` are per-compile options (``xla_dump_to``, ``xla_dump_hlo_as_text``)
that make XLA write the compiled module's ``*buffer-assignment.txt``; ``collective_allocation``
reads it: the allocations whose colour is the collective memory space (``S(1)`` on jaxlib 0.10,
``S(7)`` on 0.12; never 0, never host memory ``S(5)``) hold every buffer placed in collective
memory, at the offsets XLA chose. Their total is the collective memory one device needs for this
program; ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB`` must be at least that, in MiB, rounded up.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import tempfile

from donate._base.errors import DonationError, message
from donate._xla import hlo as _hlo
from donate._xla import hlo_dump as _hlo_dump

_MB = 1 << 20


def _size_of(item) -> int:
  if isinstance(item, int) and not isinstance(item, bool):
    return item
  if hasattr(item, "nbytes"):
    return int(item.nbytes)
  raise DonationError(
    message(
      "collective_memory_bytes cannot size an item",
      expected="a byte count or an object with .nbytes (a pool or a CommBuffer)",
      got=type(item).__name__,
    )
  )


def collective_memory_bytes(items) -> int:
  """Returns the collective memory to reserve: the sum of pool (or buffer) sizes, in bytes.

  Pass the planner's pools (each pool is reused by all its buffers, so the sum of pool sizes is the
  reservation). Passing comm buffers instead gives an upper bound (no reuse).

  Args:
    items: byte counts, or objects with an ``nbytes`` attribute.

  >>> collective_memory_bytes([192, 64])
  256
  """
  return sum(_size_of(item) for item in items)


def collective_memory_mb(nbytes: int) -> int:
  """``nbytes`` in MiB, rounded up: the value for ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB``.

  >>> collective_memory_mb(0), collective_memory_mb(1), collective_memory_mb(3 << 20)
  (0, 1, 3)
  """
  return math.ceil(int(nbytes) / _MB)


def collective_memory_env(nbytes: int) -> dict[str, str]:
  """Returns the environment setting that reserves ``nbytes`` of collective memory on GPUs.

  It must be set before JAX starts its GPU backend (it sizes the process's collective allocator).

  >>> collective_memory_env(5 << 20)
  {'XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB': '5'}
  """
  return {"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": str(collective_memory_mb(nbytes))}


xla_dump_options = _hlo_dump.dump_options  # the dump this module reads (see `_hlo_dump`)


@dataclasses.dataclass(frozen=True, slots=True)
class XlaCollectiveMemory:
  """XLA's collective-memory allocation(s) for one compiled program, per device.

  Attributes:
    nbytes: total bytes of the collective-colour allocations.
    color: the collective memory space (colour) number, or 0 if nothing was placed.
    allocations: the allocations themselves (values with sizes and offsets).
    env: the ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB`` setting that covers it.
  """

  nbytes: int
  color: int
  allocations: tuple[_hlo_dump.XlaAllocation, ...]

  @property
  def recommended_mb(self) -> int:
    return collective_memory_mb(self.nbytes)

  @property
  def env(self) -> dict[str, str]:
    return collective_memory_env(self.nbytes)

  @property
  def value_bytes(self) -> int:
    """Bytes of the values placed, without XLA's reuse of offsets (an upper bound)."""
    return sum(v[1] for a in self.allocations for v in a.values)

  def __str__(self) -> str:
    return (
      f"XLA collective memory: {self.nbytes} B per device in {len(self.allocations)} "
      f"allocation(s) (colour {self.color}); XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB="
      f"{self.recommended_mb}"
    )


def collective_allocation(
  dump_dir: str, compiled_hlo_text: str | None = None
) -> XlaCollectiveMemory:
  """Reads XLA's collective-memory allocations from a dump of one compiled program.

  Args:
    dump_dir: the ``xla_dump_to`` directory of exactly one compile.
    compiled_hlo_text: the program's ``Compiled.as_text()``; it tells which colour collectives
      use. Without it, every non-default, non-host colour counts.

  Returns:
    An ``XlaCollectiveMemory``.
  """
  files = sorted(
    f for f in glob.glob(os.path.join(dump_dir, "*after_optimizations-buffer-assignment.txt"))
  )
  if not files:
    raise FileNotFoundError(f"no *after_optimizations-buffer-assignment.txt in {dump_dir}")
  with open(files[-1]) as fh:
    allocations = _hlo_dump.parse_buffer_assignment(fh.read())
  if compiled_hlo_text is not None:
    colors = _hlo.collective_memory_spaces(_hlo.parse_module(compiled_hlo_text))
  else:
    colors = frozenset(a.color for a in allocations) - {0, _hlo.HOST_MEMORY_SPACE}
  chosen = tuple(a for a in allocations if a.color in colors)
  return XlaCollectiveMemory(sum(a.nbytes for a in chosen), min(colors, default=0), chosen)


def xla_collective_memory(lowered, compiler_options: dict | None = None):
  """Compiles ``lowered`` with a buffer-assignment dump and returns (compiled, XLA's allocation).

  Args:
    lowered: a ``jax.stages.Lowered`` (from ``jax.jit(f).lower(...)``).
    compiler_options: the options to compile with (e.g. ``compile_options_for(...)``).

  Returns:
    ``(compiled, XlaCollectiveMemory)``.

  >>> import jax, jax.numpy as jnp
  >>> compiled, memory = xla_collective_memory(jax.jit(jnp.sin).lower(jnp.ones(4)))
  >>> memory.nbytes, memory.env  # a CPU program: no collective memory
  (0, {'XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB': '0'})
  """
  with tempfile.TemporaryDirectory(prefix="donate-xla-dump-") as directory:
    compiled = lowered.compile(
      compiler_options={**(compiler_options or {}), **xla_dump_options(directory)}
    )
    text = compiled.as_text()
    return compiled, collective_allocation(directory, text)


@dataclasses.dataclass(frozen=True, slots=True)
class SizingRow:
  """One line of the sizing table: a program, XLA's collective allocation and our planned pools."""

  program: str
  xla_bytes: int
  planned_bytes: int
  annotated_bytes: int

  @property
  def ratio(self) -> float:
    return self.planned_bytes / self.xla_bytes if self.xla_bytes else float("nan")

  @property
  def note(self) -> str:
    if self.planned_bytes <= self.xla_bytes:
      return (
        "ours holds only the annotated operands; XLA's also holds collective results and "
        "every other buffer it placed"
        if self.planned_bytes < self.xla_bytes
        else "equal"
      )
    return (
      "ours is larger: XLA reuses offsets across buffers whose lifetimes it sees in the "
      "scheduled program, or fused away a buffer our jaxpr-level plan keeps"
    )


def sizing_table(rows) -> str:
  """A text table of ``SizingRow``s: XLA's allocation, the recommended MB, our pool, the ratio.

  >>> print(sizing_table([SizingRow("step", 8192, 4096, 4096)]))
  | program | XLA collective bytes | COLLECTIVE_MEM_SIZE_MB | planner pool bytes | pool / XLA | annotated bytes |
  |---------|----------------------|------------------------|--------------------|------------|-----------------|
  | step    | 8192                 | 1                      | 4096               | 0.50       | 4096            |
  """  # noqa: E501 (the doctest's table is wider than a line)
  head = (
    "program",
    "XLA collective bytes",
    "COLLECTIVE_MEM_SIZE_MB",
    "planner pool bytes",
    "pool / XLA",
    "annotated bytes",
  )
  body = [
    (
      r.program,
      str(r.xla_bytes),
      str(collective_memory_mb(r.xla_bytes)),
      str(r.planned_bytes),
      f"{r.ratio:.2f}",
      str(r.annotated_bytes),
    )
    for r in rows
  ]
  widths = [max(len(x) for x in col) for col in zip(head, *body)]

  def fmt(cells):
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

  return "\n".join(
    [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, body)]
  )
