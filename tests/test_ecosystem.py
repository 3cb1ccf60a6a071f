"""Real users' training loops: `donate.jit` replaces `jax.jit` and nothing else changes.

Each loop runs several donated steps under `jax.jit` and under `donate.jit` from identical
starting states; the results must be bitwise equal, every donated leaf that `jax.jit` consumes is
consumed, and `donate.jit`'s compiled peak memory (from `memory_analysis()`) is no higher.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate

optax = pytest.importorskip("optax")
flax = pytest.importorskip("flax")
eqx = pytest.importorskip("equinox")
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from flax.training import train_state  # noqa: E402

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

STEPS = 4


def batch(seed, n=16, d=8):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return jax.random.normal(k1, (n, d)), jax.random.normal(k2, (n, 2))


def peak(jitted, *args):
  m = jitted.lower(*args).compile().memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)


def run_both(make_state, step, *, donate_argnums=0):
  """Runs `step` STEPS times under jax.jit and donate.jit; returns both final states and peaks."""
  results, peaks = [], []
  for jit in (jax.jit, donate.jit):
    jitted = jit(step, donate_argnums=donate_argnums)
    state = make_state()
    peaks.append(peak(jitted, make_state(), *batch(0)))
    for k in range(STEPS):
      previous = state
      state, loss = jitted(state, *batch(k))
      consumed = [x.is_deleted() for x in jax.tree.leaves(previous) if isinstance(x, jax.Array)]
      assert any(consumed), "the donated state was not consumed"
    results.append((state, loss))
  return results, peaks


def assert_drop_in(make_state, step):
  """Both jits: bitwise-equal final states and losses; donate.jit's peak no higher."""
  (theirs, ours), (peak_jax, peak_donate) = run_both(make_state, step)
  assert_bitwise_equal(theirs, ours)
  assert peak_donate <= peak_jax
  return ours


def assert_bitwise_equal(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.relu(nn.Dense(32)(x)))


def test_flax_linen_train_state_loop():
  model = LinenMLP()

  def make_state():  # TrainState.create stores step=0, a Python int, in the donated pytree
    params = model.init(jax.random.key(0), jnp.ones((1, 8)))
    return train_state.TrainState.create(apply_fn=model.apply, params=params,
                                         tx=optax.adam(1e-2))

  def step(state, x, y):
    def loss_fn(params):
      return jnp.mean((state.apply_fn(params, x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  ours = assert_drop_in(make_state, step)
  assert int(ours[0].step) == STEPS
  plan = donate.jit(step, donate_argnums=0).plan(make_state(), *batch(0))
  by_path = {d.path: d for d in plan.decisions}
  assert by_path["state.step"].reason == "not donated: not a device buffer (int)"
  assert all(d.action == "aliased" for p, d in by_path.items() if p.startswith("state.params"))


def test_flax_nnx_training_step():
  class Model(nnx.Module):
    def __init__(self, rngs):
      self.l1, self.l2 = nnx.Linear(8, 32, rngs=rngs), nnx.Linear(32, 2, rngs=rngs)

    def __call__(self, x):
      return self.l2(nnx.relu(self.l1(x)))

  def make():
    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(1e-2), wrt=nnx.Param)
    return nnx.split((model, optimizer))

  graphdef, _ = make()

  def make_state():
    return make()[1]

  def step(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
      return jnp.mean((model(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss

  assert_drop_in(make_state, step)


def test_optax_update():
  tx = optax.adamw(1e-2)

  def make_state():
    params = {"w": jnp.ones((8, 2)) * 0.1, "b": jnp.zeros(2)}
    return params, tx.init(params)

  def step(state, x, y):
    params, opt_state = state
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  assert_drop_in(make_state, step)


def test_equinox_model_step():
  model = eqx.nn.MLP(8, 2, 32, 2, key=jax.random.key(0))
  params, static = eqx.partition(model, eqx.is_array)
  tx = optax.sgd(1e-2)

  def make_state():
    p = jax.tree.map(jnp.copy, params)
    return p, tx.init(p)

  def step(state, x, y):
    p, opt_state = state

    def loss_fn(p):
      m = eqx.combine(p, static)
      return jnp.mean((jax.vmap(m)(x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, opt_state = tx.update(grads, opt_state, p)
    return (eqx.apply_updates(p, updates), opt_state), loss

  assert_drop_in(make_state, step)


def test_equinox_filter_jit_donation_inside_donate_jit_consumes_nothing_undonated():
  inner = eqx.filter_jit(lambda m, x: jax.vmap(m)(x), donate="all")
  params, static = eqx.partition(eqx.nn.MLP(8, 2, 16, 1, key=jax.random.key(1)), eqx.is_array)
  x = batch(0)[0]

  def loss(p, x):
    return inner(eqx.combine(p, static), x).sum()

  expected = jax.jit(loss)(params, x)
  np.testing.assert_array_equal(donate.jit(loss)(params, x), expected)
  assert not any(p.is_deleted() for p in jax.tree.leaves(params)) and not x.is_deleted()
  adopted = donate.jit(lambda p, x: (loss(p, x), jax.tree.map(lambda a: a * 0.5, p)),
                       adopt_inner_donation=True)
  with pytest.warns(donate.UnusableDonationWarning, match=r"float32\[16,8\] \(x\)"):
    decisions = adopted.plan(params, x).decisions
  assert all(d.source.startswith("inner jit donation at ") for d in decisions)
  assert [d.action for d in decisions] == ["aliased"] * 4 + ["unusable"]  # x has no output
