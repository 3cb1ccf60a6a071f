"""donate._symm.trace: each mark traced back to the buffer that materialises it, and forward to
the collectives it reaches; the notes for buffers that waste collective memory."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from donate._base.errors import SymmetricMemoryWarning
from donate._symm import prim, trace

MESH = Mesh(np.array(jax.devices()[:2]), ("i",))
X = jnp.arange(16.0).reshape(4, 4)


pytestmark = pytest.mark.usefixtures("no_symmetric_requirements")


def mark(x, kind="symm_mem", source="with_symmetric"):
  return prim.mark(x, "i", kind=kind, source=source)


def buffers(body, out_specs=P()):
  f = jax.shard_map(body, mesh=MESH, in_specs=P("i"), out_specs=out_specs)
  return trace.comm_buffers(jax.make_jaxpr(f)(X))


def test_views_lead_back_to_the_producer_and_forward_to_the_collective():
  (buf,) = buffers(lambda v: lax.psum(mark(jnp.exp(v).T.reshape(8).astype(jnp.bfloat16)), "i"))
  assert (buf.producer, buf.shape, buf.dtype, buf.nbytes) == ("exp", (2, 4), "float32", 32)
  assert buf.feeds_collective and len(buf.collectives) == 1
  assert buf.collectives[0] in {"psum", "psum_invariant", "psum2"}
  assert buf.path == ("shard_map",) and buf.out_index == 0 and buf.eqn.primitive.name == "exp"
  assert not buf.custom_op and not buf.is_output and buf.over_allocated_bytes == 0


def test_a_mark_on_a_value_from_a_nested_jit_reaches_the_op_inside():
  (buf,) = buffers(lambda v: lax.psum(mark(jax.jit(lambda t: jnp.sin(t) + 1)(v)), "i"))
  assert (buf.producer, buf.path) == ("add", ("shard_map", "jit"))


def test_arguments_constants_and_literals_are_named():
  bufs = buffers(lambda v: lax.psum(mark(v), "i"))
  assert [b.producer for b in bufs] == ["argument"]
  closed = jax.make_jaxpr(lambda: mark(jnp.float32(2.0)), axis_env=[("i", 1)])()
  assert [b.producer for b in trace.comm_buffers(closed)] in (["literal"], ["constant"])


def test_a_value_marked_twice_is_one_buffer_with_both_sources():
  def body(v):
    y = jnp.sin(v)
    return lax.psum(mark(y), "i") + lax.psum(mark(y, source="requires_symmetric"), "i")

  (buf,) = buffers(body)
  assert buf.sources == ("with_symmetric", "requires_symmetric")


def test_custom_op_outputs_are_all_symmetric_and_the_unneeded_ones_over_allocated():
  @jax.custom_vjp
  def two(v):
    return jnp.sin(v), jnp.cos(v) * 3

  two.defvjp(lambda v: (two(v), v), lambda v, g: (g[0] + g[1],))

  def body(v):
    a, b = two(v)
    return lax.psum(mark(a), "i") + b

  bufs = buffers(body, out_specs=P("i"))
  assert [(b.custom_op, b.out_index, b.feeds_collective) for b in bufs] == [
      (True, 0, True), (True, 1, False)]
  assert [b.over_allocated_bytes for b in bufs] == [0, bufs[1].nbytes]
  assert trace.is_custom_op(bufs[0].eqn)


def test_comm_buffer_report_notes_and_warnings():
  def body(v):
    y = mark(jnp.sin(v))
    return y, lax.psum(mark(jnp.cos(v)), "i")

  bufs = buffers(body, out_specs=(P("i"), P()))
  notes = trace.comm_buffer_report(bufs)
  assert len(notes) == 2
  assert "sin output float32[2, 4]" in notes[0] and "never reaches a collective" in notes[0]
  assert "program output" in notes[1]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert trace.comm_buffer_report(bufs, warn=True) == notes
  assert [w.category for w in caught] == [SymmetricMemoryWarning] * 2
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    trace.comm_buffer_report(bufs)  # no warning unless asked


def test_str_is_one_line_per_buffer():
  (buf,) = buffers(lambda v: lax.psum(mark(jnp.sin(v)), "i"))
  text = str(buf)
  assert text.startswith("symm_mem@i float32[2,4] 32 B <- sin at ")
  assert text.endswith("; feeds " + ", ".join(buf.collectives))
  assert "test_symm_trace.py:" in buf.source_info
