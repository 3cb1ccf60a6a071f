"""One process of the two-process orbax test in `test_orbax.py` (run as a script).

Usage: python _orbax_worker.py PROCESS_ID PORT MODE CHECKPOINTS OUT. MODE "patched" sets
`jax.jit = donate.jit` before orbax and optax are imported, as a user patches JAX for frameworks
they did not write; "plain" leaves JAX alone. Joins a two-process JAX job (two CPU devices each),
trains a sharded MLP with Adam for five donated steps whose outputs come grads first (the buffers
first come, first served gives the gradients are the parameters' own), saves every second step
with an asynchronous orbax `CheckpointManager` right before the next step donates the state,
restores the newest checkpoint into the state's shardings and takes one more donated step from
it. Process 0 writes the gathered arrays to OUT (.npz); each prints one JSON line with what it
saw (patched: the modules whose functions a `donate.jit` was built for).
"""

import json
import sys

import jax

BUILT: list[str] = []  # patched: the modules of the functions each donate.jit was built for

if __name__ == "__main__" and sys.argv[3] == "patched":
  import donate
  from donate._jit import wrapper as _wrapper

  _init = _wrapper.JitWrapped.__init__

  def _recording_init(self, fun, *args, **kwargs):
    BUILT.append(getattr(fun, "__module__", None) or "")
    _init(self, fun, *args, **kwargs)

  _wrapper.JitWrapped.__init__ = _recording_init
  jax.jit = donate.jit

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from _multiprocess_step import join, on_device  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

STEPS = 5
D_IN, D_HIDDEN, D_OUT = 512, 256, 128  # weights of 512 and 128 KiB: above copy_threshold's default


def initial(mesh):
  rows = jax.sharding.NamedSharding(mesh, jax.P("d", None))
  rng = np.random.default_rng(0)
  params = {
    "w1": on_device(rng.normal(size=(D_IN, D_HIDDEN)).astype(np.float32) / 20, rows),
    "w2": on_device(rng.normal(size=(D_HIDDEN, D_OUT)).astype(np.float32) / 20, rows),
  }
  tx = optax.adam(1e-2)
  return {"params": params, "opt": jax.jit(tx.init)(params)}, tx


def make_step(tx):
  def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)

  def step(state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
    updates, opt = tx.update(grads, state["opt"], state["params"])
    return grads, {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

  return step


def batch(mesh, k):
  rng = np.random.default_rng(100 + k)
  rows = jax.sharding.NamedSharding(mesh, jax.P("d", None))
  x = rng.normal(size=(8, D_IN)).astype(np.float32)
  y = rng.normal(size=(8, D_OUT)).astype(np.float32)
  return on_device(x, rows), on_device(y, rows)


def gather(tree):
  return [np.asarray(multihost_utils.process_allgather(x, tiled=True))
          for x in jax.tree.leaves(tree)]


def main(process_id: int, port: int, checkpoints: str, out: str) -> None:
  join(process_id, port)
  mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  state, tx = initial(mesh)
  step = jax.jit(make_step(tx), donate_argnums=0)
  memory = step.lower(state, *batch(mesh, 0)).compile().memory_analysis()
  options = ocp.CheckpointManagerOptions(save_interval_steps=2, max_to_keep=2)
  report = {"jit": type(step).__module__, "consumed": [], "losses": []}
  with ocp.CheckpointManager(checkpoints, options=options) as manager:
    for k in range(STEPS):
      previous = state
      grads, state, loss = step(state, *batch(mesh, k))
      report["consumed"].append([x.is_deleted() for x in jax.tree.leaves(previous)])
      report["losses"].append(float(multihost_utils.process_allgather(loss, tiled=True)))
      manager.save(k, args=ocp.args.StandardSave(state))  # asynchronous; the next step donates
    manager.wait_until_finished()
    newest = manager.latest_step()
    target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    restored = manager.restore(newest, args=ocp.args.StandardRestore(target))
  saved = gather(restored)
  grads, after, loss = step(restored, *batch(mesh, STEPS))
  report["restored_consumed"] = [x.is_deleted() for x in jax.tree.leaves(restored)]
  report["newest"] = newest
  report["peak"] = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                    - memory.alias_size_in_bytes + memory.temp_size_in_bytes)  # fmt: skip
  report["temp"] = memory.temp_size_in_bytes
  if hasattr(step, "plan"):  # donate.jit: where each parameter's new value goes
    plan = step.plan(after, *batch(mesh, 0))
    report["aliases"] = plan.aliases
  arrays = {"saved": saved, "final": gather(after), "grads": gather(grads),
            "trained": gather(state)}
  if process_id == 0:
    np.savez(out, **{f"{k}{i}": a for k, v in arrays.items() for i, a in enumerate(v)})
  report["losses"].append(float(multihost_utils.process_allgather(loss, tiled=True)))
  report["built"] = sorted(set(BUILT))
  print("RESULT " + json.dumps(report), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[4], sys.argv[5])
