"""Collectives from default memory vs symmetric (collective) memory on real GPUs, and a training step.

Run on a machine with 1 or more NVIDIA GPUs (jax[cuda12] installed):

    python benchmarks/gpu/bench_collectives.py                 # sweep 1 KiB .. 256 MiB + step
    python benchmarks/gpu/bench_collectives.py --max-mib 16 --iters 50

Without a GPU, ``--aot h100`` (or ``b200``) compiles every program of the sweep and the step for 8
abstract GPUs and prints where each collective's operand landed, instead of timings:

    JAX_PLATFORMS=cpu python benchmarks/gpu/bench_collectives.py --aot h100 --max-mib 1

Sizes follow nccl-tests: the bytes of the collective's output per device (an all-gather's input is
size / n). Each timed program runs the collective ``--inner`` times in a ``fori_loop`` (so dispatch
does not dominate small sizes); the time is the median over ``--iters`` calls, per collective. The
"symmetric" variant annotates the operand with ``donate.with_symmetric`` and compiles with
``donate.symm.compile_options_for`` (for all-reduce that is XLA's all-collectives option; set
``--configure`` on jaxlib >= 0.12 to place all-reduces through XLA's per-collective spec instead);
each row says where XLA actually put the operand (``placement_report``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _args(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--min-kib", type=int, default=1)
  p.add_argument("--max-mib", type=int, default=256)
  p.add_argument("--iters", type=int, default=20)
  p.add_argument("--inner", type=int, default=10)
  p.add_argument("--collective-mem-mb", type=int, default=None,
                 help="XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB (default: 4 x the largest size)")
  p.add_argument("--configure", action="store_true", help="symm.configure('AllReduce') first")
  p.add_argument("--aot", choices=("h100", "b200"), default=None,
                 help="compile for 8 abstract GPUs and report placements (no GPU needed)")
  p.add_argument("--step-batch", type=int, default=16)
  return p.parse_args(argv)


def _setup(a):
  """Process-wide settings, before JAX starts a backend."""
  mb = a.collective_mem_mb or 4 * a.max_mib + 64
  os.environ.setdefault("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", str(mb))
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  import donate
  if a.configure:
    donate.symm.configure("AllReduce")
  import jax
  if a.aot:
    jax.config.update("jax_platforms", "cpu")
  return donate, jax


def _mesh(donate, jax, a):
  if a.aot:
    return donate.targets.gpu_mesh(a.aot, 8)
  import numpy as np
  return jax.sharding.Mesh(np.array(jax.devices("gpu")), ("x",))


def _program(donate, jax, mesh, op, symmetric, inner):
  from jax import lax
  P = jax.sharding.PartitionSpec
  n = mesh.devices.size

  def body(v):
    def one(_, carry):
      src = donate.with_symmetric(carry * 1.0001, "x") if symmetric else carry * 1.0001
      if op == "all-reduce":
        return lax.psum(src, "x") / n
      return lax.all_gather(src, "x", tiled=True)[: carry.shape[0]]
    return lax.fori_loop(0, inner, one, v)

  return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)


def _input(jax, mesh, op, nbytes, abstract):
  import jax.numpy as jnp
  n = mesh.devices.size
  per_device = nbytes // 4 if op == "all-reduce" else max(nbytes // 4 // n, 1)
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
  if abstract:
    return jax.ShapeDtypeStruct((per_device * n,), jnp.float32, sharding=sharding)
  return jax.device_put(jnp.ones((per_device * n,), jnp.float32), sharding)


def _compile(donate, jax, f, x):
  """Compiles as donate.jit does on a GPU target; returns (compiled, placement of the operand)."""
  symm = donate.symm
  bufs = symm.comm_buffers(symm.mark_required(jax.make_jaxpr(f)(x)))
  options = symm.compile_options_for(symm.target_platform([x.sharding], jax.default_backend()),
                                     bufs)
  compiled = jax.jit(f).lower(x).compile(compiler_options=options)
  uses = symm.placement_report(compiled.as_text(), bufs).collectives
  where = ",".join(sorted({f"S({u.memory_space})" if u.memory_space else "default" for u in uses}))
  return compiled, where


def _time(compiled, x, iters, inner) -> float:
  out = compiled(x)
  out.block_until_ready()
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    compiled(x).block_until_ready()
    times.append(time.perf_counter() - t0)
  return statistics.median(times) / inner * 1e6


def _sizes(a):
  size, out = a.min_kib * 1024, []
  while size <= a.max_mib * 2**20:
    out.append(size)
    size *= 4
  return out


def _fmt(nbytes):
  return f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 1024} KiB"


def sweep(donate, jax, mesh, a):
  print("| op | size | default us | symmetric us | symmetric / default | placement (default; symmetric) |")
  print("|---|---|---|---|---|---|")
  for op in ("all-reduce", "all-gather"):
    for nbytes in _sizes(a):
      x = _input(jax, mesh, op, nbytes, abstract=bool(a.aot))
      rows = [_compile(donate, jax, _program(donate, jax, mesh, op, sym, a.inner), x)
              for sym in (False, True)]
      if a.aot:
        print(f"| {op} | {_fmt(nbytes)} | - | - | - | {rows[0][1]}; {rows[1][1]} |")
        continue
      t = [_time(c, x, a.iters, a.inner) for c, _ in rows]
      print(f"| {op} | {_fmt(nbytes)} | {t[0]:.1f} | {t[1]:.1f} | {t[1] / t[0]:.2f} | "
            f"{rows[0][1]}; {rows[1][1]} |")


def step(donate, jax, a):
  from donate import _examples as examples
  if a.aot:
    mesh = donate.targets.gpu_mesh(a.aot, 8, ("dp", "tp"), shape=(2, 4))
  else:
    gpus = jax.devices("gpu")
    tp = max(k for k in (1, 2, 4, 8) if len(gpus) % k == 0 and k <= len(gpus))
    import numpy as np
    mesh = jax.sharding.Mesh(np.array(gpus).reshape(len(gpus) // tp, tp), ("dp", "tp"))
  args = examples.block_abstract_args(mesh, batch=a.step_batch, seq=1024, d_model=1024,
                                      d_ff=4096)
  print("\n| training step | ms/step | ratio | annotated placed | un-annotated placed | "
        "XLA collective MiB |")
  print("|---|---|---|---|---|---|")
  base, sizing = None, []
  for enabled in (False, True):
    check = donate.symm.check_placement(examples.block_train_step(mesh), *args,
                                        donate_argnums=(0, 1), enabled=enabled, plan=enabled)
    if enabled:
      sizing.append(check.sizing(f"block step, {mesh.devices.flat[0].device_kind}"))
    placed = f"{sum(r.placed for r in check.report.records)}/{len(check.report.records)}"
    label = "symmetric" if enabled else "default"
    if a.aot:
      print(f"| {label} | - | - | {placed} | {len(check.report.also_placed)} | "
            f"{check.memory.nbytes / 2**20:.1f} |")
      continue
    ms = _step_time(jax, check.compiled, args, a.iters)
    base = base or ms
    print(f"| {label} | {ms:.2f} | {ms / base:.2f} | {placed} | {len(check.report.also_placed)} |"
          f" {check.memory.nbytes / 2**20:.1f} |")
  print("\n" + donate.symm.sizing_table(sizing))


def _step_time(jax, compiled, args, iters) -> float:
  import jax.numpy as jnp
  leaves = [jnp.full(s.shape, 0.01, s.dtype, device=s.sharding) for s in jax.tree.leaves(args)]
  state = len(jax.tree.leaves(args[:2]))  # params and momentum: donated, carried to the next step
  times = []
  for _ in range(iters + 1):
    t0 = time.perf_counter()
    params, momentum, loss = compiled(*leaves)
    loss.block_until_ready()
    times.append(time.perf_counter() - t0)
    leaves = jax.tree.leaves((params, momentum)) + leaves[state:]
  return statistics.median(times[1:]) * 1e3


def main(argv=None):
  a = _args(argv)
  donate, jax = _setup(a)
  if not a.aot and not [d for d in jax.devices() if d.platform == "gpu"]:
    raise SystemExit("no GPU here: run on a GPU machine, or pass --aot h100 to compile only")
  mesh = _mesh(donate, jax, a)
  print(f"jax {jax.__version__}, {mesh.devices.size} x {mesh.devices.flat[0].device_kind}, "
        f"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB="
        f"{os.environ['XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB']}\n")
  sweep(donate, jax, mesh, a)
  step(donate, jax, a)


if __name__ == "__main__":
  main()
