"""The memory doctor's cost (issue 28): building a profile with its categories against the compile,
and `advice()` (one compile per candidate).

Programs: the CPU transformer step and 24-layer scanned step of `bench_memory_profile.py`, and,
with the gpu-aot extra, the Llama-3-8B-shaped training step of `bench_memory_llama.py` (scanned
layers, bf16 parameters, f32 momentum, tensor parallel over abstract H100s, compiled ahead of time
on this machine). For each: the plain compile, the compile with XLA's dump, building the profile
from the dump (reading it, the timeline, the categories from the dataflow), the profile's
categories at the peak, and `advice()`: each candidate's measured peak and what the advice cost
against one compile. One run each:

  python benchmarks/bench_memory_doctor.py [--layers 32 --devices 32 --seq 2048]

With `--gpus 8,64,256` (the gpu-aot extra), only the table of programs compiled ahead of time for
that many H100s and B200s: the transformer block's data and tensor parallel training step
(`donate._examples.block_train_step`: shard_map over dp x tp, 8 GPUs per host and tp = 8, the
gradients summed over dp, clipping, momentum; a tiny model, two sequences per dp rank), each
compile against building its per-device profile from XLA's dump, the peak, whether it fits:

  python benchmarks/bench_memory_doctor.py --gpus 8,64,256
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

import donate  # noqa: E402
from benchmarks import bench_memory_llama as llama  # noqa: E402
from benchmarks import bench_memory_profile as cpu  # noqa: E402
from donate import _examples as examples  # noqa: E402
from donate import targets  # noqa: E402
from donate._base.text import format_bytes  # noqa: E402
from donate._profile import (
  api,  # noqa: E402
  reading,  # noqa: E402
)
from donate._xla import hlo as _hlo  # noqa: E402
from donate._xla import hlo_dump as _hlo_dump  # noqa: E402


def programs(args):
  for name, jitted, inputs in cpu.programs():
    yield f"{name} (CPU)", jitted, inputs
  if targets.available():
    mesh = targets.gpu_mesh("h100", args.devices, ("tp",))
    step = llama.make_step(llama.LLAMA3_8B["heads"], llama.LLAMA3_8B["kv_heads"],
                           llama.LLAMA3_8B["head_dim"])
    inputs = llama.abstract_args(mesh, args.layers, args.batch, args.seq, **llama.LLAMA3_8B)
    yield (f"Llama-3-8B-shaped, {args.layers} layers, {args.devices} H100s",
           jax.jit(step, donate_argnums=(0, 1)), inputs)


def _seconds(fn):
  t = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t


def build_cost(jitted, inputs):
  """(compile s, build s, profile): the plain compile, and building the profile (categories
  included) from XLA's dump of a second compile, timed apart from that compile."""
  lowered = jitted.lower(*inputs)
  _, plain = _seconds(lowered.compile)
  folder = tempfile.mkdtemp(prefix="bench-doctor-")
  try:
    compiled = lowered.compile(compiler_options=_hlo_dump.dump_options(folder))

    def build():
      module = _hlo.parse_module(compiled.as_text())
      dump = reading.read_dump(folder, module.name)
      if dump.hlo_text is not None and not api._names_every_value(module, dump):
        module = _hlo.parse_module(dump.hlo_text)
      return api._profile(compiled, dump, module, None)
    profile, spent = _seconds(build)
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  return plain, spent, profile


def gpu_step(kind: str, devices: int, d_model: int = 128, d_ff: int = 512):
  """(jitted, abstract inputs) of the block's training step on `devices` GPUs `kind`."""
  mesh = targets.gpu_mesh(kind, devices, ("dp", "tp"), shape=(devices // 8, 8))
  inputs = examples.block_abstract_args(mesh, batch=2 * (devices // 8), seq=64, d_model=d_model,
                                        d_ff=d_ff)
  step = examples.block_train_step(mesh, annotate=False)
  return jax.jit(step, donate_argnums=(0, 1)), inputs


def _size(n: int) -> str:
  return format_bytes(n) if n >= 1 << 30 else f"{n / 1024:.1f} KiB"


def gpu_table(counts) -> int:
  if not targets.available():
    print('needs the gpu-aot extra: pip install "jax-donate[gpu-aot]"')
    return 0
  print(f"jax {jax.__version__}, one run each; bytes per device")
  print("| GPUs | d_model, MLP | compile s | build profile s | build / compile | peak | allocated "
        "| fits its GPU | top categories at the peak |")
  print("|---|---|---|---|---|---|---|---|---|")
  runs = [(kind, n, 128, 512) for kind in targets.gpu_names()[::-1] for n in counts]
  runs += [(kind, 8, 4096, 1 << 23) for kind in targets.gpu_names()]  # 16 GiB per matrix, device
  for kind, n, d_model, d_ff in runs:
    plain, build, profile = build_cost(*gpu_step(kind, n, d_model, d_ff))
    top = ", ".join(f"{g.key} {_size(g.total_bytes)}" for g in profile.by_category()[:3])
    fit = profile.fits(kind)
    print(f"| {n} {kind.upper()} ({n // 8} x 8) | {d_model}, {d_ff} | {plain:.2f} | {build:.3f} | "
          f"{build / plain:.1%} | {_size(profile.peak_bytes)} | {_size(profile.reserved_bytes)} "
          f"| {'yes' if fit else 'no'}, headroom {format_bytes(fit.headroom_bytes)} | {top} |")
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for flag, default in (("devices", 32), ("layers", 32), ("batch", 1), ("seq", 2048)):
    parser.add_argument(f"--{flag}", type=int, default=default)
  parser.add_argument("--gpus", help="device counts, e.g. 8,64,256: the GPU table only")
  args = parser.parse_args(argv)
  if args.gpus:
    return gpu_table([int(n) for n in args.gpus.split(",")])
  print(f"jax {jax.__version__}, one run each")
  print("| program | compile s | build profile s | build / compile | peak | top categories "
        "at the peak |")
  print("|---|---|---|---|---|---|")
  found = []
  for name, jitted, inputs in programs(args):
    plain, build, _ = build_cost(jitted, inputs)
    profile = donate.memory_profile(jitted, *inputs)
    top = ", ".join(f"{g.key} {format_bytes(g.total_bytes)}" for g in profile.by_category()[:4])
    print(f"| {name} | {plain:.2f} | {build:.3f} | {build / plain:.1%} | "
          f"{format_bytes(profile.peak_bytes)} | {top} |")
    found.append((name, plain, profile))
  print()
  print("| program | candidate | how | peak | saving | |")
  print("|---|---|---|---|---|---|")
  for name, plain, profile in found:
    t = time.perf_counter()
    items = profile.advice()
    spent = time.perf_counter() - t
    compiled = sum(a.measured for a in items)
    for a in items:
      peak = format_bytes(a.peak_bytes) if a.measured else "stated"
      print(f"| {name} | {a.change[:60]} | `{a.how[:70]}` | {peak} | "
            f"{format_bytes(a.saving_bytes)} | |")
    print(f"| {name} | advice(): {compiled} compiles in {spent:.2f} s = "
          f"{spent / max(plain, 1e-9):.2f} compiles | | | | |")
  print()
  for name, _, profile in found:
    print(f"{name}: by source line at the peak")
    for row in profile.by_line()[:4]:
      print(f"  {format_bytes(row.total_bytes):>10}  {row}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
