"""Memory benchmarks from compiled programs: gradient accumulation and preallocated slices.

Every figure is a compiled program's `memory_analysis()`; rows compare with `jax.jit` in one run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import donate
from donate import _examples as examples
from donate._base.text import format_bytes


def _peak(compiled) -> tuple[int, int]:
  m = compiled.memory_analysis()
  peak = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)
  return peak, m.temp_size_in_bytes


def _table(head, rows) -> str:
  widths = [max(len(str(r[k])) for r in [head, *rows]) for k in range(len(head))]
  line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
  return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                    *map(line, rows)])


def grad_accum_rows(width: int = 512, micro: int = 4, batch: int = 32):
  """(name, peak, temp) for the gradient-accumulation step, plus the floor and its parts."""
  params = examples.mlp_init(jax.random.key(0), width=width, depth_in=width, out=width)
  acc = jax.tree.map(jnp.zeros_like, params)
  batches = examples.micro_batches(jax.random.key(1), micro, batch, width, width)
  rows = [
      ("jax.jit (no donation)", *_peak(jax.jit(examples.grad_accum_step)
                                       .lower(params, acc, batches).compile())),
      ("jax.jit(donate_argnums=(0, 1)), hand-written",
       *_peak(jax.jit(examples.grad_accum_step, donate_argnums=(0, 1))
              .lower(params, acc, batches).compile())),
  ]
  for name, g in (("donate.jit(donate_argnums=(0, 1))",
                   donate.jit(examples.grad_accum_step, donate_argnums=(0, 1))),
                  ("donate.jit, donate_buffer in the scan body only",
                   donate.jit(examples.grad_accum_step_annotated))):
    plan = g.plan(params, acc, batches)
    rows.append((name, plan.memory.peak_bytes, plan.memory.temp_bytes))
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  batch_bytes = sum(x.nbytes for x in jax.tree.leaves(batches))
  floor = 3 * param_bytes + batch_bytes  # params + accumulators + one gradient, and the data
  return rows, floor


def grad_accum_table() -> str:
  rows, floor = grad_accum_rows()
  base = rows[0][1]
  body = [(n, format_bytes(p), format_bytes(t), f"{p / base:.2f}x", format_bytes(p - floor))
          for n, p, t in rows]
  return ("### 4. Gradient accumulation: 2-layer 512-wide MLP, 4 micro-batches of 32 (scan)\n\n"
          + _table(("variant", "peak", "temporaries", "peak vs no donation", "above floor"), body)
          + f"\n\nFloor = parameters + accumulators + one micro-batch gradient + the batch = "
          f"{format_bytes(floor)}.")


def prealloc_rows(T: int, width: int):
  """(fill, jax.jit temp, jax.jit fresh output bytes, into temp, into fresh output bytes)."""
  xs = jax.random.normal(jax.random.key(0), (T, width))
  rows = []
  for name, fill in (("fori_loop", examples.fill_fori), ("lax.map", examples.fill_map)):
    m = jax.jit(fill).lower(xs).compile().memory_analysis()
    plan = donate.jit(fill).into(jnp.empty((T, width))).plan(xs)
    rows.append((name, m.temp_size_in_bytes, m.output_size_in_bytes - m.alias_size_in_bytes,
                 plan.memory.temp_bytes, plan.memory.output_bytes - plan.memory.alias_bytes))
  return rows


def prealloc_slices_table(quick: bool = False) -> str:
  T, width = (64, 1024) if quick else (256, 16384)
  slice_bytes = width * 4
  body = [(name, format_bytes(tj), format_bytes(oj), format_bytes(to), format_bytes(oo),
           f"{to / slice_bytes:.3f}") for name, tj, oj, to, oo in prealloc_rows(T, width)]
  return (f"### 5. Preallocated [T, D] output filled slice by slice, T={T}, D={width} float32 "
          f"(one slice = {format_bytes(slice_bytes)})\n\n"
          + _table(("fill", "jax.jit temporaries", "jax.jit new output per step",
                    "into(out) temporaries", "into(out) new output per step",
                    "into temporaries / slice"), body)
          + "\n\nBoth write slices in place; into(out) writes them into the caller's buffer, so "
          "a step allocates no output and the address stays the same from step to step.")
