"""Prints every benchmark table: donation (against jax.jit), the copy report's cost (against the
first call), the cost of wide pytrees (against jax.jit), the memory profile's cost (against the
compile) and a Llama-3-8B-shaped step's on 32 abstract H100s (with and without donation, then
the doctor's plan to fit an H100 and largest batch, with their compiles and seconds; each says
what to install without the gpu-aot extra), the compiled peak of steps whose outputs do not mirror
their donated inputs (against jax.jit's first-come pairing, on CPU, 8 CPU devices and 8 abstract
H100s), and the planner (against greedy).

  python benchmarks/run_all.py [--quick]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
  quick = ["--quick"] if "--quick" in sys.argv[1:] else []
  planner = ["--time-limit", "5"] if quick else []
  status = 0
  cost = ["--sizes", "10,100", "--repeats", "3", "--layers", "4"] if quick else []
  for script, extra in (("bench_donation.py", quick), ("bench_copies.py", quick),
                        ("bench_pytree_cost.py", cost), ("bench_memory_profile.py", []),
                        ("bench_memory_llama.py", []),
                        ("bench_memory_fit.py", ["--devices", "32", "--batch", "16"]),
                        ("bench_pairing_peak.py", []),
                        ("bench_planner.py", planner)):
    print(f"## {script}\n", flush=True)
    status |= subprocess.call([sys.executable, str(HERE / script), *extra])
    print(flush=True)
  return status


if __name__ == "__main__":
  sys.exit(main())
