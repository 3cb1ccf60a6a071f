"""`donate.jit` under concurrency (issue 7): eight threads on one function, two JAX processes.

Threads: each thread owns its parameters (donated) and data (not donated), with values far apart
from every other thread's, so taking another thread's buffer would show up in the numbers, in
`is_deleted()` or in the buffer addresses. Processes: two JAX processes on 127.0.0.1 with gloo CPU
collectives run a donated, sharded step (a `shard_map` psum and a reduction over both processes'
shards) and are compared with the same step run here in one process.
"""

import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _multiprocess_step import initial, make_step, run_two  # noqa: E402

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

N_THREADS, STEPS = 8, 200


def on_device(host):
  return jax.jit(jnp.copy)(jnp.asarray(host, jnp.float32))


def thread_step(params, x):
  scale = x.shape[0] // 8  # the two signatures run different programs
  return {k: p * 0.5 + x * scale for k, p in params.items()}, jnp.sum(params["w"] * x)


def reference(tid, n):
  """The thread's final parameters and last sum, in numpy."""
  p = {"w": np.full(n, 1000.0 * tid, np.float32), "b": np.arange(n, dtype=np.float32)}
  x = np.full(n, float(tid + 1), np.float32)
  total = None
  for _ in range(STEPS):
    total = np.sum(p["w"] * x, dtype=np.float32)
    p = {k: (v * np.float32(0.5) + x * np.float32(n // 8)).astype(np.float32)
         for k, v in p.items()}
  return p, total


def run_threads(worker):
  """Runs worker(tid) on N_THREADS threads and waits for all of them (none may hang)."""
  threads = [threading.Thread(target=worker, args=(t,)) for t in range(N_THREADS)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not any(t.is_alive() for t in threads), "a thread hung"


def test_eight_threads_share_one_function_without_touching_each_others_buffers():
  f = donate.jit(thread_step, donate_argnums=0)
  barrier = threading.Barrier(N_THREADS)
  results, errors = {}, []

  def worker(tid):
    try:
      n = 8 if tid % 2 == 0 else 16  # two signatures with one tree structure
      params = {"w": on_device(np.full(n, 1000.0 * tid)), "b": on_device(np.arange(n))}
      x = on_device(np.full(n, float(tid + 1)))
      witness = on_device(np.full(n, -float(tid)))  # never passed: must never be touched
      barrier.wait()
      reused = 0
      for _ in range(STEPS):
        old = params
        pointers = {k: v.unsafe_buffer_pointer() for k, v in old.items()}
        params, total = f(params, x)
        assert all(v.is_deleted() for v in old.values())
        assert not x.is_deleted() and not witness.is_deleted()
        reused += all(params[k].unsafe_buffer_pointer() == pointers[k] for k in pointers)
      results[tid] = (jax.tree.map(np.asarray, params), float(total), np.asarray(x),
                      np.asarray(witness), reused)
    except BaseException as e:  # noqa: BLE001 - reported below with the thread id
      errors.append((tid, repr(e)))
      barrier.abort()

  run_threads(worker)
  assert not errors, errors
  for tid, (params, total, x, witness, reused) in results.items():
    n = x.shape[0]
    want, want_total = reference(tid, n)
    for k in ("w", "b"):
      np.testing.assert_allclose(params[k], want[k], rtol=1e-6, err_msg=f"thread {tid} {k}")
    np.testing.assert_allclose(total, want_total, rtol=1e-6, err_msg=f"thread {tid}")
    np.testing.assert_array_equal(x, np.full(n, float(tid + 1)))
    np.testing.assert_array_equal(witness, np.full(n, -float(tid)))
    assert reused == STEPS, f"thread {tid}: outputs took over the inputs' buffers {reused} times"
  assert len(results) == N_THREADS
  assert f.trace_count == 2  # one trace per signature, whatever the interleaving


def test_threads_with_donated_and_shared_arguments_and_duplicates():
  """A shared, non-donated argument read by every thread stays alive; a thread that passes one
  buffer twice gets a DonationError and loses nothing, while the others carry on."""
  f = donate.jit(lambda acc, shared: acc + shared, donate_argnums=0)
  shared = on_device(np.ones(8))
  barrier = threading.Barrier(N_THREADS)
  outcomes, errors = {}, []

  def worker(tid):
    try:
      acc = on_device(np.full(8, 100.0 * tid))
      barrier.wait()
      for step in range(STEPS):
        if tid == 3 and step == STEPS // 2:
          dup = on_device(np.ones(8))
          try:
            f(dup, dup)
          except donate.DonationError:
            assert not dup.is_deleted()
          else:
            raise AssertionError("the duplicate was not caught")
        acc = f(acc, shared)
      outcomes[tid] = np.asarray(acc)
    except BaseException as e:  # noqa: BLE001
      errors.append((tid, repr(e)))
      barrier.abort()

  run_threads(worker)
  assert not errors, errors
  for tid, acc in outcomes.items():
    np.testing.assert_array_equal(acc, np.full(8, 100.0 * tid + STEPS))
  assert not shared.is_deleted()
  np.testing.assert_array_equal(np.asarray(shared), np.ones(8))
  assert f.trace_count == 1


# ---- two processes ----------------------------------------------------------------------------

def single_process_reference():
  """The same three steps on four of this process's devices."""
  mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])
  row = jax.sharding.NamedSharding(mesh, jax.P("d"))
  w_host, x_host = initial()
  f = donate.jit(make_step(mesh), donate_argnums=0)
  w = jax.device_put(jnp.asarray(w_host), row)
  x = jax.device_put(jnp.asarray(x_host), row)
  losses = []
  for _ in range(3):
    w, loss = f(w, x)
    losses.append(float(loss))
  return np.asarray(w), losses


def test_two_jax_processes_run_a_donated_sharded_step_with_collectives():
  reports = run_two("_multiprocess_worker.py")
  want_w, want_losses = single_process_reference()
  assert sorted(r["process_index"] for r in reports) == [0, 1]
  for r in reports:
    assert r["devices"] == 4 and r["local_devices"] == 2
    assert r["actions"] == ["aliased", "kept"]
    assert r["deleted"] == [True, True, True]  # the donated input, on both processes
    assert r["x_alive"] == [True, True, True]
    assert r["same_buffers"] == [True, True, True]  # each local shard reused in place
    assert r["trace_count"] == 1
    np.testing.assert_allclose(r["losses"], want_losses, rtol=1e-5)
    np.testing.assert_allclose(r["w"], want_w, rtol=1e-5, atol=1e-6)
  # And the step does something: w moved.
  assert not np.allclose(want_w, initial()[0])
  for r in reports:  # the swapped momentum step: dataflow pairs over both processes
    s = r["swapped"]
    assert s["aliases"] == {"out[0]": "m", "out[1]": "w"}
    assert s["hlo_alias"] and s["m_in_place"] and s["w_in_place"]
    assert s["deleted"] == [True, True] and s["x_alive"]
    np.testing.assert_allclose(s["got"], s["want"], rtol=1e-6)
