"""The donated, sharded step run by `_multiprocess_worker.py` and, for reference, in one process;
`join`, how every two-process worker joins its job."""

import jax
import jax.numpy as jnp
import numpy as np

N = 16


def join(process_id: int, port: int) -> None:
  """Joins a two-process JAX job on 127.0.0.1:`port`: two CPU devices per process, gloo
  collectives (configured before anything touches JAX's devices)."""
  jax.config.update("jax_num_cpu_devices", 2)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                             process_id=process_id, initialization_timeout=60)


def initial():
  """The host data both processes (and the single-process reference) start from."""
  w = np.linspace(-1.0, 1.0, N, dtype=np.float32)
  x = np.arange(N, dtype=np.float32) / N
  return w, x


def make_step(mesh):
  """An SGD-like step: a psum inside shard_map and a global reduction over the sharded axis."""
  row = jax.P("d")

  def local(w, x):
    return jax.lax.psum(jnp.sum(w * x), "d")

  dot = jax.shard_map(local, mesh=mesh, in_specs=(row, row), out_specs=jax.P())

  def step(w, x):
    loss = jnp.sum((w * x - 0.5) ** 2)  # a reduction over every process's shards
    return w - 0.1 * dot(w, x) * x, loss

  return step


def make_swapped_step(mesh):
  """A momentum step whose outputs come in the other order than its inputs: `(w, m)` in,
  `(m, w)` out. `jax.jit` pairs first come, first served (w -> out[0], m -> out[1]); dataflow
  pairing puts each new value in its own old buffer (m -> out[0], w -> out[1])."""
  row = jax.P("d")
  dot = jax.shard_map(lambda w, x: jax.lax.psum(jnp.sum(w * x), "d"), mesh=mesh,
                      in_specs=(row, row), out_specs=jax.P())

  def step(w, m, x):
    m = 0.9 * m + dot(w, x) * x
    return m, w - 0.1 * m

  return step
