"""One process of the two-process memory profile test in `test_memory_doctor.py` (a script).

Usage: python _multiprocess_profile_worker.py PROCESS_ID PORT. Joins a two-process JAX job on
127.0.0.1:PORT with two CPU devices per process, profiles a data-parallel step over the global
mesh of four devices (`jax.jit` and `donate.jit`) and prints one JSON line with the profile's
figures beside the compiled program's `memory_analysis()`.
"""

import json
import sys


def main(process_id: int, port: int) -> None:
  import jax  # noqa: PLC0415 - configured before anything else touches JAX
  from _multiprocess_step import join  # noqa: PLC0415

  join(process_id, port)
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  import donate  # noqa: PLC0415

  mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  batch = jax.sharding.NamedSharding(mesh, jax.P("data"))
  replicated = jax.sharding.NamedSharding(mesh, jax.P())

  def step(params, x):  # data parallel: the batch split over both processes' devices
    def loss(p):
      h = jnp.tanh(x @ p["w1"])
      return jnp.mean((h @ p["w2"]) ** 2)
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)

  def global_array(host, sharding):
    return jax.jit(lambda a: a * 1.0)(
        jax.make_array_from_callback(host.shape, sharding, lambda index: host[index]))

  d = 128
  params = {"w1": global_array(np.full((d, 2 * d), 0.01, np.float32), replicated),
            "w2": global_array(np.full((2 * d, d), 0.01, np.float32), replicated)}
  x = global_array(np.ones((64, d), np.float32), batch)
  report = {"process_index": jax.process_index(), "devices": jax.device_count()}
  for name, jitted in (("jax.jit", jax.jit(step, donate_argnums=0)),
                       ("donate.jit", donate.jit(step, donate_argnums=0))):
    profile = donate.memory_profile(jitted, params, x)
    stats = jitted.lower(params, x).compile().memory_analysis()
    report[name] = {
      "profile": profile.memory_analysis_figures(),
      "compiled": {"argument": stats.argument_size_in_bytes, "output": stats.output_size_in_bytes,
                   "alias": stats.alias_size_in_bytes, "temp": stats.temp_size_in_bytes},
      "xla_peak": [profile.xla_peak_bytes, stats.peak_memory_in_bytes],
      "peak": profile.peak_bytes, "reserved": profile.reserved_bytes,
      "categories": {e.path: e.category for e in profile.at_peak if e.kind == "argument"},
      "x_bytes": x.addressable_shards[0].data.nbytes,
    }
  print("RESULT " + json.dumps(report), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]))
