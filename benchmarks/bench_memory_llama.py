"""Where the memory goes in a Llama-3-8B-shaped training step on 32 abstract H100s (issue 22).

The step: 32 decoder layers under one `lax.scan` (Llama-3-8B's shapes: d_model 4096, 32 query heads
and 8 key/value heads of 128, MLP 14336, vocabulary 128256), bf16 parameters, float32 momentum,
tensor parallel over 32 H100s (`donate.targets.gpu_mesh`: compiled ahead of time on this machine,
nothing runs on a GPU). Only `jax.ShapeDtypeStruct`s: no array is allocated. It is compiled twice,
with and without donating the parameters and the momentum, each profiled per device
(`donate.memory_profile`), and `compare` says where every GiB of the difference goes.

Needs the gpu-aot extra (`pip install "jax-donate[gpu-aot]"`). One run:

  python benchmarks/bench_memory_llama.py [--batch 1 --seq 2048 --layers 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import donate  # noqa: E402
from donate import targets  # noqa: E402

GIB = 1 << 30
LLAMA3_8B = dict(d=4096, heads=32, kv_heads=8, head_dim=128, ff=14336, vocab=128256)


def layer_shapes(layers, d, heads, kv_heads, head_dim, ff, vocab):
  """{name: (shape, PartitionSpec)} of the parameters: the layers stacked on a leading axis."""
  L = layers
  return {
      "embed": ((vocab, d), P("tp", None)),
      "wq": ((L, d, heads * head_dim), P(None, None, "tp")),
      "wk": ((L, d, kv_heads * head_dim), P(None, None, "tp")),
      "wv": ((L, d, kv_heads * head_dim), P(None, None, "tp")),
      "wo": ((L, heads * head_dim, d), P(None, "tp", None)),
      "w1": ((L, d, ff), P(None, None, "tp")),
      "w3": ((L, d, ff), P(None, None, "tp")),
      "w2": ((L, ff, d), P(None, "tp", None)),
      "norm1": ((L, d), P()),
      "norm2": ((L, d), P()),
      "head": ((d, vocab), P(None, "tp")),
  }


def _rms(x, w):
  return x * lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-5
                       ).astype(x.dtype) * w


def make_step(heads, kv_heads, head_dim):
  def decoder(h, p):
    b, s, _ = h.shape
    x = _rms(h, p["norm1"])
    q = (x @ p["wq"]).reshape(b, s, heads, head_dim)
    k = (x @ p["wk"]).reshape(b, s, kv_heads, head_dim)
    v = (x @ p["wv"]).reshape(b, s, kv_heads, head_dim)
    k, v = (jnp.repeat(t, heads // kv_heads, axis=2) for t in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / head_dim ** 0.5
    causal = jnp.tril(jnp.ones((s, s), bool))
    att = jax.nn.softmax(jnp.where(causal, scores, -1e9), -1).astype(h.dtype)
    h = h + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, -1) @ p["wo"]
    x = _rms(h, p["norm2"])
    return h + (jax.nn.silu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"], None

  def loss(params, tokens):
    layers = {k: v for k, v in params.items() if k not in ("embed", "head")}
    h = params["embed"][tokens]
    h, _ = lax.scan(decoder, h, layers)
    logits = (h @ params["head"]).astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

  def train_step(params, momentum, tokens):
    grads = jax.grad(loss)(params, tokens)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g.astype(jnp.float32), momentum, grads)
    params = jax.tree.map(lambda p, m: p - (1e-4 * m).astype(p.dtype), params, momentum)
    return params, momentum

  return train_step


def abstract_args(mesh, layers, batch, seq, **shape):
  specs = layer_shapes(layers, **shape)

  def tree(dtype):
    return {k: jax.ShapeDtypeStruct(s, dtype, sharding=NamedSharding(mesh, p))
            for k, (s, p) in specs.items()}

  tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, P()))
  return tree(jnp.bfloat16), tree(jnp.float32), tokens


def profile(step, args, donate_argnums):
  t = time.perf_counter()
  p = donate.memory_profile(jax.jit(step, donate_argnums=donate_argnums), *args)
  return p, time.perf_counter() - t


def gib(n: int) -> str:
  return f"{n / GIB:.2f}"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=32)
  parser.add_argument("--layers", type=int, default=32)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--seq", type=int, default=2048)
  args = parser.parse_args(argv)
  if not targets.available():
    print('needs the gpu-aot extra (the CUDA plugin at jaxlib\'s version): '
          'pip install "jax-donate[gpu-aot]"')
    return 0
  mesh = targets.gpu_mesh("h100", args.devices, ("tp",))
  step = make_step(LLAMA3_8B["heads"], LLAMA3_8B["kv_heads"], LLAMA3_8B["head_dim"])
  inputs = abstract_args(mesh, args.layers, args.batch, args.seq, **LLAMA3_8B)
  plain, t_plain = profile(step, inputs, ())
  donated, t_donated = profile(step, inputs, (0, 1))
  print(f"jax {jax.__version__}: Llama-3-8B-shaped training step, {args.layers} scanned layers, "
        f"bf16 parameters, f32 momentum, batch {args.batch} x {args.seq} tokens, tensor parallel "
        f"over {args.devices} abstract H100s; GiB per device, one run")
  usable = gib(plain.fits("h100").usable_bytes)
  print("| | arguments | outputs | aliased | temporaries | peak | allocated "
        f"| fits an H100 ({usable} GiB usable) | compile + profile s |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name, p, t in (("jax.jit", plain, t_plain), ("donate_argnums=(0, 1)", donated, t_donated)):
    fit = p.fits("h100")
    print(f"| {name} | {gib(p.argument_bytes)} | {gib(p.output_bytes)} | {gib(p.alias_bytes)} "
          f"| {gib(p.temp_bytes)} | {gib(p.peak_bytes)} | {gib(p.reserved_bytes)} "
          f"| {'yes' if fit else 'no'}, headroom {gib(fit.headroom_bytes)} | {t:.1f} |")
  print()
  print(f"donating {gib(donated.alias_bytes)} GiB per device lowers the allocated total by "
        f"{gib(plain.reserved_bytes - donated.reserved_bytes)} GiB and the peak by "
        f"{gib(plain.peak_bytes - donated.peak_bytes)} GiB; temporaries "
        f"{gib(plain.temp_bytes)} -> {gib(donated.temp_bytes)} GiB")
  print()
  print("where the difference at the peak goes (plain -> donated; profile.compare):")
  print(plain.compare(donated))
  saved = donated.donation_saved_bytes  # measured: the step compiled again without donations
  if saved is not None:
    print(f"the profile measures it too: donation saved {gib(saved)} GiB at the peak "
          f"({gib(donated.peak_without_donation_bytes)} GiB without it)")
  if donated.shadowed:
    print()
    print("donations with a temporary of their size beside them at the peak:")
    for s in donated.shadowed:
      print(f"  {s.path}: {s}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
