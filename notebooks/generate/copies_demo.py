"""Notebook material: a KV-cache decode loop with and without the copy XLA inserts.

`CELLS` is in the (kind, source) form of `nb2.py`, which appends it to notebook 02. Run standalone
to print the same report and measurements from one run:

  PYTHONPATH=. python notebooks/generate/copies_demo.py
"""

CELLS = [
("md", r"""
## Copies XLA adds: a KV-cache decode loop

Donating the cache saves memory only if XLA does not copy it anyway. The most common way it does is
copy insertion in a loop: a carry that is read *before* an in-place update and used *after* it. Below,
a decode step reads the previous key `k[t - 1]`, writes the new key at row `t`, and uses the old read at
the end of the step. XLA fuses that small read into its late consumer, so the old cache must outlive
the update: it copies the whole cache, twice per token. Reading the same row from the updated cache
(row `t - 1` is not written) gives the same numbers without the copy.
"""),
("code", r"""
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

import donate

T, D, STEPS = 4096, 1024, 64  # a 16 MiB float32 cache for keys and one for values


def decode_copying(cache_k, cache_v, q):
  def step(carry, t):
    k, v, q = carry
    prev = k[t - 1]                                              # read the last key ...
    k = lax.dynamic_update_slice(k, jnp.tanh(q)[None], (t, 0))  # ... write the new one ...
    v = lax.dynamic_update_slice(v, q[None], (t, 0))
    w = jax.nn.softmax(k @ q)
    q = jnp.tanh(w @ v + prev)                                   # ... use the old read here
    return (k, v, q), w.max()
  return lax.scan(step, (cache_k, cache_v, q), jnp.arange(1, STEPS + 1))


def decode_fixed(cache_k, cache_v, q):
  def step(carry, t):
    k, v, q = carry
    k = lax.dynamic_update_slice(k, jnp.tanh(q)[None], (t, 0))
    v = lax.dynamic_update_slice(v, q[None], (t, 0))
    prev = k[t - 1]                  # the same value, read after the update: row t-1 is not written
    w = jax.nn.softmax(k @ q)
    q = jnp.tanh(w @ v + prev)
    return (k, v, q), w.max()
  return lax.scan(step, (cache_k, cache_v, q), jnp.arange(1, STEPS + 1))


def fresh():
  return jnp.zeros((T, D)), jnp.zeros((T, D)), jnp.full((D,), 0.1)


COMPILED, REPORTS = {}, {}
for fn in (decode_copying, decode_fixed):
  COMPILED[fn.__name__] = donate.jit(fn, donate_argnums=(0, 1)).lower(*fresh()).compile()
  REPORTS[fn.__name__] = COMPILED[fn.__name__].copies()
print(COMPILED["decode_copying"].plan)
print("\ndecode_fixed:", REPORTS["decode_fixed"] or "no copy of 64 KiB or more")
"""),
("md", r"""
The report names the cache (`cache_k`, the scan carry), how often the copy runs (every iteration of the
scan), the line that reads before the update and the line of the update. Both programs compute the
same thing; the figures below are measured in one run: the compiled programs' temporaries
(`memory_analysis()`) and the median time of a call.
"""),
("code", r"""
def per_call(compiled, calls=7):
  times = []
  for _ in range(calls):
    args = fresh()
    jax.block_until_ready(args)
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


out_copy, out_fixed = (COMPILED[n](*fresh()) for n in ("decode_copying", "decode_fixed"))
same = bool(jnp.allclose(out_copy[1], out_fixed[1])) and bool(jnp.allclose(out_copy[0][2],
                                                                           out_fixed[0][2]))
rows = []
for name, compiled in COMPILED.items():
  per_call(compiled, 1)  # warm up
  copied = sum(r.bytes_per_call or 0 for r in REPORTS[name])
  rows.append((name, len(REPORTS[name]), copied / 2**20,
               compiled.memory_analysis().temp_size_in_bytes / 2**20, per_call(compiled) * 1e3))
print(f"same results: {same}")
print(f"{'variant':16} {'copies':>6} {'MiB copied/call':>16} {'temporaries MiB':>16} {'ms/call':>8}")
for name, n, copied, temp, ms in rows:
  print(f"{name:16} {n:6d} {copied:16.1f} {temp:16.2f} {ms:8.1f}")
print(f"time ratio copying / fixed: {rows[0][4] / rows[1][4]:.2f}x")
"""),
]


def main() -> None:
  """Runs the code cells in one namespace and prints the markdown as plain text."""
  namespace: dict = {}
  for kind, source in CELLS:
    if kind == "md":
      print(source.strip(), "\n")
    else:
      exec(compile(source, "<copies_demo>", "exec"), namespace)  # noqa: S102
      print()


if __name__ == "__main__":
  main()
