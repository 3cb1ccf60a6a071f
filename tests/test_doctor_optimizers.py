"""The memory doctor's categories and its "beside a donation" list for optimizers that are not
optax: a line-search solver that keeps the gradient in its state (jaxopt), the
`OptimizerState` of `jax.example_libraries.optimizers` (numpyro's), and a small donation at a
large peak."""

import jax
import jax.numpy as jnp
import pytest
from jax.example_libraries import optimizers

import donate


def _categories(p):
  return {e.path: e.category for e in p.at_peak if e.kind == "argument"}


def _loss(params, x, y):
  return jnp.mean((jnp.tanh(x @ params["w"]) - y) ** 2)


def test_a_line_search_solvers_parameters_are_parameters():
  """jaxopt's LBFGS evaluates trial points `params + t * d` in its line search: no forward pass
  reads the parameters themselves, one reads the trial point made from them."""
  jaxopt = pytest.importorskip("jaxopt")
  solver = jaxopt.LBFGS(fun=_loss, maxiter=5)
  x, y = jnp.ones((16, 64)), jnp.ones((16, 32))
  params = {"w": jnp.full((64, 32), 0.01)}
  state = solver.init_state(params, x, y)
  p = donate.memory_profile(donate.jit(solver.update, donate_argnums=(0, 1)), params, state, x, y)
  found = _categories(p)
  assert found["params['w']"] == "parameters", found
  for path in ("state.s_history['w']", "state.y_history['w']", "state.grad['w']"):
    assert found[path] == "optimizer state", (path, found)
  assert found["args[0]"] == found["args[1]"] == "inputs"  # x, y: taken by *args


def test_the_parameters_inside_an_optimizer_state_node_are_parameters():
  """`jax.example_libraries.optimizers` (numpyro's optimizers) keep (x, m, v) in an
  `OptimizerState`, a pytree node registered without keys: named as JAX names them."""
  init, update, get_params = optimizers.adam(1e-3)
  x, y = jnp.ones((16, 64)), jnp.ones((16, 32))

  def step(i, opt_state, x, y):
    return update(i, jax.grad(_loss)(get_params(opt_state), x, y), opt_state)

  state = init({"w": jnp.full((64, 32), 0.01)})
  for jit in (jax.jit, donate.jit):
    found = _categories(donate.memory_profile(jit(step, donate_argnums=1), 0, state, x, y))
    assert found["opt_state[0][0][0]"] == "parameters", found  # x of the packed (x, m, v)
    assert found["opt_state[0][0][1]"] == found["opt_state[0][0][2]"] == "optimizer state"


def test_a_donation_small_against_the_peak_is_not_listed_beside_its_temporary():
  """SGD of {w: 1 MiB, b: 2 KiB}: both outputs are computed from a gradient of their size, live
  beside the donated buffer at the peak; only w's is worth naming (b is 0.1% of the peak)."""

  def sgd(p, x):
    g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"] + p["b"])))(p)
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

  p = {"w": jnp.ones((512, 512)), "b": jnp.ones((512,))}
  profile = donate.memory_profile(jax.jit(sgd, donate_argnums=0), p, jnp.ones((16, 512)))
  assert [s.path for s in profile.shadowed] == ["p['w']"]
  assert "beside them at the peak (each 1% of it or more):" in str(profile)
