"""An equinox MLP, tiny, with an optax adam step under `eqx.filter_jit`.

Run as `python -m donate.profile tests/data/mlp_equinox.py` (tests/test_profile_report.py).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


class MLP(eqx.Module):
  hidden: eqx.nn.Linear
  head: eqx.nn.Linear

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.hidden = eqx.nn.Linear(64, 256, key=k1)
    self.head = eqx.nn.Linear(256, 10, key=k2)

  def __call__(self, x):
    return self.head(jax.nn.relu(self.hidden(x)))


optim = optax.adam(1e-3)


@eqx.filter_jit
def train_step(model, opt_state, x, y):
  def loss_fn(m):
    return optax.softmax_cross_entropy_with_integer_labels(jax.vmap(m)(x), y).mean()

  loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
  updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
  return eqx.apply_updates(model, updates), opt_state, loss


def main():
  model = MLP(jax.random.key(0))
  opt_state = optim.init(eqx.filter(model, eqx.is_array))
  x, y = jnp.ones((128, 64)), jnp.zeros((128,), jnp.int32)
  for _ in range(2):
    model, opt_state, loss = train_step(model, opt_state, x, y)
  print(f"loss {float(loss):.4f}")


if __name__ == "__main__":
  main()
