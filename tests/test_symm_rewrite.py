"""donate._symm.rewrite: `mark_required` makes registered collectives' operands and context outputs
explicit marks, at any depth, and changes nothing else."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from donate._base.errors import DonationError
from donate._symm import prim, registry
from donate._symm.rewrite import mark_required

MESH = Mesh(np.array(jax.devices()[:2]), ("i",))
X = jnp.arange(8.0).reshape(4, 2)


pytestmark = pytest.mark.usefixtures("no_symmetric_requirements")


def smap(body):
  return jax.shard_map(body, mesh=MESH, in_specs=P("i"), out_specs=P("i"))


def marks(jaxpr, depth=()):
  """(enclosing primitives, marked params) of every symmetric equation."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive is prim.symmetric_p:
      found.append((depth, eqn.params["axis_name"], eqn.params["kind"], eqn.params["source"]))
    for value in eqn.params.values():
      for item in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(item, "jaxpr", item)
        if isinstance(inner, jax.extend.core.Jaxpr):
          found += marks(inner, depth + (eqn.primitive.name,))
  return found


def run(closed, *args):
  return jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args)


def test_nothing_registered_and_no_context_returns_the_same_object():
  closed = jax.make_jaxpr(smap(lambda v: lax.ppermute(v, "i", [(0, 1), (1, 0)])))(X)
  assert mark_required(closed) is closed


def test_registered_collective_operands_are_marked_in_nested_bodies():
  registry.register({"ppermute"}, (0,), "nccl")
  perm = [(0, 1), (1, 0)]

  def body(v):
    v = jax.jit(lambda a: lax.ppermute(a * 2, "i", perm))(v)
    v, _ = lax.scan(lambda c, _: (lax.ppermute(c, "i", perm), None), v, None, length=2)
    return lax.cond(v.sum() > 0, lambda a: lax.ppermute(a, "i", perm), lambda a: a, v)

  closed = jax.make_jaxpr(smap(body))(X)
  marked = mark_required(closed)
  found = marks(marked.jaxpr)
  assert [m[1:] for m in found] == [(("i",), "nccl", "requires_symmetric")] * 3
  assert {m[0][-1] for m in found} == {"jit", "scan", "cond"}
  np.testing.assert_array_equal(run(marked, X)[0], run(closed, X)[0])


def test_registered_argnums_mark_only_those_operands():
  registry.register({"mul"}, (1,), "k")
  marked = mark_required(jax.make_jaxpr(lambda a, b: a * b)(1.0, 2.0))
  mul = marked.jaxpr.eqns[-1]
  assert mul.primitive.name == "mul"
  assert mul.invars[0] is marked.jaxpr.invars[0]  # operand 0 untouched
  assert mul.invars[1] is marked.jaxpr.eqns[0].outvars[0]  # operand 1 through the mark


def test_context_outputs_are_marked_and_only_the_outer_equation_of_a_call_counts():
  scope = prim.scope_name(("i",), "ctx")

  def body(v):
    with jax.named_scope(scope):
      a = jnp.sin(v)
      b = jax.jit(lambda t: jnp.cos(t) * 2)(a)
    return lax.psum(b, "i")

  marked = mark_required(jax.make_jaxpr(smap(body))(X))
  found = marks(marked.jaxpr)
  assert [m for m in found] == [(("shard_map",), ("i",), "ctx", "context")] * 2
  inner = marked.jaxpr.eqns[0].params["jaxpr"]
  names = [e.primitive.name for e in inner.eqns]
  assert names[:4] == ["sin", "symmetric", "jit", "symmetric"]


def test_a_context_inside_a_call_made_in_a_context_adds_no_inner_marks():
  outer, inner = prim.scope_name(("i",), "outer"), prim.scope_name(("i",), "inner")

  def custom(t):
    with jax.named_scope(inner):
      return jnp.cos(t) * 2

  def body(v):
    with jax.named_scope(outer):
      b = jax.jit(custom)(v)
    return lax.psum(b, "i")

  found = marks(mark_required(jax.make_jaxpr(smap(body))(X)).jaxpr)
  assert found == [(("shard_map",), ("i",), "outer", "context")]
  alone = marks(mark_required(jax.make_jaxpr(smap(lambda v: jax.jit(custom)(v)))(X)).jaxpr)
  assert [m[2] for m in alone] == ["inner", "inner"]  # cos and mul, inside the jit


def test_context_axis_that_no_shard_map_binds_is_refused():
  scope = prim.scope_name(("j",), "ctx")

  def body(v):
    with jax.named_scope(scope):
      return v * 2

  with pytest.raises(DonationError, match=r"names axis 'j'.*enclosing shard_map axes 'i'"):
    mark_required(jax.make_jaxpr(smap(body))(X))
  with pytest.raises(DonationError, match="not inside a shard_map"):
    mark_required(jax.make_jaxpr(body)(X))


def test_marks_are_not_re_marked():
  registry.register({"symmetric"}, (0,), "k")
  closed = jax.make_jaxpr(lambda a: prim.mark(a, "i", kind="k", source="with_symmetric"),
                          axis_env=[("i", 1)])(1.0)
  assert mark_required(closed) is closed
