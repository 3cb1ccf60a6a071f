"""`jax.jit = donate.jit` before importing flax, optax and equinox: every `jax.jit` in them and in
the user's code becomes a `donate.jit` and the training loops run as they do unpatched.

Each run is its own process (the patch is process-wide): `_global_patch_worker.py` runs a flax
linen `TrainState` loop with a user `jax.jit(donate_argnums=0)`, a flax nnx `nnx.jit` loop and an
equinox `filter_jit(donate="all")` loop, plain and patched, and the final states must be bitwise
equal.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("equinox")

WORKER = pathlib.Path(__file__).with_name("_global_patch_worker.py")


def run_worker(mode: str, out: pathlib.Path) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, str(WORKER), mode, str(out)], capture_output=True,
                        text=True, timeout=300, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_patched_frameworks_run_through_donate_jit_with_jax_jit_results(tmp_path):
  plain = run_worker("plain", tmp_path / "plain.npz")
  patched = run_worker("patched", tmp_path / "patched.npz")
  assert patched["jax_jit_is_donate"]
  # The user's two jax.jit calls, nnx.jit's and filter_jit's inner jax.jit at least.
  assert patched["built"] >= 4
  assert patched["consumed"] == plain["consumed"] and all(plain["consumed"])
  a, b = np.load(tmp_path / "plain.npz"), np.load(tmp_path / "patched.npz")
  assert a.files == b.files and len(a.files) > 10
  for name in a.files:
    np.testing.assert_array_equal(a[name], b[name])


def test_donate_keeps_the_jax_jit_it_was_imported_with():
  import jax

  import donate
  from donate._base import compat as _compat

  saved = jax.jit
  try:
    jax.jit = donate.jit  # donate's own inner jits must not recurse into the patch
    f = donate.jit(lambda a, b: (b.at[0].set(1.0), a + 1.0), donate_argnums=(0, 1))
    a, b = jax.numpy.zeros(4), jax.numpy.ones(4)
    x, y = f(a, b)
    assert a.is_deleted() and b.is_deleted()
    np.testing.assert_array_equal(x, [1, 1, 1, 1])
    assert _compat.jax_jit is saved
  finally:
    jax.jit = saved


def _nested_step(jit):
  """A framework's step: the outer call donates `a`; an inner jitted helper donates its own
  argument, which is the outer call's `b` (not donated there)."""
  helper = jit(lambda b: b * 2.0, donate_argnums=0)
  return lambda a, b: (a.sum(), helper(b))


def test_under_the_patch_an_inner_jit_donates_inside_another_as_jax_jits_does():
  import warnings

  import jax
  import jax.numpy as jnp

  import donate

  saved = jax.jit
  explicit = donate.jit(lambda b: b * 3.0, donate_argnums=0)  # made before the patch: honoured
  step = _nested_step(saved)
  a, b = jnp.ones(3), jnp.ones(3)
  expected = jax.device_get(saved(step, donate_argnums=0)(a, b))
  assert a.is_deleted() and not b.is_deleted()  # jax.jit: the inner donation does nothing
  try:
    jax.jit = donate.jit
    step = _nested_step(jax.jit)  # built as the framework builds it, under the patch
    outer = jax.jit(step, donate_argnums=0)
    a, b = jnp.ones(3), jnp.ones(3)
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # jax.jit gives no warning here: neither may donate.jit
      out = outer(a, b)
    assert a.is_deleted() and not b.is_deleted()
    np.testing.assert_array_equal(b, [1.0, 1.0, 1.0])  # the framework may read it again
    for x, y in zip(jax.device_get(out), expected):
      np.testing.assert_array_equal(x, y)
    _, kept = outer.plan(jnp.ones(3), jnp.ones(3)).decisions
    assert kept.action == "kept" and "inner jax.jit donation at " in kept.reason
    # Adopted where the outer function asks for it, as for any plain inner jax.jit.
    adopting = donate.jit(step, donate_argnums=0, adopt_inner_donation=True)
    a, b = jnp.ones(3), jnp.ones(3)
    with pytest.warns(donate.UnusableDonationWarning, match=r"float32\[3\] \(a\)"):
      adopting(a, b)  # b, updated in place, takes the one output of a's type
    assert b.is_deleted() and not a.is_deleted()
    # A donate.jit made before the patch is donate's own marker inside a patched jax.jit.
    a, b = jnp.ones(3), jnp.ones(3)
    jax.jit(lambda a, b: (a.sum(), explicit(b)))(a, b)
    assert b.is_deleted() and not a.is_deleted()
  finally:
    jax.jit = saved
