"""Orbax checkpoints around donated steps: `donate.jit` in place of `jax.jit` in a training loop
that saves and restores with orbax, the way users write one.

A checkpoint saved right before a step donates the state holds the state before that step (an
asynchronous save reads the arrays before `save` returns), a restored state is donated like any
other, and everything is bitwise what `jax.jit` gives: on 8 devices in this process, and in a
two-process job (`_orbax_worker.py`) where `jax.jit = donate.jit` is set before orbax and optax
are imported, so every `jax.jit` the job builds (the user's, optax's, JAX's multihost utilities')
is a `donate.jit`.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import donate

ocp = pytest.importorskip("orbax.checkpoint")
pytest.importorskip("optax")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _multiprocess_step import run_two  # noqa: E402

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier


def state_on(mesh):
  rows = NamedSharding(mesh, P("d"))
  return {
    "w": jax.device_put(jnp.arange(256 * 128, dtype=jnp.float32).reshape(256, 128) / 1e4, rows),
    "m": jax.device_put(jnp.ones((256, 128)), rows),
    "step": jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(mesh, P())),
  }


def momentum_step(s, g):
  """Momentum SGD: the state in, the state and the loss out."""
  m = 0.9 * s["m"] + g
  return {"w": s["w"] - 0.1 * m, "m": m, "step": s["step"] + 1}, jnp.sum(m)


def checkpointer(kind):
  if kind == "async":
    return ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
  return ocp.Checkpointer(ocp.StandardCheckpointHandler())


def abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def host(tree):
  """Copies on the host: `np.asarray` of a CPU array may be a view of its buffer, and a buffer
  with a view alive is not donated (by `jax.jit` either)."""
  return jax.tree.map(np.array, tree)


def train(jit, directory, kind):
  """Four donated steps, a save before the third; the save restored and donated to one more."""
  mesh = jax.make_mesh((8,), ("d",))
  grads = [jax.device_put(jnp.full((256, 128), float(k)), NamedSharding(mesh, P("d")))
           for k in range(5)]  # fmt: skip
  step = jit(momentum_step, donate_argnums=0)
  state, consumed = state_on(mesh), []
  path = os.path.join(directory, "state")
  with checkpointer(kind) as ckpt:
    for k in range(4):
      if k == 2:
        ckpt.save(path, args=ocp.args.StandardSave(state))
        before_save = host(state)
      previous = state
      state, loss = step(state, grads[k])
      consumed.append([x.is_deleted() for x in jax.tree.leaves(previous)])
    if kind == "async":
      ckpt.wait_until_finished()
    restored = ckpt.restore(path, args=ocp.args.StandardRestore(abstract(state)))
  saved = host(restored)
  after, after_loss = step(restored, grads[4])
  consumed.append([x.is_deleted() for x in jax.tree.leaves(restored)])
  arrays = host({"trained": (state, loss), "resumed": (after, after_loss)})
  return arrays, before_save, saved, consumed


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_orbax_saves_and_restores_around_donated_sharded_steps(tmp_path, kind):
  want, want_before, want_saved, want_consumed = train(jax.jit, tmp_path / "jax", kind)
  got, before, saved, consumed = train(donate.jit, tmp_path / "donate", kind)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(a, b)
  # The checkpoint holds the state as it was when saved, though the next step donated it.
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(saved), strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(want_saved), jax.tree.leaves(saved), strict=True):
    np.testing.assert_array_equal(a, b)
  # Every step consumes the state, and the resumed one the restored state; but the step right
  # after an asynchronous save may not: while the save still holds the arrays it writes (on CPU,
  # views of their buffers) they are not donated, by `jax.jit` either, as timing decides.
  timed = {2} if kind == "async" else set()
  for k, (a, b) in enumerate(zip(want_consumed, consumed, strict=True)):
    assert k in timed or a == b == [True] * 3, (k, want_consumed, consumed)


def test_two_processes_with_jax_jit_patched_before_orbax_match_plain(tmp_path):
  """The patched job trains, checkpoints, restores and resumes bitwise as the plain one, consumes
  the same buffers, and its grads-first step compiles a lower peak: the parameters' new values
  go in the parameters' buffers, where `jax.jit` gives those to the gradients."""
  runs = {}
  for mode in ("plain", "patched"):
    out = tmp_path / f"{mode}.npz"
    reports = run_two("_orbax_worker.py", mode, str(tmp_path / mode), str(out), timeout=240)
    runs[mode] = reports, np.load(out)
  (plain, plain_arrays), (patched, patched_arrays) = runs["plain"], runs["patched"]
  assert [r["jit"] for r in patched] == ["donate._jit.wrapper"] * 2
  assert [r["jit"] for r in plain] != [r["jit"] for r in patched]
  for r in patched:
    assert {"__main__", "jax.experimental.multihost_utils"} <= set(r["built"])
    assert any(m.startswith("optax.") for m in r["built"]), r["built"]
  for a, b in zip(plain, patched, strict=True):
    assert a["losses"] == b["losses"] and a["newest"] == b["newest"] == 4
    # Saves follow steps 0, 2 and 4; the steps right after them (1 and 3) may find the arrays
    # still held by the asynchronous save, and not donate them (`jax.jit` neither), as timing
    # decides. Step 0 leaves Adam's moments alive under both: `tx.init`'s zeros depend on no
    # input and come out uncommitted on one local device, so the step is given global copies.
    for k in (0, 2, 4):
      assert a["consumed"][k] == b["consumed"][k], (k, a["consumed"], b["consumed"])
    assert all(a["consumed"][2]) and all(a["consumed"][4])
    assert a["restored_consumed"] == b["restored_consumed"] and all(b["restored_consumed"])
    assert b["peak"] < a["peak"] and b["temp"] < a["temp"]
    params = {k: v for k, v in b["aliases"].items() if "params" in k}
    assert params == {f"out[1]['params']['{w}']": f"state['params']['{w}']" for w in ("w1", "w2")}
  assert plain_arrays.files == patched_arrays.files and len(plain_arrays.files) == 23
  for name in plain_arrays.files:
    np.testing.assert_array_equal(plain_arrays[name], patched_arrays[name])
  # The checkpoint restored is the state trained (the newest save was after the last step).
  for k in range(7):
    np.testing.assert_array_equal(patched_arrays[f"saved{k}"], patched_arrays[f"trained{k}"])
