"""donate._symm.check, and donate.symm.check_placement on top of it: the whole placement check of one
program with plain `jax.jit`, on 8 CPU devices (the GPU targets are in tests/test_gpu_aot.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import donate
from donate import symm
from donate._symm import check

MESH = Mesh(np.array(jax.devices()[:8]), ("x",))


def step(params, x):
  def body(w, v):
    g = donate.with_symmetric(jnp.sin(v) * w, "x")
    return w - 0.1 * lax.psum(g, "x")

  new = jax.shard_map(body, mesh=MESH, in_specs=(P(), P("x")), out_specs=P(), check_vma=False)(
      params["w"], x)
  return {"b": params["b"] + 1, "w": new}, x * 2


ARGS = ({"b": jnp.zeros(2), "w": jnp.ones(4)}, jnp.ones((8, 4)))


def test_a_cpu_program_is_compiled_without_options_and_read_back():
  found = check.check_placement(step, *ARGS, donate_argnums=0)
  assert found.platform == "cpu" and found.policy.options == {}
  (record,) = found.report.records
  assert not record.placed and record.kind == "all-reduce"
  assert found.memory.nbytes == 0 and found.planned_bytes == 0
  assert found.annotated_bytes == 16  # one float32[4] per device
  assert found.aliases == 2  # params donated: b and w alias their updates
  assert found.sizing("step") == symm.SizingRow("step", 0, 0, 16)
  table = found.collectives_table()
  assert ("all-reduce", 16, "default", "yes") in [row[1:] for row in table]


def test_donate_argnums_counts_whole_pytrees():
  found = check.check_placement(step, *ARGS, donate_argnums=(0, 1))
  assert found.aliases == 3
  assert check.check_placement(step, *ARGS).aliases == 0


def test_shardings_come_from_arguments_and_jit_keywords():
  sharded = jax.device_put(jnp.ones(8), NamedSharding(MESH, P("x")))
  out = NamedSharding(MESH, P())
  found = check._shardings([sharded, 1.0], {"out_shardings": out, "in_shardings": None})
  assert found == [sharded.sharding, None, out]


def test_disabled_placement_and_the_result_of_the_compiled_program():
  found = check.check_placement(step, *ARGS, enabled=False)
  assert found.policy.options == {} and found.policy.routes == ()
  new, y = found.compiled(*jax.tree.leaves(ARGS))  # the marked program takes the leaves
  expected, _ = step(*ARGS)
  np.testing.assert_allclose(new["w"], expected["w"], rtol=1e-6)
  np.testing.assert_array_equal(y, ARGS[1] * 2)


@pytest.mark.parametrize("plan", [True, False])
def test_the_public_check_adds_the_planners_pool(plan):
  found = symm.check_placement(step, *ARGS, donate_argnums=0, plan=plan)
  pools = donate.planner.plan_memory(step, *ARGS).collective_memory_bytes
  assert pools >= 16 and found.planned_bytes == (pools if plan else 0)
  assert found.report.records == check.check_placement(step, *ARGS).report.records
