"""donate.jit with symmetric-memory annotations: marks reach the lowered module, the plan reports
them, and GPU-only compile options never reach a CPU program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import donate
from donate._symm import trace, xla

MESH = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
ROWS = jax.sharding.NamedSharding(MESH, jax.P("x"))


def rows():
  return jax.device_put(jnp.arange(64.0).reshape(8, 8), ROWS)


def all_reduce(body):
  return lambda a: jax.shard_map(body, mesh=MESH, in_specs=jax.P("x"), out_specs=jax.P())(a)


pytestmark = pytest.mark.usefixtures("no_symmetric_requirements")


def test_with_symmetric_under_donate_jit_is_marked_and_reported():
  f = all_reduce(lambda b: lax.psum(donate.with_symmetric(jnp.sin(b), "x"), "x"))
  g = donate.jit(f)
  text = g.lower(rows()).as_text()
  assert 'donate.symmetric' in text and 'donate.group = "x"' in text
  plan = g.plan(rows())
  assert plan.collective_memory_bytes == 32  # one float32[1, 8] block per device
  assert "symmetric memory: 32 B" in str(plan)
  np.testing.assert_allclose(g(rows()), jax.jit(f)(rows()), rtol=1e-6)


def test_requires_symmetric_is_applied_by_donate_jit_without_user_calls():
  f = all_reduce(lambda b: lax.psum(b * 2.0, "x"))
  assert "donate.symmetric" not in donate.jit(f).lower(rows()).as_text()
  donate.requires_symmetric(lax.psum)
  g = donate.jit(f)  # a new function traces again and sees the requirement
  assert "donate.symmetric" in g.lower(rows()).as_text()
  assert g.plan(rows()).collective_memory_bytes == 32
  np.testing.assert_allclose(g(rows()), jax.jit(f)(rows()))


def test_gpu_compile_options_only_for_gpu_platforms():
  f = all_reduce(lambda b: lax.psum(donate.with_symmetric(b + 1.0, "x"), "x"))
  closed = jax.make_jaxpr(f)(rows())
  bufs = trace.comm_buffers(closed)
  assert xla.gpu_compile_options("cuda", bufs)
  assert xla.gpu_compile_options("cpu", bufs) == {}
  assert xla.target_platform([rows().sharding], "cuda") == "cpu"
  # On CPU the program compiles and runs with no GPU option added.
  g = donate.jit(f)
  compiled = g.lower(rows()).compile()
  assert compiled.runtime_executable() is not None and "xla_gpu" not in str(compiled.plan)
  np.testing.assert_allclose(g(rows()), jax.jit(f)(rows()))


def test_donation_and_symmetric_marks_together():
  def body(b):
    b = donate.donate_buffer(b)
    y = donate.with_symmetric(b * 2.0, "x")
    return b + lax.psum(y, "x")

  f = lambda a: jax.shard_map(body, mesh=MESH, in_specs=jax.P("x"), out_specs=jax.P("x"))(a)
  g = donate.jit(f)
  a = rows()
  expect = jax.jit(f)(rows())
  out = g(a)
  assert a.is_deleted()
  np.testing.assert_allclose(out, expect)
