"""Symmetric-memory annotations on 8 virtual CPU devices: numerics, marks, trace-back, lowering."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from donate import symm
from donate._base.errors import DonationError
from donate._symm import prim, trace

N = 8
MESH = Mesh(np.array(jax.devices()[:N]), ("i",))
X = jnp.arange(N * 8, dtype=jnp.float32).reshape(N * 2, 4) / 7.0


@pytest.fixture(autouse=True)
def _no_registrations():
  symm.clear_requirements()
  yield
  symm.clear_requirements()


def smap(body, out_specs=P()):
  return jax.shard_map(body, mesh=MESH, in_specs=P("i"), out_specs=out_specs)


def marks(closed):
  """Params of every symmetric equation, at any depth."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive is prim.symmetric_p:
        found.append(dict(eqn.params))
      for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
          if isinstance(item, jax.extend.core.ClosedJaxpr):
            walk(item.jaxpr)
          elif isinstance(item, jax.extend.core.Jaxpr):
            walk(item)

  walk(closed.jaxpr)
  return found


def run_marked(fun, *args):
  """What donate.jit does: trace, mark_required, evaluate inside jax.jit."""
  closed = symm.mark_required(jax.make_jaxpr(fun)(*args))
  return jax.jit(lambda *a: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *a))(*args), closed


def ring_allreduce(x, axis_name):
  """A user's own collective: sum over the ring with ppermute."""
  perm = [(k, (k + 1) % N) for k in range(N)]
  total, moving = x, x
  for _ in range(N - 1):
    moving = lax.ppermute(moving, axis_name, perm)
    total = total + moving
  return total


COLLECTIVES = {
    "psum": (lambda x: lax.psum(x, "i"), P()),
    "all_gather": (lambda x: lax.all_gather(x, "i", tiled=True), P("i")),
    "psum_scatter": (lambda x: lax.psum_scatter(x, "i", scatter_dimension=1, tiled=True), P("i")),
    "ppermute": (lambda x: lax.ppermute(x, "i", [(k, (k + 3) % N) for k in range(N)]), P("i")),
    "all_to_all": (lambda x: lax.all_to_all(x.reshape(N, -1), "i", 0, 0, tiled=True), P("i")),
    "custom": (lambda x: ring_allreduce(x, "i"), P("i")),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_numerics_identical_with_and_without_with_symmetric(name):
  collective, out_specs = COLLECTIVES[name]
  x = jnp.tile(X, (1, 2))  # (16, 8): per device (2, 8), scatter dim divisible by 8.
  plain = jax.jit(smap(lambda v: collective(jnp.sin(v) * 2), out_specs))
  marked = jax.jit(smap(lambda v: collective(symm.with_symmetric(jnp.sin(v) * 2, "i")),
                        out_specs))
  np.testing.assert_array_equal(marked(x), plain(x))
  assert [m["source"] for m in marks(marked.trace(x).jaxpr)] == ["with_symmetric"]
  (buf,) = symm.comm_buffers(marked.trace(x).jaxpr)
  assert buf.producer == "mul" and buf.feeds_collective and buf.group == ("i",)


@pytest.mark.parametrize("name", ["psum", "all_gather", "psum_scatter", "ppermute", "all_to_all"])
def test_requires_symmetric_marks_jax_collectives_without_user_calls(name):
  collective, out_specs = COLLECTIVES[name]
  fun = smap(lambda v: collective(jnp.cos(v)), out_specs)
  x = jnp.tile(X, (1, 2))
  closed = jax.make_jaxpr(fun)(x)
  assert symm.mark_required(closed) is closed and symm.comm_buffers(closed) == ()
  jax_fn = {"psum": lax.psum, "all_gather": lax.all_gather, "psum_scatter": lax.psum_scatter,
            "ppermute": lax.ppermute, "all_to_all": lax.all_to_all}[name]
  assert symm.requires_symmetric(jax_fn) is jax_fn
  out, marked = run_marked(fun, x)
  (buf,) = symm.comm_buffers(marked)
  assert (buf.producer, buf.sources, buf.feeds_collective) == ("cos", ("requires_symmetric",), True)
  assert buf.var is buf.eqn.outvars[0] and buf.eqn.primitive.name == "cos"
  assert buf.jaxpr is marked.eqns[0].params["jaxpr"]
  np.testing.assert_array_equal(out[0], jax.jit(fun)(x))
  symm.clear_requirements()
  assert symm.mark_required(closed) is closed


def test_requires_symmetric_reaches_scan_and_nested_jit_bodies():
  symm.requires_symmetric(lax.psum)

  def body(v):
    inner = jax.jit(lambda a: lax.psum(jnp.exp(a), "i"))
    carry, _ = lax.scan(lambda c, _: (c + lax.psum(jnp.tanh(c), "i") / N, None), v, None,
                        length=2)
    return inner(v) + carry

  fun = smap(body, P("i"))
  out, marked = run_marked(fun, X)
  bufs = symm.comm_buffers(marked)
  assert sorted((b.producer, b.path) for b in bufs) == [
      ("exp", ("shard_map", "jit")), ("tanh", ("shard_map", "scan"))]
  np.testing.assert_allclose(out[0], jax.jit(fun)(X), rtol=1e-6)


def test_requires_symmetric_wraps_a_user_collective_and_is_a_decorator():
  wrapped = symm.requires_symmetric(ring_allreduce)
  assert wrapped is not ring_allreduce

  @symm.requires_symmetric(argnums=1, kind="nccl")
  def scaled_allreduce(scale, x, *, axis_name):
    return ring_allreduce(x, axis_name) * scale

  fun = smap(lambda v: wrapped(jnp.sin(v), axis_name="i") + scaled_allreduce(2.0, v, axis_name="i"),
             P("i"))
  closed = jax.make_jaxpr(fun)(X)
  bufs = symm.comm_buffers(closed)
  assert [(b.producer, b.kind, b.sources) for b in bufs] == [
      ("sin", "symm_mem", ("requires_symmetric",)), ("argument", "nccl", ("requires_symmetric",))]
  assert all(b.feeds_collective for b in bufs)
  plain = smap(lambda v: ring_allreduce(jnp.sin(v), "i") + ring_allreduce(v, "i") * 2.0, P("i"))
  np.testing.assert_array_equal(jax.jit(fun)(X), jax.jit(plain)(X))
  assert symm.registered_requirements() == {}  # user collectives are wrapped, not registered.


@jax.custom_vjp
def two_outputs(x):
  return jnp.sin(x), jnp.cos(x) * 3.0


two_outputs.defvjp(lambda x: (two_outputs(x), x),
                   lambda x, cts: (cts[0] * jnp.cos(x) - cts[1] * 3.0 * jnp.sin(x),))


def test_context_makes_all_outputs_of_a_custom_op_symmetric_and_reports_over_allocation():
  def body(v):
    with symm.symmetric_memory("i"):
      a, b = two_outputs(v)
    return lax.psum(a, "i") + b

  fun = smap(body, P("i"))
  out, marked = run_marked(fun, X)
  bufs = symm.comm_buffers(marked)
  assert [(b.custom_op, b.out_index, b.feeds_collective, b.sources) for b in bufs] == [
      (True, 0, True, ("context",)), (True, 1, False, ("context",))]
  assert bufs[0].producer.startswith("custom_vjp")
  assert [b.over_allocated_bytes for b in bufs] == [0, 2 * 4 * 4]
  report = trace.comm_buffer_report(bufs)
  assert any("8 bytes" not in n and "32 bytes over-allocated" in n for n in report)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trace.comm_buffer_report(bufs, warn=True)
  assert [w.category for w in caught] == [symm.SymmetricMemoryWarning] * len(report)
  assert [m["source"] for m in marks(marked)] == ["context", "context"]
  np.testing.assert_array_equal(out[0], jax.jit(fun)(X))
  # The same buffers are found before mark_required makes the context explicit.
  assert [b.out_index for b in symm.comm_buffers(jax.make_jaxpr(fun)(X))] == [0, 1]


def test_context_on_builtin_ops_marks_each_output():
  def body(v):
    with symm.symmetric_memory("i", kind="ll128"):
      y = jnp.sin(v) + 1.0
    return lax.psum(y, "i")

  _, marked = run_marked(smap(body), X)
  bufs = symm.comm_buffers(marked)
  assert [(b.producer, b.kind, b.custom_op, b.feeds_collective) for b in bufs] == [
      ("sin", "ll128", False, False), ("add", "ll128", False, True)]


def test_trace_back_goes_through_views_to_the_materialising_producer():
  def body(v):
    y = jnp.sin(v)
    z = y.reshape(4, 2).astype(jnp.bfloat16).T[None]
    return lax.psum(symm.with_symmetric(z, "i"), "i")

  closed = jax.make_jaxpr(smap(body))(X)
  (buf,) = symm.comm_buffers(closed)
  inner = closed.eqns[0].params["jaxpr"]
  sin_eqn = next(e for e in inner.eqns if e.primitive.name == "sin")
  assert buf.producer == "sin" and buf.var is sin_eqn.outvars[0] and buf.jaxpr is inner
  assert (buf.shape, buf.dtype, buf.nbytes) == ((2, 4), "float32", 32)
  assert buf.source_info.startswith(__file__) and buf.collectives == ("psum_invariant",)


def test_trace_back_through_nested_jit_to_arguments_and_custom_ops():
  def body(v):
    inner = jax.jit(lambda a: jnp.exp(a).reshape(-1))(v)
    a, _ = two_outputs(v)
    marked = symm.with_symmetric((inner, v.T, a), "i")
    return lax.psum(marked[0].sum() + marked[1].sum() + marked[2].sum(), "i")

  bufs = symm.comm_buffers(jax.make_jaxpr(smap(body))(X))
  assert [(b.producer, b.path, b.custom_op, b.over_allocated_bytes) for b in bufs] == [
      ("exp", ("shard_map", "jit"), False, 0), ("argument", ("shard_map",), False, 0),
      (bufs[2].producer, ("shard_map",), True, 0), (bufs[2].producer, ("shard_map",), True, 32)]
  assert bufs[2].producer.startswith("custom_vjp")
  assert bufs[1].nbytes == 2 * 4 * 4  # the per-device shard, not the global argument.
  assert not any(b.feeds_collective for b in bufs)  # they feed a sum, not the collective.


def test_program_outputs_and_values_not_reaching_a_collective_are_reported():
  def body(v):
    y = symm.with_symmetric(jnp.sin(v), "i")
    return y, lax.psum(symm.with_symmetric(jnp.cos(v), "i"), "i")

  fun = jax.shard_map(body, mesh=MESH, in_specs=P("i"), out_specs=(P("i"), P()))
  bufs = symm.comm_buffers(jax.make_jaxpr(fun)(X))
  assert [(b.producer, b.is_output, b.feeds_collective) for b in bufs] == [
      ("sin", True, False), ("cos", False, True)]
  report = trace.comm_buffer_report(bufs)
  assert len(report) == 2 and "never reaches a collective" in report[0]
  assert "program output" in report[1]


def test_marking_is_visible_in_the_lowered_module():
  fun = jax.jit(smap(lambda v: lax.psum(symm.with_symmetric(jnp.sin(v), "i"), "i")))
  text = fun.lower(X).as_text()
  assert 'donate.symmetric = "symm_mem"' in text and 'donate.group = "i"' in text
  assert re.search(r'stablehlo\.sine %\w+ \{mhlo\.frontend_attributes = \{[^}]*'
                   r'donate\.memory_space_color = "1"', text)  # on the producing op itself.
  assert "donate." not in jax.jit(smap(lambda v: lax.psum(jnp.sin(v), "i"))).lower(X).as_text()
  symm.requires_symmetric(lax.ppermute)
  closed = symm.mark_required(jax.make_jaxpr(smap(COLLECTIVES["ppermute"][0], P("i")))(X))
  replay = jax.jit(lambda a: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, a))
  text = replay.lower(X).as_text()  # the operand is an argument: a marked barrier carries it.
  assert re.search(r'optimization_barrier \{mhlo\.frontend_attributes = \{[^}]*'
                   r'donate\.source = "requires_symmetric"', text)


def test_unbound_axis_names_raise_a_clear_error():
  with pytest.raises(DonationError, match=r"axis name 'j'.*bound axis names 'i'"):
    jax.make_jaxpr(smap(lambda v: lax.psum(symm.with_symmetric(v, "j"), "i")))(X)
  with pytest.raises(DonationError, match=r"'i'.*none are bound"):
    jax.jit(lambda v: symm.with_symmetric(v, "i")).trace(X)
  with pytest.raises(DonationError, match="symmetric_memory uses axis name 'k'"):
    def body(v):
      with symm.symmetric_memory("k"):
        return jnp.sin(v)
    jax.make_jaxpr(smap(body, P("i")))(X)

  def outer(v):
    with symm.symmetric_memory("j"):
      return smap(lambda a: lax.psum(a, "i"))(v)
  with pytest.raises(DonationError, match="not bound at 'shard_map'"):
    symm.mark_required(jax.make_jaxpr(outer)(X))
  with pytest.raises(DonationError, match="axis name"):
    symm.with_symmetric(X, "")
  with pytest.raises(DonationError, match="argnums=0"):
    symm.requires_symmetric(lax.psum, argnums=1)


def test_grad_vmap_and_scan_through_annotated_code():
  def loss(w, marked):
    def body(v):
      def step(c, _):
        y = jnp.sin(c * w)
        y = symm.with_symmetric(y, "i") if marked else y
        return c + lax.psum(y, "i") / N, None
      return lax.psum(lax.scan(step, v, None, length=3)[0].sum(), "i")
    return smap(body)(X)

  g_marked, g_plain = jax.grad(loss)(0.5, True), jax.grad(loss)(0.5, False)
  np.testing.assert_allclose(g_marked, g_plain, rtol=1e-6)
  assert g_marked != 0.0
  jaxpr = jax.make_jaxpr(jax.grad(loss), static_argnums=1)(0.5, True)
  assert len(marks(jaxpr)) >= 1
  ws = jnp.array([0.1, 0.5, 0.9])
  np.testing.assert_allclose(jax.vmap(lambda w: loss(w, True))(ws),
                             jax.vmap(lambda w: loss(w, False))(ws), rtol=1e-6)
  fwd = jax.jvp(lambda w: loss(w, True), (0.5,), (1.0,))
  np.testing.assert_allclose(fwd[1], g_plain, rtol=1e-5)
  bufs = symm.comm_buffers(jax.make_jaxpr(lambda w: loss(w, True))(0.5))
  assert [(b.producer, b.path, b.feeds_collective) for b in bufs] == [
      ("sin", ("shard_map", "scan"), True)]


def test_vmap_with_a_named_axis_and_batching_rule():
  f = jax.vmap(lambda v: lax.psum(symm.with_symmetric(jnp.sin(v), "b"), "b"), axis_name="b")
  np.testing.assert_allclose(f(X), jax.vmap(lambda v: lax.psum(jnp.sin(v), "b"),
                                            axis_name="b")(X), rtol=1e-6)
  batched = jax.vmap(smap(lambda v: lax.psum(symm.with_symmetric(v, "i"), "i")))
  np.testing.assert_array_equal(batched(jnp.stack([X, 2 * X])),
                                jax.vmap(smap(lambda v: lax.psum(v, "i")))(jnp.stack([X, 2 * X])))


def test_eager_mode_is_untouched():
  assert symm.with_symmetric(X, "i") is X
  tree = {"a": X, "b": [X]}
  assert symm.with_symmetric(tree, ("i", "j")) is tree
  assert symm.requires_symmetric(lax.psum) is lax.psum
  eager = smap(lambda v: lax.psum(symm.with_symmetric(v, "i"), "i"))(X)  # no jax.jit
  np.testing.assert_array_equal(eager, smap(lambda v: lax.psum(v, "i"))(X))
  with symm.symmetric_memory("i"):
    inside = jnp.sin(X)
  np.testing.assert_array_equal(inside, jnp.sin(X))
