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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for flag, default in (("devices", 32), ("layers", 32), ("batch", 1), ("seq", 2048)):
    parser.add_argument(f"--{flag}", type=int, default=default)
  args = parser.parse_args(argv)
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
