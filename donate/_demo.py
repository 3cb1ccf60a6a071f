"""Measurements shared by `python -m donate` and `benchmarks/`: each against `jax.jit` in one run,
and the memory doctor on a small training step (`doctor`).

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
from donate._profile.advice import Advice
from donate._profile.profile import MemoryProfile


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


@dataclasses.dataclass(frozen=True, slots=True)
class Doctor:
  """What the memory doctor found on the demo's training step, and one remedy it measured."""

  profile: MemoryProfile  # of jax.jit(lm_train_step) without donation
  remedy: Advice  # the donation item of profile.advice(): its peak measured by a compile
  workload: str


def doctor(layers: int = 4, d_model: int = 128, batch: int = 8, seq: int = 128) -> Doctor:
  """Profiles `jax.jit(lm_train_step)` as a user first writes it (nothing donated) and measures
  the donation the profile suggests with one compile (`advice(candidates=["donate"])`)."""
  from donate import _examples
  from donate._profile import memory_profile

  params = _examples.lm_init(jax.random.key(0), d_model=d_model, layers=layers, d_ff=4 * d_model)
  opt = _examples.adam_init(params)
  tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, 512)
  profile = memory_profile(_compat.jax_jit(_examples.lm_train_step), params, opt, tokens)
  remedy = next(a for a in profile.advice(candidates=["donate"]) if a.measured)
  workload = (
    f"a {layers}-layer transformer (d_model {d_model}, vocab 512, batch {batch} x {seq} tokens) "
    "trained with Adam, jitted without donation"
  )
  return Doctor(profile, remedy, workload)


def doctor_text(found: Doctor) -> str:
  """The doctor's summary: the peak by category, the line holding most, the measured remedy."""
  p = found.profile
  top = p.by_line()[0]
  rows = [f"  {format_bytes(g.total_bytes):>10}  {g.key}" for g in p.by_category()[:5]]
  remedy = found.remedy
  return "\n".join(
    [
      f"step: {found.workload}",
      f"peak {format_bytes(p.peak_bytes)}; by category:",
      *rows,
      f"the line that holds most: {top}",
      f"remedy, measured by a compile: {remedy.how}: peak {format_bytes(p.peak_bytes)} -> "
      f"{format_bytes(remedy.peak_bytes or 0)} ({format_bytes(remedy.saving_bytes)} saved)",
    ]
  )
