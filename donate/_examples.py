"""Small real workloads used by the tests, the benchmarks, the notebooks and the README (private:
the package does not export them; copy what you need).

* a two-layer MLP trained with gradient accumulation over micro-batches (`lax.scan`), then an
  SGD-with-momentum-free update and fresh zeroed accumulators, written two ways: plain (donate
  with `donate_argnums`) and with `donate.donate_buffer` inside the scan body only;
* a `[T, ...]` output filled slice by slice (`lax.fori_loop` and `lax.map`);
* a transformer block's training step, data + tensor (sequence) parallel, with `psum`,
  `all_gather`, `psum_scatter` and `ppermute` under `shard_map`, a jitted NamedSharding update,
  and `with_symmetric` on the gradient reduction (`block_train_step`);
* a few-layer decoder-only transformer trained with a hand-written Adam (`lm_train_step`), the
  demo's workload for the memory doctor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from donate._base.primitives import donate_buffer
from donate.symm import with_symmetric


def mlp_init(key, width: int = 512, depth_in: int = 512, out: int = 512):
  """Parameters of a two-layer MLP as a dict of float32 arrays.

  >>> params = mlp_init(jax.random.key(0), width=8, depth_in=4, out=2)
  >>> sorted((k, v.shape) for k, v in params.items())
  [('b1', (8,)), ('b2', (2,)), ('w1', (4, 8)), ('w2', (8, 2))]
  """
  k1, k2 = jax.random.split(key)
  return {
    "w1": jax.random.normal(k1, (depth_in, width), jnp.float32) / jnp.sqrt(depth_in),
    "b1": jnp.zeros((width,), jnp.float32),
    "w2": jax.random.normal(k2, (width, out), jnp.float32) / jnp.sqrt(width),
    "b2": jnp.zeros((out,), jnp.float32),
  }


def mlp_loss(params, batch):
  """Mean squared error of the MLP on a micro-batch `(x, y)`.

  >>> params = mlp_init(jax.random.key(0), width=8, depth_in=4, out=2)
  >>> float(mlp_loss(params, (jnp.zeros((3, 4)), jnp.zeros((3, 2)))))
  0.0
  """
  x, y = batch
  h = jax.nn.relu(x @ params["w1"] + params["b1"])
  return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def _accumulate(params, acc, batches, annotate: bool):
  def body(acc, batch):
    p = params
    if annotate:  # both trace back to the step's inputs: the scan's constant and carry
      p, acc = donate_buffer(params), donate_buffer(acc)
    grads = jax.grad(mlp_loss)(p, batch)
    return jax.tree.map(jnp.add, acc, grads), None

  acc, _ = lax.scan(body, acc, batches)
  return acc


def grad_accum_step(params, acc, batches, lr: float = 1e-2):
  """One training step: accumulate gradients over micro-batches, update, return fresh accumulators.

  Args:
    params: the MLP parameters.
    acc: gradient accumulators shaped like `params`.
    batches: `(x, y)` stacked over micro-batches: `x[m, b, d]`, `y[m, b, o]`.
    lr: learning rate.

  Returns:
    `(new_params, zeroed_accumulators)`.

  >>> import donate
  >>> params = mlp_init(jax.random.key(0), width=8, depth_in=4, out=2)
  >>> acc = jax.tree.map(jnp.zeros_like, params)
  >>> batches = micro_batches(jax.random.key(1), micro=2, batch=3, width=4, out=2)
  >>> step = donate.jit(grad_accum_step, donate_argnums=(0, 1))
  >>> new_params, new_acc = step(params, acc, batches)
  >>> params["w1"].is_deleted(), float(new_acc["w1"].sum())
  (True, 0.0)
  """
  acc = _accumulate(params, acc, batches, annotate=False)
  n = batches[0].shape[0]
  new_params = jax.tree.map(lambda p, g: p - lr * g / n, params, acc)
  return new_params, jax.tree.map(jnp.zeros_like, acc)


def grad_accum_step_annotated(params, acc, batches, lr: float = 1e-2):
  """`grad_accum_step` with donation declared only by `donate_buffer` inside the scan body.

  The parameters (a constant of the loop) and the accumulators (its carry) are donated from inside
  the loop body; both trace back to the step's inputs, so `donate.jit(grad_accum_step_annotated)`
  needs no `donate_argnums`.

  >>> import donate
  >>> params = mlp_init(jax.random.key(0), width=8, depth_in=4, out=2)
  >>> acc = jax.tree.map(jnp.zeros_like, params)
  >>> batches = micro_batches(jax.random.key(1), micro=2, batch=3, width=4, out=2)
  >>> plan = donate.jit(grad_accum_step_annotated).plan(params, acc, batches)
  >>> sorted({str(d.action) for d in plan.decisions if d.path.startswith(("params", "acc"))})
  ['aliased']
  """
  acc = _accumulate(params, acc, batches, annotate=True)
  n = batches[0].shape[0]
  new_params = jax.tree.map(lambda p, g: p - lr * g / n, params, acc)
  return new_params, jax.tree.map(jnp.zeros_like, acc)


def fill_fori(xs):
  """Fills a `[T, D]` output slice by slice in a `fori_loop`.

  >>> fill_fori(jnp.zeros((2, 3))).tolist()
  [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
  """

  def body(i, out):
    return out.at[i].set(jnp.sin(xs[i]) * 2.0)

  return lax.fori_loop(0, xs.shape[0], body, jnp.zeros_like(xs))


def fill_map(xs):
  """Fills a `[T, D]` output slice by slice with `lax.map`.

  >>> fill_map(jnp.zeros((2, 3))).shape
  (2, 3)
  """
  return lax.map(lambda x: jnp.sin(x) * 2.0, xs)


def micro_batches(key, micro: int = 4, batch: int = 32, width: int = 512, out: int = 512):
  """Random `(x, y)` stacked over `micro` micro-batches.

  >>> x, y = micro_batches(jax.random.key(0), micro=4, batch=2, width=3, out=1)
  >>> x.shape, y.shape
  ((4, 2, 3), (4, 2, 1))
  """
  kx, ky = jax.random.split(key)
  return (
    jax.random.normal(kx, (micro, batch, width), jnp.float32),
    jax.random.normal(ky, (micro, batch, out), jnp.float32),
  )


# ---- a transformer block's training step, data + tensor (sequence) parallel ----------------------
# Mesh axes "dp" (data) and "tp" (tensor). Inside `shard_map`: activations are split over the
# sequence on "tp" (sequence parallelism); all_gather rebuilds the full sequence before each
# column-parallel matmul, psum_scatter sums the row-parallel partial products back into sequence
# shards, ppermute passes each shard's last token to the next shard (token shift). The gradient
# reduction over "dp" is an explicit psum annotated with `with_symmetric`. Outside `shard_map`, the
# jitted step clips by the global gradient norm and applies momentum SGD on NamedSharding-ed
# arrays, so XLA's partitioner inserts its own (un-annotated) all-reduces there.

BLOCK_SPECS = {
  "ln1": P(),
  "ln2": P(),
  "wq": P(None, "tp"),
  "wk": P(None, "tp"),
  "wv": P(None, "tp"),
  "wo": P("tp", None),
  "w1": P(None, "tp"),
  "w2": P("tp", None),
}
"""How each parameter of the block is split: column-parallel on "tp", row-parallel on "tp"."""

DATA_SPEC = P("dp", "tp", None)
"""Activations [batch, sequence, model]: batch over "dp", sequence over "tp"."""


def block_shapes(d_model: int = 256, d_ff: int = 1024) -> dict:
  """Global parameter shapes of the block.

  >>> block_shapes(8, 16)["w1"]
  (8, 16)
  """
  d = d_model
  return {
    "ln1": (d,),
    "ln2": (d,),
    "wq": (d, d),
    "wk": (d, d),
    "wv": (d, d),
    "wo": (d, d),
    "w1": (d, d_ff),
    "w2": (d_ff, d),
  }


def block_init(key, d_model: int = 256, d_ff: int = 1024) -> dict:
  """Parameters of the block (float32), scaled so activations stay of order one.

  >>> sorted(block_init(jax.random.key(0), 8, 16))
  ['ln1', 'ln2', 'w1', 'w2', 'wk', 'wo', 'wq', 'wv']
  """
  shapes = block_shapes(d_model, d_ff)
  keys = dict(zip(shapes, jax.random.split(key, len(shapes))))
  return {
    k: (
      jnp.ones(s, jnp.float32)
      if len(s) == 1
      else jax.random.normal(keys[k], s, jnp.float32) / jnp.sqrt(s[0])
    )
    for k, s in shapes.items()
  }


def _norm(x, scale):
  return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _attention(q, k, v, heads: int):
  b, s, d = q.shape
  split = lambda t: t.reshape(b, s, heads, d // heads)
  w = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / jnp.sqrt(d // heads)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(w, axis=-1), split(v)).reshape(b, s, d)


def _shift(x, prev_last):
  """Token shift: each position sees the previous token (the first one sees `prev_last`)."""
  return jnp.concatenate([prev_last, x[:, :-1]], axis=1)


def block_forward_reference(params, x, heads: int = 8):
  """The block on whole (unsharded) arrays: the numbers the sharded step must reproduce."""
  h = _norm(x, params["ln1"])
  x = x + _attention(h @ params["wq"], h @ params["wk"], h @ params["wv"], heads) @ params["wo"]
  h = _norm(_shift(x, jnp.zeros_like(x[:, :1])), params["ln2"])
  return x + jax.nn.gelu(h @ params["w1"]) @ params["w2"]


def _local_block(params, x, heads: int, tp: int):
  """The block on one device's blocks: x is [b, s / tp, d], weights are "tp" slices."""
  gather = lambda t: lax.all_gather(t, "tp", axis=1, tiled=True)
  scatter = lambda t: lax.psum_scatter(t, "tp", scatter_dimension=1, tiled=True)
  h = gather(_norm(x, params["ln1"]))
  q, k, v = (h @ params[w] for w in ("wq", "wk", "wv"))
  x = x + scatter(_attention(q, k, v, heads // tp) @ params["wo"])
  last = lax.ppermute(x[:, -1:], "tp", [(i, i + 1) for i in range(tp - 1)])
  h = gather(_norm(_shift(x, last), params["ln2"]))
  return x + scatter(jax.nn.gelu(h @ params["w1"]) @ params["w2"])


def block_loss_reference(params, x, y, heads: int = 8):
  """Mean squared error of the block's output against `y`, on whole arrays."""
  return jnp.mean((block_forward_reference(params, x, heads) - y) ** 2)


def block_grads(mesh, heads: int = 8, *, annotate: bool = True):
  """`shard_map`-ped loss and gradients over `mesh` ("dp", "tp"); the dp reduction is annotated.

  Returns a function `(params, x, y) -> (grads, loss)` on global arrays.
  """
  dp, tp = mesh.shape["dp"], mesh.shape["tp"]

  def local(params, x, y):
    count = x.size * dp * tp  # global element count: the local losses sum to the global mean

    def loss(p):
      return jnp.sum((_local_block(p, x, heads, tp) - y) ** 2) / count

    varying = jax.tree.map(lambda a: lax.pcast(a, "dp", to="varying"), params)
    value, grads = jax.value_and_grad(loss)(varying)
    if annotate:
      grads = with_symmetric(grads, "dp")
    grads = jax.tree.map(lambda g: lax.psum(g, "dp"), grads)
    return grads, lax.psum(value, ("dp", "tp"))

  return jax.shard_map(
    local, mesh=mesh, in_specs=(BLOCK_SPECS, DATA_SPEC, DATA_SPEC), out_specs=(BLOCK_SPECS, P())
  )


def block_train_step(
  mesh,
  heads: int = 8,
  *,
  lr: float = 0.05,
  beta: float = 0.9,
  clip: float = 1.0,
  annotate: bool = True,
):
  """One training step: `(params, momentum, x, y) -> (params, momentum, loss)`.

  Gradients come from `block_grads` (shard_map); clipping by the global norm and the momentum
  update are plain jitted array code on NamedSharding-ed arrays. Donate `params` and `momentum`
  (arguments 0 and 1): every output but the loss can reuse their buffers.
  """
  grads_fn = block_grads(mesh, heads, annotate=annotate)

  def step(params, momentum, x, y):
    grads, loss = grads_fn(params, x, y)
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(1.0, clip / (norm + 1e-6))
    momentum = jax.tree.map(lambda m, g: beta * m + scale * g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - lr * m, params, momentum)
    return params, momentum, loss

  return step


def block_abstract_args(
  mesh, batch: int = 16, seq: int = 256, d_model: int = 256, d_ff: int = 1024
) -> tuple:
  """`jax.ShapeDtypeStruct`s (params, momentum, x, y) sharded on `mesh`, for ahead-of-time use."""
  spec = lambda s, p: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
  params = {k: spec(s, BLOCK_SPECS[k]) for k, s in block_shapes(d_model, d_ff).items()}
  data = spec((batch, seq, d_model), DATA_SPEC)
  return params, dict(params), data, data


def lm_init(key, vocab: int = 512, d_model: int = 128, layers: int = 4, d_ff: int = 512) -> dict:
  """Parameters of a small decoder-only transformer: an embedding, `layers` blocks, a head."""
  keys = iter(jax.random.split(key, 2 + 6 * layers))
  normal = lambda shape: jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(shape[0])
  block = lambda: {
    "ln1": jnp.ones(d_model),
    "wq": normal((d_model, d_model)),
    "wk": normal((d_model, d_model)),
    "wv": normal((d_model, d_model)),
    "wo": normal((d_model, d_model)),
    "ln2": jnp.ones(d_model),
    "w1": normal((d_model, d_ff)),
    "w2": normal((d_ff, d_model)),
  }
  return {
    "embed": normal((vocab, d_model)),
    "blocks": [block() for _ in range(layers)],
    "head": normal((d_model, vocab)),
  }


def _causal_attention(h, p, heads: int, causal):
  b, s, d = h.shape
  split = lambda t: t.reshape(b, s, heads, d // heads)
  w = jnp.einsum("bqhd,bkhd->bhqk", split(h @ p["wq"]), split(h @ p["wk"])) / jnp.sqrt(d // heads)
  w = jax.nn.softmax(jnp.where(causal, w, -1e9), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", w, split(h @ p["wv"])).reshape(b, s, d)


def lm_loss(params, tokens, heads: int = 4):
  """Next-token cross-entropy of a causal transformer on `tokens` ([batch, seq] int32)."""
  x = params["embed"][tokens[:, :-1]]
  causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
  for p in params["blocks"]:
    x = x + _causal_attention(_norm(x, p["ln1"]), p, heads, causal) @ p["wo"]
    x = x + jax.nn.gelu(_norm(x, p["ln2"]) @ p["w1"]) @ p["w2"]
  logits = x @ params["head"]
  labels = tokens[:, 1:]
  picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def adam_init(params) -> dict:
  """Adam's state: first and second moments (zeros like `params`) and a step count."""
  zeros = lambda: jax.tree.map(jnp.zeros_like, params)
  return {"mu": zeros(), "nu": zeros(), "count": jnp.zeros((), jnp.int32)}


def lm_train_step(params, opt, tokens, lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999):
  """One training step with Adam: `(params, opt, tokens) -> (params, opt, loss)`.

  Donate `params` and `opt` (arguments 0 and 1): each output but the loss can reuse their buffers.
  """
  loss, grads = jax.value_and_grad(lm_loss)(params, tokens)
  count = opt["count"] + 1
  mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["mu"], grads)
  nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["nu"], grads)
  scale = lr * jnp.sqrt(1 - b2**count) / (1 - b1**count)
  params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), params, mu, nu)
  return params, {"mu": mu, "nu": nu, "count": count}, loss
