"""Measurements shared by `python -m donate` and `benchmarks/`: each against `jax.jit` in one run.

Every figure comes from the compiled programs (`memory_analysis()`) or from timing real steps on
this machine; nothing is estimated.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp

from donate._base import compat as _compat
from donate._base.text import format_bytes
from donate._jit import wrapper as _jit
from donate._plan.memory_stats import MemoryStats


def swapped_update(a, b):
  """The case `jax.jit` pairs wrongly: output 0 updates b in place, output 1 is computed from a."""
  return b.at[0].set(1.0), a + 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
  """One variant of one benchmark."""

  name: str
  donated: int
  reused: int
  memory: MemoryStats
  seconds: float


def _time_steps(step: Callable, make_inputs: Callable, steps: int, feed: Callable) -> float:
  """Median seconds per step, feeding each step's outputs into the next (donation consumes)."""
  state = make_inputs()
  state = feed(step(*state))
  jax.block_until_ready(state)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state = feed(step(*state))
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  del state
  gc.collect()
  return statistics.median(times)


def compare_swapped(n: int = 2**26, steps: int = 10) -> list[Row]:
  """`swapped_update` on two float32[n] arrays: donate.jit, jax.jit donating both, no donation."""
  make = lambda: (jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.float32))
  feed = lambda out: (out[1], out[0])
  shapes = (jax.ShapeDtypeStruct((n,), jnp.float32),) * 2
  ours = _jit.jit(swapped_update, donate_argnums=(0, 1))
  plan = ours.plan(*make())
  assert plan.memory is not None, "the CPU backend reports memory statistics"
  rows = [
    Row(
      "donate.jit",
      plan.requested_bytes,
      plan.reused_bytes,
      plan.memory,
      _time_steps(ours, make, steps, feed),
    )
  ]
  for name, donated in (("jax.jit(donate_argnums=(0, 1))", (0, 1)), ("jax.jit (no donation)", ())):
    fn = _compat.jax_jit(swapped_update, donate_argnums=donated)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      memory = MemoryStats.from_compiled(fn.lower(*shapes).compile())
    assert memory is not None, "the CPU backend reports memory statistics"
    rows.append(
      Row(
        name, len(donated) * n * 4, memory.alias_bytes, memory, _time_steps(fn, make, steps, feed)
      )
    )
  return rows


def table(rows: list[Row], reference: str) -> str:
  """A text table; ratios are against the row named `reference`."""
  ref = next(r for r in rows if r.name == reference)
  head = (
    "variant",
    "donated",
    "reused",
    "temporaries",
    "peak",
    "peak ratio",
    "step ms",
    "time ratio",
  )
  body = [
    (
      r.name,
      format_bytes(r.donated),
      format_bytes(r.reused),
      format_bytes(r.memory.temp_bytes),
      format_bytes(r.memory.peak_bytes),
      f"{r.memory.peak_bytes / ref.memory.peak_bytes:.2f}x",
      f"{r.seconds * 1e3:.2f}",
      f"{r.seconds / ref.seconds:.2f}x",
    )
    for r in rows
  ]
  widths = [max(len(x[k]) for x in [head, *body]) for k in range(len(head))]
  line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
  sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  return "\n".join([line(head), sep, *map(line, body)])


def machine() -> str:
  import os
  import platform

  return (
    f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
    f"jax {jax.__version__}, backend {jax.default_backend()}"
  )
