"""The programs of the XLA corpus (see `xla_corpus`), each a step function named ``step``.

Only abstract arguments (`jax.ShapeDtypeStruct`) are used: the programs are lowered and compiled,
never run. Imported by the corpus worker process, which has set ``XLA_FLAGS`` before JAX starts.
"""

from __future__ import annotations

import functools

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

F32 = jnp.float32


def spec(*shape, dtype=F32):
  return jax.ShapeDtypeStruct(shape, dtype)


def adam(params, grads, m, v, lr=1e-3):
  m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
  v = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grads)
  params = jax.tree.map(lambda p, a, b: p - lr * a / (jnp.sqrt(b) + 1e-8), params, m, v)
  return params, m, v


def dense_stack(widths):
  return [{"w": spec(a, b), "b": spec(b)} for a, b in zip(widths[:-1], widths[1:])]


def mlp():
  params = dense_stack([1024, 2048, 2048, 2048, 2048, 10])

  def loss(params, x, y):
    for layer in params[:-1]:
      x = jax.nn.relu(x @ layer["w"] + layer["b"])
    logits = x @ params[-1]["w"] + params[-1]["b"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1))

  def step(params, m, v, x, y):
    return adam(params, jax.grad(loss)(params, x, y), m, v)

  return step, (params, params, params, spec(512, 1024), spec(512, 10)), (0, 1, 2)


def conv(x, w, stride=1):
  return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def pool(x):
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def momentum_step(loss, params, velocity, *data):
  grads = jax.grad(loss)(params, *data)
  velocity = jax.tree.map(lambda u, g: 0.9 * u + g, velocity, grads)
  return jax.tree.map(lambda p, u: p - 0.01 * u, params, velocity), velocity


def xent(logits, y):
  return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1))


def cnn():
  params = {"c1": spec(3, 3, 3, 32), "c2": spec(3, 3, 32, 64), "d1": spec(8 * 8 * 64, 256),
            "d2": spec(256, 10)}

  def loss(p, x, y):
    x = pool(jax.nn.relu(conv(x, p["c1"])))
    x = pool(jax.nn.relu(conv(x, p["c2"])))
    x = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["d1"])
    return xent(x @ p["d2"], y)

  step = functools.partial(momentum_step, loss)
  step.__name__ = "step"
  return step, (params, params, spec(64, 32, 32, 3), spec(64, 10)), (0, 1)


def resnet():
  params = {"stem": spec(3, 3, 3, 64), "head": spec(64, 10),
            "blocks": [{"a": spec(3, 3, 64, 64), "b": spec(3, 3, 64, 64)} for _ in range(6)]}

  def loss(p, x, y):
    x = jax.nn.relu(conv(x, p["stem"]))
    for blk in p["blocks"]:
      h = jax.nn.relu(conv(x, blk["a"]))
      x = jax.nn.relu(x + conv(h, blk["b"]))
    return xent(jnp.mean(x, (1, 2)) @ p["head"], y)

  step = functools.partial(momentum_step, loss)
  step.__name__ = "step"
  return step, (params, params, spec(32, 32, 32, 3), spec(32, 10)), (0, 1)


def layer_norm(x):
  mu = jnp.mean(x, -1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + 1e-5)


def block_spec(d):
  return {"qkv": spec(d, 3 * d), "o": spec(d, d), "up": spec(d, 4 * d), "down": spec(4 * d, d)}


def attention(q, k, v, heads, causal):
  b, t, d = q.shape
  split = lambda a: a.reshape(b, a.shape[1], heads, d // heads)
  q, k, v = split(q), split(k), split(v)
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d / heads)
  if causal:
    s = jnp.where(jnp.tril(jnp.ones((t, k.shape[1]), bool)), s, -1e9)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s), v).reshape(b, t, d)


def block(p, x, heads):
  q, k, v = jnp.split(layer_norm(x) @ p["qkv"], 3, -1)
  x = x + attention(q, k, v, heads, causal=True) @ p["o"]
  return x + jax.nn.gelu(layer_norm(x) @ p["up"]) @ p["down"], (k, v)


def gpt2():
  d, vocab = 768, 50257
  params = {"embed": spec(vocab, d), "pos": spec(256, d), "blocks": [block_spec(d)] * 12}

  def loss(p, tokens):
    x = p["embed"][tokens[:, :-1]] + p["pos"][:tokens.shape[1] - 1]
    for blk in p["blocks"]:
      x = block(blk, x, 12)[0]
    logits = layer_norm(x) @ p["embed"].T
    labels = jax.nn.one_hot(tokens[:, 1:], vocab)
    return xent(logits, labels)

  def step(params, m, v, tokens):
    return adam(params, jax.grad(loss)(params, tokens), m, v)

  return step, (params, params, params, spec(4, 257, dtype=jnp.int32)), (0, 1, 2)


def scan():
  layers, d = 64, 512
  params = {"w1": spec(layers, d, d), "w2": spec(layers, d, d)}

  def loss(p, x, y):
    def body(h, w):
      return h + jnp.tanh(h @ w[0]) @ w[1], None
    h, _ = jax.lax.scan(body, x, (p["w1"], p["w2"]))
    return jnp.mean((h - y) ** 2)

  step = functools.partial(momentum_step, loss)
  step.__name__ = "step"
  return step, (params, params, spec(256, d), spec(256, d)), (0, 1)


def decode():
  layers, d, heads, batch, length = 12, 768, 12, 8, 1024
  params = [block_spec(d)] * layers
  cache = spec(layers, 2, batch, length, d)

  def step(params, cache, x, pos):
    for i, p in enumerate(params):
      q, k, v = jnp.split(layer_norm(x) @ p["qkv"], 3, -1)
      cache = jax.lax.dynamic_update_slice(cache, jnp.stack([k, v])[None], (i, 0, 0, pos, 0))
      ks, vs = cache[i, 0], cache[i, 1]
      visible = (jnp.arange(length) <= pos)[None, None, None, :]
      b = x.shape[0]
      qh = q.reshape(b, 1, heads, d // heads)
      s = jnp.einsum("bqhd,bkhd->bhqk", qh, ks.reshape(b, length, heads, d // heads))
      s = jnp.where(visible, s / 8.0, -1e9)
      att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s), vs.reshape(b, length, heads, -1))
      x = x + att.reshape(b, 1, d) @ p["o"]
      x = x + jax.nn.gelu(layer_norm(x) @ p["up"]) @ p["down"]
    return x, cache

  return step, (params, cache, spec(batch, 1, d), spec(dtype=jnp.int32)), (1,)


def prefill():
  layers, d, heads, t = 6, 1024, 16, 512
  params = [block_spec(d)] * layers

  def step(params, x):
    kv = []
    for p in params:
      x, cache = block(p, x, heads)
      kv.append(jnp.stack(cache))
    return layer_norm(x[:, -1]), jnp.stack(kv)

  return step, (params, spec(2, t, d)), ()


def dp_tp(mesh):
  """Megatron-style MLP: the first matrix split by columns, the second by rows, over "tp";
  the batch over "dp". Gradients are summed over "dp" inside the shard_map."""
  d, hidden, batch = 1024, 8192, 256

  def local(w1, w2, x, y):
    def loss(w1, w2):
      h = jax.nn.gelu(x @ w1)
      out = jax.lax.psum(h @ w2, "tp")
      return jnp.mean((out - y) ** 2)
    g1, g2 = jax.grad(loss, (0, 1))(w1, w2)
    g1, g2 = jax.lax.psum(g1, "dp"), jax.lax.psum(g2, "dp")
    return w1 - 0.01 * g1, w2 - 0.01 * g2

  specs = (P(None, "tp"), P("tp", None), P("dp", None), P("dp", None))
  body = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=specs[:2])

  def step(w1, w2, x, y):
    return body(w1, w2, x, y)

  args = (spec(d, hidden), spec(hidden, d), spec(batch, d), spec(batch, d))
  shard = [NamedSharding(mesh, s) for s in specs]
  return step, tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                     for a, s in zip(args, shard)), (0, 1)


PROGRAMS = {"mlp": mlp, "cnn": cnn, "resnet": resnet, "gpt2": gpt2, "scan": scan,
            "decode": decode, "prefill": prefill}


def compile_program(name: str, platform: str, target: str) -> None:
  """Lowers and compiles one program on ``platform`` ("cpu" or "h100")."""
  if platform == "cpu":
    import numpy as np
    devices = np.array(jax.devices()[:8])
    mesh = jax.sharding.Mesh(devices.reshape(2, 4), ("dp", "tp"))
    replicate = None
  else:
    from jax.experimental import topologies
    topo = topologies.get_topology_desc("h100", "cuda", target_config=open(target).read(),
                                        topology="1x1x8")
    mesh = topologies.make_mesh(topo, (2, 4), ("dp", "tp"))
    replicate = NamedSharding(mesh, P())
  if name == "dp_tp":
    step, args, donate = dp_tp(mesh)
  else:
    step, args, donate = PROGRAMS[name]()
    if replicate is not None:
      args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicate),
                          args)
  jax.jit(step, donate_argnums=donate).lower(*args).compile()
