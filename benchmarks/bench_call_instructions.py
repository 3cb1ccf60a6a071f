"""What a cached call of donate.jit costs against jax.jit's, in instructions: a count that this
noisy 2-core machine does not move, where timed rounds of the same calls swing by 10% or more.

Each function runs in its own process under valgrind's callgrind, instrumentation off until the
function is warm (compiled, 5 calls); then `calls` cached calls (each fed its own result) are
counted, and the table gives the instructions of the calling thread per call: Python, JAX's C++
dispatch and what runs on that thread (XLA:CPU's worker threads, which run the program and spin
while idle, are not counted; their spinning depends on timing). The step and its paths are
`bench_pytree_cost.py`'s (a dict of N float32[64] leaves, all donated; "native": outputs in
input order, `jax.jit`'s own program; "re-paired": output k from input N-1-k, donate's in-place
program with `copy_threshold=0` against `jax.jit`'s copying one). Rows: `jax.jit`; donate.jit's
call (its C++ dispatch behind the `__call__` property and the one frame that names an array
passed twice); that dispatch called directly; and `jax.jit` behind one Python frame of the same
form, to show what a frame costs. Needs `valgrind` (`apt-get install valgrind`). Run:
  python benchmarks/bench_call_instructions.py [--sizes 10,100,1000] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

PATHS = ("native", "re-paired")


def _worker(variant: str, path: str, n: int, calls: int, fifo: str) -> None:
  """In the process callgrind runs: warms the function, says so, waits on `fifo` (a blocking
  read, no instructions) while the parent turns instrumentation on, then makes the calls."""
  import bench_pytree_cost as b  # beside this script, first on its path
  import jax

  g = b.call_variants(n, path)[variant]  # both compiled before the parameters are made: malloc's
  # search depends on what the heap went through, as much as 2% of these counts
  p = b._params(n)
  for _ in range(5):
    p = g(p)
  jax.block_until_ready(p)
  print("ready", flush=True)
  with open(fifo) as f:
    f.read(1)
  for _ in range(calls):
    p = g(p)
  jax.block_until_ready(p)
  os._exit(0)


def count(variant: str, path: str, n: int, calls: int) -> float:
  """Instructions of the calling thread per cached call of `variant`."""
  with tempfile.TemporaryDirectory() as tmp:
    fifo, out = os.path.join(tmp, "go"), os.path.join(tmp, "cg.out")
    os.mkfifo(fifo)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__), "--worker",
           variant, path, str(n), str(calls), fifo]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
      if line.strip() == "ready":
        break
    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    with open(fifo, "w") as f:
      f.write("g")
    proc.wait()
    text = open(out + "-01").read()  # the thread that made the calls
    totals = re.search(r"^(?:totals|summary): (\d+)", text, re.M)
    assert totals is not None, "no totals in callgrind's output"
    return int(totals.group(1)) / calls


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="10,100,1000")
  parser.add_argument("--calls", type=int, default=2000)
  parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    variant, path, n, calls, fifo = args.worker
    _worker(variant, path, int(n), int(calls), fifo)
    return
  if shutil.which("valgrind") is None:
    sys.exit("bench_call_instructions.py needs valgrind (apt-get install valgrind)")
  import jax
  from bench_pytree_cost import CALLS

  print(f"Machine: Python {sys.version.split()[0]}, jax {jax.__version__}\n")
  rows = []
  for n in (int(s) for s in args.sizes.split(",")):
    calls = max(20, args.calls * 10 // n) if n > 10 else args.calls
    for path in PATHS:
      jobs = [(v, path, n, calls) for v in CALLS]
      with ThreadPoolExecutor(2) as pool:  # two processes at a time: one a core
        counts = dict(zip(CALLS, pool.map(lambda job: count(*job), jobs)))
      theirs = counts["jax.jit"]
      cells = [f"{theirs:,.0f}"] + [f"{counts[v]:,.0f} ({counts[v] / theirs:.3f}x)"
                                    for v in CALLS[1:]]  # fmt: skip
      rows.append(f"| {n} | {path} | {calls} | " + " | ".join(cells) + " |")
      print(rows[-1], file=sys.stderr, flush=True)
  head = "| leaves | path | calls | " + " | ".join(CALLS) + " |"
  print("Instructions of the calling thread per cached call (callgrind)\n")
  print("\n".join([head, "|---" * (3 + len(CALLS)) + "|", *rows]))


if __name__ == "__main__":
  main()
