"""Runs training steps of flax (linen and nnx), optax and equinox, with `jax.jit = donate.jit`
set before any of them is imported (argv[1] == "patched") or untouched ("plain"). Writes the
final states to argv[2] (.npz), and, patched, how many `donate.jit` functions the frameworks
and the user code built and how many donated buffers were consumed."""

import json
import sys

import jax

if __name__ == "__main__" and sys.argv[1] == "patched":
  import donate
  from donate._jit import wrapper as _jit

  built = [0]
  _init = _jit.JitWrapped.__init__

  def _counting_init(self, *args, **kwargs):
    built[0] += 1
    _init(self, *args, **kwargs)

  _jit.JitWrapped.__init__ = _counting_init
  jax.jit = donate.jit

import equinox as eqx  # noqa: E402  (after the patch, as a user would)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from flax.training import train_state  # noqa: E402


def batch(k):
  k1, k2 = jax.random.split(jax.random.key(k))
  return jax.random.normal(k1, (16, 8)), jax.random.normal(k2, (16, 2))


class Linen(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.relu(nn.Dense(32)(x)))


def linen_loop(consumed):
  model = Linen()
  state = train_state.TrainState.create(apply_fn=model.apply,
                                        params=model.init(jax.random.key(0), jnp.ones((1, 8))),
                                        tx=optax.adam(1e-2))

  @jax.jit  # a user's own jax.jit, donating through its keyword
  def step(state, x, y):
    loss, grads = jax.value_and_grad(
        lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(state.params)
    return state.apply_gradients(grads=grads), loss

  step = jax.jit(step.__wrapped__, donate_argnums=0)
  for k in range(3):
    old = state
    state, _ = step(state, *batch(k))
    consumed.append(jax.tree.leaves(old.params)[0].is_deleted())
  return jax.tree.leaves(state.params)


def nnx_loop(consumed):
  model = nnx.Sequential(nnx.Linear(8, 32, rngs=nnx.Rngs(0)), nnx.relu,
                         nnx.Linear(32, 2, rngs=nnx.Rngs(1)))
  optimizer = nnx.Optimizer(model, optax.sgd(1e-2), wrt=nnx.Param)

  @nnx.jit  # flax's own jit, which builds a jax.jit inside
  def step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  for k in range(3):
    step(model, optimizer, *batch(k))
  return jax.tree.leaves(nnx.state(model))


def equinox_loop(consumed):
  model = eqx.nn.MLP(8, 2, 32, 2, key=jax.random.key(0))
  opt = optax.adam(1e-2)
  opt_state = opt.init(eqx.filter(model, eqx.is_array))

  @eqx.filter_jit(donate="all")  # equinox's own jit, which builds a jax.jit inside
  def step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(
        lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
    updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss

  for k in range(3):
    old = model
    model, opt_state, _ = step(model, opt_state, *batch(k))
    consumed.append(old.layers[0].weight.is_deleted())
  return jax.tree.leaves(eqx.filter(model, eqx.is_array))


def main():
  consumed = []
  leaves = linen_loop(consumed) + nnx_loop(consumed) + equinox_loop(consumed)
  np.savez(sys.argv[2], *[np.asarray(x) for x in leaves])
  report = {"consumed": consumed}
  if sys.argv[1] == "patched":
    report["built"] = built[0]
    report["jax_jit_is_donate"] = jax.jit is donate.jit
  print(json.dumps(report))


if __name__ == "__main__":
  main()
