"""Compiled peak of real step functions whose outputs do not mirror their donated inputs (issue 27).

`jax.jit` pairs donated inputs with outputs first come, first served (by shape and dtype, in
order); `donate.jit` pairs them by dataflow. Where the two differ, one of them may make XLA copy a
donated buffer. Every row is a step compiled with `jax.jit(step, donate_argnums=...)` and
`donate.jit(step, donate_argnums=...)` (and "mirrored", below), from the same
`jax.ShapeDtypeStruct`s (carrying NamedShardings), on three targets:

  cpu1   one CPU device;
  cpu8   8 virtual CPU devices (`jax_num_cpu_devices`), parameters and optimizer state FSDP-sharded
         (first axis over the mesh where it divides), batches and caches sharded on the batch axis;
  h100   8 compile-only H100s (`donate.targets.gpu_mesh`, the gpu-aot extra; skipped without it),
         sharded as cpu8.

Peak = arguments + outputs - aliased + temporaries, from `memory_analysis()` (the figure the rest
of this suite and `donate`'s plans use); XLA's own `peak_memory_in_bytes` is printed beside it.
"Mirrored" is `jax.jit` of the same step with its outputs reordered to mirror the donated inputs
(`MIRROR`): the pairing first come, first served gets right, a reference for what dataflow pairing
can reach. The target: donate.jit <= jax.jit on every row, and lower wherever first-come pairing
copies. A row that raises under one of them is listed as an error with the exception's first line.
The summary lines list the rows where donate.jit's peak is above jax.jit's, the errors, and the
rows where donate.jit's peak is above the mirrored order's.

Needs optax (the test extra). About 20 s on 2 cores (jax 0.10), 45 s (jax 0.12):

  python benchmarks/bench_pairing_peak.py [--targets cpu1,cpu8,h100] [--rows tie,leapfrog,...]
      [--compile-times REPEATS]

`--compile-times` also times `lower().compile()` of each row (fresh step functions, jax.jit and
donate.jit alternating, median of REPEATS) and counts the programs donate.jit compiles: 2 where
the re-paired program is checked against `jax.jit`'s own (any re-paired program that needs
temporaries or leaves a donated buffer unused).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)  # before any backend is used

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import (
  Mesh,  # noqa: E402
  NamedSharding,  # noqa: E402
)
from jax.sharding import PartitionSpec as P  # noqa: E402

import donate  # noqa: E402
from donate import targets  # noqa: E402
from donate._base.text import format_bytes  # noqa: E402

AXIS = "x"


# ---- shardings -------------------------------------------------------------------------------

def _spec(shape, n: int, axis: int = 0) -> P:
  """Shards `axis` over the mesh where it divides evenly (FSDP-style), else replicates."""
  if len(shape) > axis and shape[axis] % n == 0 and shape[axis] >= n:
    return P(*([None] * axis), AXIS)
  return P()


def _struct(mesh, x, axis: int = 0):
  return jax.ShapeDtypeStruct(x.shape, x.dtype,
                              sharding=NamedSharding(mesh, _spec(x.shape, mesh.size, axis)))


def _abstract(mesh, tree, axis: int = 0):
  return jax.tree.map(lambda x: _struct(mesh, x, axis), tree)


# ---- models ------------------------------------------------------------------------------------

WIDTH, DEPTH, BATCH = 512, 3, 64


def mlp_params(width: int = WIDTH, depth: int = DEPTH):
  """The MLP's parameters as shapes: `depth` layers of [width, width] weights and biases."""
  return {f"layer{i}": {"w": jax.ShapeDtypeStruct((width, width), jnp.float32),
                        "b": jax.ShapeDtypeStruct((width,), jnp.float32)}
          for i in range(depth)}


def mlp_loss(params, x, y):
  h = x
  for i in range(len(params)):
    layer = params[f"layer{i}"]
    h = jnp.tanh(h @ layer["w"] + layer["b"])
  return jnp.mean((h - y) ** 2)


def _batch(mesh):
  xy = jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32)
  return _struct(mesh, xy), _struct(mesh, xy)


def _opt_args(mesh, opt):
  params = mlp_params()
  state = jax.eval_shape(opt.init, params)
  return (_abstract(mesh, params), _abstract(mesh, state), *_batch(mesh))


# ---- rows: each returns (step, donate_argnums, args, a context factory) for a mesh ------------

N_SMALL = 1 << 20  # the float32[2**20]


def _vec(mesh, n: int = N_SMALL):
  return _struct(mesh, jax.ShapeDtypeStruct((n,), jnp.float32))


def row_swap(mesh):
  """The issue's first example: an in-place update returned before the other input's."""
  def f(a, b):
    return b.at[0].set(1.), a + 1.
  return f, (0, 1), (_vec(mesh), _vec(mesh)), contextlib.nullcontext


def row_tie(mesh):
  """The issue's tie: out[0] reads both donated inputs; p is still read by out[1]."""
  def step(p, m):
    m = 0.9 * m + (jnp.cos(p) + 1e-4 * p)
    return m, p - 0.1 * m
  return step, (0, 1), (_vec(mesh), _vec(mesh)), contextlib.nullcontext


def row_swap_wsc(mesh):
  """The swapped update with both outputs constrained by with_sharding_constraint (as sharded
  code constrains what it returns)."""
  s = NamedSharding(mesh, P(AXIS))
  def f(a, b):
    wsc = jax.lax.with_sharding_constraint
    return wsc(b.at[0].set(1.), s), wsc(a + 1., s)
  return f, (0, 1), (_vec(mesh), _vec(mesh)), contextlib.nullcontext


def _explicit(mesh):
  return Mesh(mesh.devices, mesh.axis_names, axis_types=(jax.sharding.AxisType.Explicit,))


def row_swap_reshard(mesh):
  """The swapped update on Explicit mesh axes, both outputs passed through
  jax.sharding.reshard (a scatter into a sharded operand on Explicit axes needs out_sharding)."""
  emesh = _explicit(mesh)
  def f(a, b):
    reshard = jax.sharding.reshard
    return reshard(b.at[0].set(1., out_sharding=P(AXIS)), P(AXIS)), reshard(a + 1., P(AXIS))
  return f, (0, 1), (_vec(emesh), _vec(emesh)), lambda: jax.set_mesh(emesh)


def row_swap_explicit(mesh):
  """Two in-place updates returned swapped, on Explicit mesh axes: `.at[].set/add(...,
  out_sharding=)`."""
  emesh = _explicit(mesh)
  def f(a, b):
    return b.at[0].set(1., out_sharding=P(AXIS)), a.at[1].add(1., out_sharding=P(AXIS))
  return f, (0, 1), (_vec(emesh), _vec(emesh)), lambda: jax.set_mesh(emesh)


def _grads_first(opt):
  def update(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return loss, grads, optax.apply_updates(params, updates), opt_state
  return update


def row_adam_grads_first(mesh):
  """ALTA's `update` shape: returns (loss, grads, params, opt_state), optax.adam."""
  opt = optax.adam(1e-3)
  return _grads_first(opt), (0, 1), _opt_args(mesh, opt), contextlib.nullcontext


def row_adafactor_grads_first(mesh):
  """As above with optax.adafactor (factored second moments, (1,) placeholder leaves)."""
  opt = optax.adafactor(1e-3)
  return _grads_first(opt), (0, 1), _opt_args(mesh, opt), contextlib.nullcontext


def row_model_then_state(mesh):
  """The model is not donated but returned first; only the Adam state is donated."""
  opt = optax.adam(1e-3)
  def step(params, opt_state, x, y):
    grads = jax.grad(mlp_loss)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  return step, (1,), _opt_args(mesh, opt), contextlib.nullcontext


def row_chain_wd_momentum(mesh):
  """optax.chain(add_decayed_weights, sgd(momentum)) returning (loss, opt_state, params)."""
  opt = optax.chain(optax.add_decayed_weights(1e-4), optax.sgd(1e-2, momentum=0.9))
  def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return loss, opt_state, optax.apply_updates(params, updates)
  return step, (0, 1), _opt_args(mesh, opt), contextlib.nullcontext


def row_leapfrog(mesh, n: int = 1024):
  """A leapfrog (FDTD-style) wave step: (u_curr, u_prev) -> (u_next, u_curr)."""
  def step(u_curr, u_prev):
    lap = (jnp.roll(u_curr, 1, 0) + jnp.roll(u_curr, -1, 0) + jnp.roll(u_curr, 1, 1)
           + jnp.roll(u_curr, -1, 1) - 4 * u_curr)
    return 2 * u_curr - u_prev + 0.1 * lap, u_curr
  u = _struct(mesh, jax.ShapeDtypeStruct((n, n), jnp.float32))
  return step, (0, 1), (u, u), contextlib.nullcontext


KV_B, KV_S, KV_D, KV_LAYERS = 8, 256, 256, 2


def row_kv_cache_second(mesh):
  """A decode step whose KV cache is the second donated argument, after the window's hidden
  states (same [B, S, D] as each cache leaf), returning (cache, hidden)."""
  leaf = jax.ShapeDtypeStruct((KV_B, KV_S, KV_D), jnp.float32)
  w = jax.ShapeDtypeStruct((KV_D, KV_D), jnp.float32)
  params = [{"wq": w, "wk": w, "wv": w, "wo": w} for _ in range(KV_LAYERS)]
  cache = [{"k": leaf, "v": leaf} for _ in range(KV_LAYERS)]
  def decode(h, cache, params, pos):
    new_cache = []
    x = jax.lax.dynamic_slice_in_dim(h, pos, 1, axis=1)  # [B, 1, D]
    for layer, c in zip(params, cache):
      k = jax.lax.dynamic_update_slice_in_dim(c["k"], x @ layer["wk"], pos, axis=1)
      v = jax.lax.dynamic_update_slice_in_dim(c["v"], x @ layer["wv"], pos, axis=1)
      q = x @ layer["wq"]
      att = jax.nn.softmax(jnp.einsum("bqd,bsd->bqs", q, k) / np.sqrt(KV_D), axis=-1)
      x = x + jnp.einsum("bqs,bsd->bqd", att, v) @ layer["wo"]
      new_cache.append({"k": k, "v": v})
    return new_cache, jax.lax.dynamic_update_slice_in_dim(h, x, pos, axis=1)
  pos = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
  args = (_abstract(mesh, leaf), _abstract(mesh, cache), _abstract(mesh, params, axis=1), pos)
  return decode, (0, 1), args, contextlib.nullcontext


# Each row's outputs reordered to mirror its donated inputs: `jax.jit` of this order is the
# pairing first come, first served gets right, the reference donate.jit should reach.
MIRROR = {
    "swap": (1, 0), "tie": (1, 0), "swap_wsc": (1, 0), "swap_reshard": (1, 0),
    "swap_explicit": (1, 0), "adam_grads_first": (2, 3, 0, 1),
    "adafactor_grads_first": (2, 3, 0, 1), "model_then_state": (1, 0),
    "chain_wd_momentum": (0, 2, 1), "leapfrog": (1, 0), "kv_cache_second": (1, 0),
}


def mirrored(step, order):
  """`step` with its outputs in `order` (same buffers, same program otherwise)."""
  def reordered(*args):
    out = step(*args)
    return tuple(out[i] for i in order)
  return reordered


ROWS = {
    "swap": row_swap,
    "tie": row_tie,
    "swap_wsc": row_swap_wsc,
    "swap_reshard": row_swap_reshard,
    "swap_explicit": row_swap_explicit,
    "adam_grads_first": row_adam_grads_first,
    "adafactor_grads_first": row_adafactor_grads_first,
    "model_then_state": row_model_then_state,
    "chain_wd_momentum": row_chain_wd_momentum,
    "leapfrog": row_leapfrog,
    "kv_cache_second": row_kv_cache_second,
}


# ---- targets -----------------------------------------------------------------------------------

def make_mesh(target: str):
  """The mesh of `target`, or a string saying why it is not available."""
  if target == "cpu1":
    return Mesh(np.array(jax.devices("cpu")[:1]), (AXIS,))
  if target == "cpu8":
    devices = jax.devices("cpu")
    if len(devices) < 8:
      return f"only {len(devices)} CPU devices"
    return Mesh(np.array(devices[:8]), (AXIS,))
  if target == "h100":
    if not targets.available():
      return "no CUDA plugin at the jaxlib version (pip install \"jax-donate[gpu-aot]\")"
    return targets.gpu_mesh("h100", 8, (AXIS,))
  raise ValueError(f"unknown target {target!r}: cpu1, cpu8 or h100")


# ---- measuring ---------------------------------------------------------------------------------

def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


def compiled_memory(jit, step, donate_argnums, args, context):
  """(peak, temp, XLA's peak_memory_in_bytes or None) of `jit(step, donate_argnums=...)`,
  lowered and compiled inside `context()` (the row's mesh context, if any)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with context():
      compiled = jit(step, donate_argnums=donate_argnums).lower(*args).compile()
  m = compiled.memory_analysis()
  peak = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)
  xla_peak = getattr(m, "peak_memory_in_bytes", None)
  return int(peak), int(m.temp_size_in_bytes), None if xla_peak is None else int(xla_peak)


def measure(name: str, target: str, mesh) -> dict:
  step, donate_argnums, args, context = ROWS[name](mesh)
  out = {"row": name, "target": target}
  for key, jit, fun in (("jax", jax.jit, step), ("donate", donate.jit, step),
                        ("mirror", jax.jit, mirrored(step, MIRROR[name]))):
    try:
      out[key] = compiled_memory(jit, fun, donate_argnums, args, context)
    except Exception as e:  # noqa: BLE001: reported in the table
      out[key] = _first_line(e)
  return out


def _cell(r, key, k):
  v = r[key]
  if isinstance(v, str):
    return "error"
  return "-" if v[k] is None else format_bytes(v[k])


def table(results) -> str:
  head = ("row", "target", "jax.jit peak", "donate.jit peak", "ratio", "jax.jit temp",
          "donate.jit temp", "mirrored peak / temp", "XLA peak jax / donate")
  body = []
  for r in results:
    j, d = r["jax"], r["donate"]
    ratio = (f"{d[0] / j[0]:.3f}x" if not isinstance(j, str) and not isinstance(d, str)
             else "error")
    xla = (f"{_cell(r, 'jax', 2)} / {_cell(r, 'donate', 2)}")
    body.append((r["row"], r["target"], _cell(r, "jax", 0), _cell(r, "donate", 0), ratio,
                 _cell(r, "jax", 1), _cell(r, "donate", 1),
                 f"{_cell(r, 'mirror', 0)} / {_cell(r, 'mirror', 1)}", xla))
  widths = [max(len(str(row[k])) for row in [head, *body]) for k in range(len(head))]
  line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
  return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                    *map(line, body)])


def summary(results) -> str:
  worse, errors, lower, missed = [], [], [], []
  for r in results:
    j, d, m = r["jax"], r["donate"], r["mirror"]
    where = f"{r['row']} on {r['target']}"
    if not isinstance(d, str) and not isinstance(m, str) and d[0] > m[0]:
      missed.append(f"{where}: {format_bytes(d[0])} vs {format_bytes(m[0])} "
                    f"(+{format_bytes(d[0] - m[0])})")
    if isinstance(j, str) or isinstance(d, str):
      errors.append(f"{where}: jax.jit {j if isinstance(j, str) else 'ok'}; donate.jit "
                    f"{d if isinstance(d, str) else 'ok'}")
    elif d[0] > j[0]:
      worse.append(f"{where}: {format_bytes(d[0])} vs {format_bytes(j[0])} "
                   f"(+{format_bytes(d[0] - j[0])}, {100 * (d[0] / j[0] - 1):.1f}%)")
    elif d[0] < j[0]:
      lower.append(where)
  lines = [f"donate.jit peak > jax.jit peak on {len(worse)} of {len(results)} rows"
           + (":" if worse else ".")]
  lines += [f"  {w}" for w in worse]
  lines.append(f"donate.jit peak < jax.jit peak on {len(lower)} rows; errors on {len(errors)}"
               + (":" if errors else "."))
  lines += [f"  {e}" for e in errors]
  lines.append(f"donate.jit peak above the mirrored order's on {len(missed)} rows"
               + (":" if missed else "."))
  lines += [f"  {m}" for m in missed]
  return "\n".join(lines)


class _Compiles:
  """Counts XLA compiles (JAX's backend-compile events) while `active`."""

  def __init__(self):
    self.count, self.active = 0, False
    jax.monitoring.register_event_duration_secs_listener(self._heard)

  def _heard(self, event, duration, **kwargs):
    if self.active and event == "/jax/core/compile/backend_compile_duration":
      self.count += 1


def compile_times(names, target: str, mesh, repeats: int) -> str:
  """`lower().compile()` of fresh functions, median of `repeats` (jax.jit and donate.jit
  alternating which goes first), and how many programs donate.jit compiled."""
  compiles, lines = _Compiles(), []
  for name in names:
    times, counts = {jax.jit: [], donate.jit: []}, set()
    for k in range(repeats):
      for jit in (jax.jit, donate.jit) if k % 2 else (donate.jit, jax.jit):
        step, donate_argnums, args, context = ROWS[name](mesh)  # a new step function
        with warnings.catch_warnings(), context():
          warnings.simplefilter("ignore")
          compiles.count, compiles.active = 0, True
          start = time.perf_counter()
          jit(step, donate_argnums=donate_argnums).lower(*args).compile()
          times[jit].append(time.perf_counter() - start)
          compiles.active = False
        if jit is donate.jit:
          counts.add(compiles.count)
    theirs, ours = (float(np.median(times[j])) for j in (jax.jit, donate.jit))
    lines.append(f"| {name} | {target} | {theirs * 1e3:.0f} ms | {ours * 1e3:.0f} ms | "
                 f"{ours / theirs:.2f}x | {', '.join(map(str, sorted(counts)))} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--targets", default="cpu1,cpu8,h100")
  parser.add_argument("--rows", default=",".join(ROWS))
  parser.add_argument("--compile-times", type=int, default=0, metavar="REPEATS",
                      help="also time lower().compile() of each row, median of REPEATS")
  a = parser.parse_args(argv)
  names = [n for n in a.rows.split(",") if n]
  for n in names:
    if n not in ROWS:
      parser.error(f"unknown row {n!r}; rows: {', '.join(ROWS)}")
  start = time.perf_counter()
  results, skipped, times = [], [], []
  for target in [t for t in a.targets.split(",") if t]:
    mesh = make_mesh(target)
    if isinstance(mesh, str):
      skipped.append(f"{target} skipped: {mesh}")
      continue
    for name in names:
      results.append(measure(name, target, mesh))
    if a.compile_times:
      times.append(compile_times(names, target, mesh, a.compile_times))
  print(f"### Compiled peak, jax.jit vs donate.jit pairing (jax {jax.__version__}, "
        f"Python {sys.version.split()[0]}, donate from {Path(donate.__file__).parent})\n")
  print(table(results))
  print()
  for s in skipped:
    print(s)
  print(summary(results))
  if times:
    print(f"\n### lower().compile() of a fresh step function, median of {a.compile_times}\n")
    print("| row | target | jax.jit | donate.jit | ratio | programs donate.jit compiled |")
    print("|---|---|---|---|---|---|")
    print("\n".join(times))
  print(f"\n{time.perf_counter() - start:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
