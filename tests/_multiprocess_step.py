"""The donated, sharded step run by `_multiprocess_worker.py` and, for reference, in one process;
`join`, how every two-process worker joins its job, and `run_two`, how a test runs one."""

import json
import os
import socket
import subprocess
import sys
import tempfile

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


def on_device(host, sharding):
  """The global array of `host` with `sharding`, computed on device: a CPU array made from host
  memory may share it, and cannot be donated."""
  return jax.jit(lambda a: a * 1.0)(
    jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
  )


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


def run_two(script: str, *args: str, timeout: float = 180) -> list[dict]:
  """Runs `script` (a worker in this folder) as processes 0 and 1 of a two-process job on a free
  port of 127.0.0.1 (`script ID PORT *args`), each stopped after `timeout` seconds; returns the
  JSON report each printed on its one `RESULT ` line, in process order. Their output goes to
  files, not pipes: a worker blocked on a full pipe would hold its peer at JAX's barriers."""
  import donate  # noqa: PLC0415  (a worker imports this module before it joins)

  here = os.path.dirname(os.path.abspath(__file__))
  home = os.path.dirname(os.path.dirname(donate.__file__))  # the checkout, or an installed wheel's
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env["PYTHONPATH"] = os.pathsep.join([home, here, env.get("PYTHONPATH", "")])
  env.pop("XLA_FLAGS", None)
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  with tempfile.TemporaryDirectory() as logs:
    files = [open(os.path.join(logs, f"{k}.log"), "w+") for k in range(2)]  # noqa: SIM115
    procs = [subprocess.Popen([sys.executable, os.path.join(here, script), str(k), str(port),
                               *args], env=env, cwd=here, stdout=f, stderr=subprocess.STDOUT)
             for k, f in enumerate(files)]  # fmt: skip
    try:
      for p in procs:
        p.wait(timeout=timeout)
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
          p.wait()
    reports = []
    for p, f in zip(procs, files):
      f.seek(0)
      out = f.read()
      f.close()
      lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
      assert p.returncode == 0 and len(lines) == 1, out[-3000:]
      reports.append(json.loads(lines[0][len("RESULT "):]))
  return reports
