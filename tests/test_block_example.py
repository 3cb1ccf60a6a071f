"""The transformer block's data + tensor parallel training step (donate._examples) computes the same
loss and gradients as the unsharded reference, on 8 virtual CPU devices."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from donate import _examples as examples

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier


def test_block_step_matches_the_unsharded_reference_on_cpu():
  mesh = jax.make_mesh((2, 4), ("dp", "tp"), devices=jax.devices("cpu")[:8])
  b, s, d, ff, heads = 4, 16, 32, 64, 8
  params = examples.block_init(jax.random.key(0), d, ff)
  x, y = (jax.random.normal(jax.random.key(k), (b, s, d)) for k in (1, 2))
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(examples.block_loss_reference),
                                static_argnums=3)(params, x, y, heads)
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
  sharded = {k: put(v, examples.BLOCK_SPECS[k]) for k, v in params.items()}
  grads, loss = jax.jit(examples.block_grads(mesh, heads))(
      sharded, put(x, examples.DATA_SPEC), put(y, examples.DATA_SPEC))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for k in params:
    np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6)
