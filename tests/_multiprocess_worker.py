"""One process of the two-process test in `test_threads_processes.py` (run as a script).

Usage: python _multiprocess_worker.py PROCESS_ID PORT. Joins a two-process JAX job on
127.0.0.1:PORT with two CPU devices per process and gloo collectives, runs a donated, sharded step
with collectives under `donate.jit` three times, and prints one JSON line with what it saw.
"""

import json
import sys


def main(process_id: int, port: int) -> None:
  import jax  # noqa: PLC0415 - configured before anything else touches JAX
  from _multiprocess_step import join  # noqa: PLC0415

  join(process_id, port)
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from _multiprocess_step import N, initial, make_step, on_device  # noqa: PLC0415
  from jax.experimental import multihost_utils  # noqa: PLC0415

  import donate  # noqa: PLC0415

  mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  row = jax.sharding.NamedSharding(mesh, jax.P("d"))
  w_host, x_host = initial()

  def global_array(host):
    return on_device(host, row)

  f = donate.jit(make_step(mesh), donate_argnums=0)
  w, x = global_array(w_host), global_array(x_host)
  plan = f.plan(w, x)
  report = {"process_index": jax.process_index(), "devices": jax.device_count(),
            "local_devices": jax.local_device_count(),
            "actions": [d.action for d in plan.decisions], "losses": [], "deleted": [],
            "x_alive": [], "same_buffers": []}
  for _ in range(3):
    before = [s.data.unsafe_buffer_pointer() for s in w.addressable_shards]
    new_w, loss = f(w, x)
    after = [s.data.unsafe_buffer_pointer() for s in new_w.addressable_shards]
    report["deleted"].append(w.is_deleted())
    report["x_alive"].append(not x.is_deleted())
    report["same_buffers"].append(before == after)
    report["losses"].append(float(multihost_utils.process_allgather(loss, tiled=True)))
    w = new_w
  report["w"] = np.asarray(multihost_utils.process_allgather(w, tiled=True)).tolist()
  report["trace_count"] = f.trace_count
  report["swapped"] = swapped(mesh, row, global_array, w_host, x_host)
  assert w.shape == (N,) and jnp.isfinite(loss)
  print("RESULT " + json.dumps(report), flush=True)
  jax.distributed.shutdown()


def swapped(mesh, row, global_array, w_host, x_host):
  """The swapped momentum step, donated, under donate.jit: its planned pairs, the compiled
  aliases, whether each output lives in its planned input's local shards, and the results
  beside jax.jit's (undonated, on copies)."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from _multiprocess_step import make_swapped_step  # noqa: PLC0415
  from jax.experimental import multihost_utils  # noqa: PLC0415

  import donate  # noqa: PLC0415

  step = make_swapped_step(mesh)
  w, m, x = global_array(w_host), global_array(w_host * 0.5), global_array(x_host)
  want = jax.jit(step)(global_array(w_host), global_array(w_host * 0.5), x)
  f = donate.jit(step, donate_argnums=(0, 1), copy_threshold=0)  # N is small
  compiled = f.lower(w, m, x).compile()
  plan = f.plan(w, m, x)
  pointers = lambda a: [s.data.unsafe_buffer_pointer() for s in a.addressable_shards]
  pw, pm = pointers(w), pointers(m)
  new_m, new_w = f(w, m, x)
  gather = lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True)).tolist()
  # plan.aliases are read back from the compiled input_output_alias (`_compiled.realize`).
  return {"aliases": plan.aliases, "hlo_alias": "input_output_alias=" in compiled.as_text(),
          "m_in_place": pointers(new_m) == pm, "w_in_place": pointers(new_w) == pw,
          "deleted": [w.is_deleted(), m.is_deleted()], "x_alive": not x.is_deleted(),
          "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
          "got": [gather(new_m), gather(new_w)], "want": [gather(want[0]), gather(want[1])]}


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]))
