"""What a memory profile costs: reading XLA's dump and building the profile, against compiling.

One run, no repetition (compiles are long and this machine is shared): for each program, the
compile time without the dump, with it (XLA writes its buffer assignment, live ranges and the
module's text), the time to read the dump and build the profile, with the ratio of that to the
compile (the target: at most 10%), and the time to build the same profile from the compiled
program alone (its buffer assignment proto, the live ranges recomputed; `memory_profile(compiled)`).

A second table prices `donate.jit(step, donate_argnums=0).plan(*args)`, which reads the profile
(the compiled program as it is on CPU) and compiles the program once more without its donations
to measure what they saved at the peak: against `lower(*args).compile()` of the same function
(each timed on a fresh function, so no cache of JAX's serves it).

  python benchmarks/bench_memory_profile.py
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import donate  # noqa: E402
from donate._profile import (
  api,  # noqa: E402
  reading,  # noqa: E402
)
from donate._xla import hlo as _hlo  # noqa: E402
from donate._xla import hlo_dump as _hlo_dump  # noqa: E402


def transformer_step(params, x):
  def loss(p):
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    h = x + (jax.nn.softmax(q @ k.T / 8.0, axis=-1) @ v) @ p["wo"]
    return jnp.mean((jax.nn.gelu(h @ p["w1"]) @ p["w2"]) ** 2)
  return jax.tree.map(lambda w, g: w - 0.01 * g, params, jax.grad(loss)(params))


def scanned_step(stack, x):
  def loss(ws):
    def layer(h, w):
      return h + jnp.tanh(h @ w["a"]) @ w["b"], None
    return jnp.sum(lax.scan(layer, x, ws)[0] ** 2)
  return jax.tree.map(lambda w, g: w - 0.01 * g, stack, jax.grad(loss)(stack))


def programs():
  d = 512
  shapes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, 4 * d),
            "w2": (4 * d, d)}
  params = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}
  yield "transformer step", jax.jit(transformer_step, donate_argnums=0), (
      params, jax.ShapeDtypeStruct((256, d), jnp.float32))
  stack = {"a": jax.ShapeDtypeStruct((24, d, 2 * d), jnp.float32),
           "b": jax.ShapeDtypeStruct((24, 2 * d, d), jnp.float32)}
  yield "24-layer scanned step", jax.jit(scanned_step, donate_argnums=0), (
      stack, jax.ShapeDtypeStruct((256, d), jnp.float32))


def measure(jitted, args):
  lowered = jitted.lower(*args)
  t = time.perf_counter()
  alone = lowered.compile()
  plain = time.perf_counter() - t
  folder = tempfile.mkdtemp(prefix="bench-profile-")
  try:
    t = time.perf_counter()
    compiled = lowered.compile(compiler_options=_hlo_dump.dump_options(folder))
    dumped = time.perf_counter() - t
    t = time.perf_counter()
    module = _hlo.parse_module(compiled.as_text())
    dump = reading.read_dump(folder, module.name)
    if dump.hlo_text is not None and not api._names_every_value(module, dump):
      module = _hlo.parse_module(dump.hlo_text)  # as profile_of_lowered reads it
    profile = api._profile(compiled, dump, module, None)
    build = time.perf_counter() - t
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  t = time.perf_counter()
  same = api.profile_of_compiled(alone)
  from_compiled = time.perf_counter() - t
  assert same.peak_bytes == profile.peak_bytes and same.timeline == profile.timeline
  return plain, dumped, build, from_compiled, profile


def plan_cost(jitted, args):
  """(lower + compile s, plan() s, the profile): each on a fresh donate.jit of a fresh function."""
  def fresh():
    step = jitted.__wrapped__
    return donate.jit(functools.wraps(step)(lambda *a: step(*a)), donate_argnums=0)
  t = time.perf_counter()
  fresh().lower(*args).compile()
  compiled = time.perf_counter() - t
  t = time.perf_counter()
  plan = fresh().plan(*args)
  planned = time.perf_counter() - t
  return compiled, planned, plan.profile


def main() -> int:
  print(f"jax {jax.__version__}, {jax.default_backend()}, one run each")
  print("| program | compile s | compile with dump s | build profile s | build / compile "
        "| from the Compiled alone s | alone / compile |")
  print("|---|---|---|---|---|---|---|")
  for name, jitted, args in programs():
    plain, dumped, build, alone, profile = measure(jitted, args)
    print(f"| {name} ({len(profile.timeline)} steps) | {plain:.2f} | {dumped:.2f} | {build:.3f} "
          f"| {build / plain:.1%} | {alone:.3f} | {alone / plain:.1%} |")
  print()
  print("| program | lower + compile s | plan() s | plan() - compile s | donation saved |")
  print("|---|---|---|---|---|")
  for name, jitted, args in programs():
    compiled, planned, profile = plan_cost(jitted, args)
    print(f"| {name} | {compiled:.2f} | {planned:.2f} | {planned - compiled:.2f} "
          f"| {profile.donation_saved_bytes} B of {profile.alias_bytes} B aliased |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
