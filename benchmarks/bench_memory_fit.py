"""Does the Llama-3-8B-shaped step fit N H100s, and what makes it fit (issue 62).

The step of `bench_memory_llama.py` (32 decoder layers under one `lax.scan`, Llama-3-8B's shapes,
bf16 parameters, float32 momentum, parameters and momentum donated), tensor parallel over N
abstract H100s (`donate.targets`: compiled ahead of time here, nothing runs on a GPU). Its
profile's plan to fit an H100 (`profile.fit("h100")`: what JAX's allocator gives a program, 75%
of the card unless the environment says otherwise) and the largest batch that fits
(`profile.largest_batch("h100")`), each figure a compile made for the H100s, with the compiles
and seconds they took, and the machine's load average beside them. Each round's compiles run
`--workers` at a time (the library's default when not given); the announcements and bars of
`fit` and `largest_batch` go to stderr.

Needs the gpu-aot extra. One run:

  python benchmarks/bench_memory_fit.py [--devices 8 --batch 16 --seq 2048 --layers 32 --workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

import donate  # noqa: E402
from donate import targets  # noqa: E402
from bench_memory_llama import LLAMA3_8B, abstract_args, make_step  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--layers", type=int, default=32)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq", type=int, default=2048)
  parser.add_argument("--no-batch-search", action="store_true")
  parser.add_argument("--workers", type=int, default=None, help="compiles at a time in fit()")
  args = parser.parse_args(argv)
  if not targets.available():
    print('needs the gpu-aot extra: pip install "jax-donate[gpu-aot]"')
    return 0
  mesh = targets.gpu_mesh("h100", args.devices, ("tp",))
  step = make_step(LLAMA3_8B["heads"], LLAMA3_8B["kv_heads"], LLAMA3_8B["head_dim"])
  inputs = abstract_args(mesh, args.layers, args.batch, args.seq, **LLAMA3_8B)
  t = time.perf_counter()
  p = donate.memory_profile(jax.jit(step, donate_argnums=(0, 1)), *inputs)
  t_profile = time.perf_counter() - t
  print(f"jax {jax.__version__}: Llama-3-8B-shaped step, {args.layers} scanned layers, batch "
        f"{args.batch} x {args.seq} tokens, tensor parallel over {args.devices} abstract H100s")
  print(f"profile: peak {p.peak_bytes / 2**30:.2f} GiB per device ({t_profile:.1f} s)")
  print(p.fits("h100"))
  t = time.perf_counter()
  plan = p.fit("h100", max_workers=args.workers)
  print(plan)
  print(f"plan: {plan.compiles} compiles, {time.perf_counter() - t:.1f} s ({load()})")
  if not args.no_batch_search:
    t = time.perf_counter()
    found = p.largest_batch("h100", argnum=2, axis=0)
    print(found)
    print(f"largest batch: {found.compiles} compiles, {time.perf_counter() - t:.1f} s ({load()})")
  return 0


def load() -> str:
  """The machine's load average over 1, 5 and 15 minutes, as `uptime` prints it."""
  return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
  sys.exit(main())
