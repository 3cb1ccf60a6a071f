"""A nanoGPT-style flax linen model, tiny: 4 blocks, an optax adamw `TrainState`, a `@jax.jit`
step.

Run as `python -m donate.profile tests/data/gpt_linen.py` (tests/test_profile_report.py).
"""

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax.training import train_state

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, BATCH = 256, 64, 64, 4, 4, 8


class Attention(nn.Module):
  @nn.compact
  def __call__(self, x):
    b, t, c = x.shape
    q, k, v = jnp.split(nn.Dense(3 * c, name="c_attn")(x), 3, axis=-1)
    q, k, v = (a.reshape(b, t, HEADS, c // HEADS).transpose(0, 2, 1, 3) for a in (q, k, v))
    att = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(c // HEADS)
    att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -1e9)
    att = jax.nn.softmax(att, axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
    return nn.Dense(c, name="c_proj")(y)


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x + Attention(name="attn")(nn.LayerNorm(name="ln_1")(x))
    h = nn.gelu(nn.Dense(4 * WIDTH, name="c_fc")(nn.LayerNorm(name="ln_2")(x)))
    return x + nn.Dense(WIDTH, name="c_proj")(h)


class GPT(nn.Module):
  @nn.compact
  def __call__(self, idx):
    x = nn.Embed(VOCAB, WIDTH, name="wte")(idx) + nn.Embed(CONTEXT, WIDTH, name="wpe")(
      jnp.arange(idx.shape[1])
    )
    for i in range(LAYERS):
      x = Block(name=f"h_{i}")(x)
    return nn.Dense(VOCAB, name="lm_head")(nn.LayerNorm(name="ln_f")(x))


@jax.jit
def train_step(state, batch):
  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), loss


def main():
  model = GPT()
  batch = jnp.zeros((BATCH, CONTEXT + 1), jnp.int32)
  params = model.init(jax.random.key(0), batch[:, :-1])["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))
  for _ in range(3):
    state, loss = train_step(state, batch)
  print(f"loss {float(loss):.4f}")


if __name__ == "__main__":
  main()
