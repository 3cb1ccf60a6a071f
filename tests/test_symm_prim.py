"""donate._symm.prim: the `symmetric` primitive's rules and lowering, the argument checks and the
`symmetric_memory` context's named scopes, each on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import ad
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from donate._base.errors import DonationError
from donate._symm import prim

PARAMS = dict(axis_name=("i",), kind="symm_mem", source="with_symmetric")
MESH = Mesh(np.array(jax.devices()[:1]), ("i",))


def bind(x):
  return prim.symmetric_p.bind(x, **PARAMS)


def prims(closed):
  return [e.primitive.name for e in closed.jaxpr.eqns]


def test_evaluation_and_abstract_evaluation_are_the_identity():
  x = jnp.arange(6.0).reshape(2, 3)
  assert (bind(x) == x).all()
  closed = jax.make_jaxpr(bind)(jax.ShapeDtypeStruct((2, 3), jnp.bfloat16))
  assert closed.out_avals[0].shape == (2, 3) and closed.out_avals[0].dtype == jnp.bfloat16


def test_jvp_marks_the_tangent_and_keeps_a_zero_tangent_zero():
  closed = jax.make_jaxpr(lambda x, t: jax.jvp(bind, (x,), (t,)))(1.0, 1.0)
  assert prims(closed) == ["symmetric", "symmetric"]
  out, tangent = jax.jvp(lambda x: bind(x) * 3.0, (2.0,), (1.0,))
  assert (float(out), float(tangent)) == (6.0, 3.0)
  zero = ad.Zero(jax.typeof(1.0))
  primal, same = prim._jvp((1.0,), (zero,), **PARAMS)
  assert same is zero and float(primal) == 1.0
  assert jax.grad(lambda x: bind(x) * 3.0)(2.0) == 3.0


def test_transpose_is_the_identity_without_a_mark():
  closed = jax.make_jaxpr(jax.grad(lambda x: (bind(x) * 2.0).sum()))(jnp.ones(3))
  assert prims(closed).count("symmetric") == 1  # the forward mark only; the cotangent is unmarked


def test_batching_keeps_the_batch_dimension():
  f = jax.vmap(bind, in_axes=1, out_axes=1)
  x = jnp.arange(6.0).reshape(2, 3)
  assert (f(x) == x).all()
  assert prims(jax.make_jaxpr(f)(x)) == ["symmetric"]


def test_frontend_attributes():
  attrs = prim.frontend_attributes(axis_name=("i", "j"), kind="nccl", source="context")
  assert attrs == {"donate.symmetric": "nccl", "donate.group": "i,j", "donate.source": "context",
                   "donate.memory_space": "collective", "donate.memory_space_color": "1"}


def test_lowering_marks_the_producing_op_and_merges_differing_values():
  def body(x):
    y = jnp.sin(x)
    y = prim.symmetric_p.bind(y, axis_name=("i",), kind="symm_mem", source="with_symmetric")
    y = prim.symmetric_p.bind(y, axis_name=("i",), kind="symm_mem", source="context")
    return jax.lax.psum(y, "i")

  f = jax.shard_map(body, mesh=MESH, in_specs=P("i"), out_specs=P())
  text = jax.jit(f).lower(jnp.ones(4)).as_text()
  (line,) = [l for l in text.splitlines() if "donate.symmetric" in l]
  assert "stablehlo.sine" in line and 'donate.source = "with_symmetric;context"' in line
  assert 'donate.results = "0"' in line and "optimization_barrier" not in text


def test_lowering_of_an_argument_uses_an_optimization_barrier():
  text = jax.jit(bind).lower(jnp.ones(4)).as_text()
  (line,) = [l for l in text.splitlines() if "donate.symmetric" in l]
  assert "optimization_barrier" in line and "donate.results" not in line


@pytest.mark.parametrize("axis_name", ["", (), ("i", ""), 3, None])
def test_normalize_axes_refuses_what_is_not_an_axis_name(axis_name):
  with pytest.raises(DonationError, match="mesh axis name"):
    prim.normalize_axes(axis_name, where="with_symmetric")


@pytest.mark.parametrize("kind", ["", None, 1])
def test_check_kind_refuses_what_is_not_a_kind(kind):
  with pytest.raises(DonationError, match="comm-buffer kind"):
    prim.check_kind(kind, where="with_symmetric")


def test_check_bound_passes_inside_shard_map_and_names_the_bound_axes_outside():
  seen = []

  def body(x):
    prim.check_bound(("i",), where="t")
    with pytest.raises(DonationError, match=r"'j'.*bound axis names 'i'"):
      prim.check_bound(("j",), where="t")
    seen.append(True)
    return x

  jax.make_jaxpr(jax.shard_map(body, mesh=MESH, in_specs=P("i"), out_specs=P("i")))(jnp.ones(2))
  assert seen == [True]


def test_mark_checks_its_source_and_leaves_eager_values_alone():
  tree = {"a": 1.0, "b": np.ones(2)}
  assert prim.mark(tree, "i", kind="symm_mem", source="context") is tree
  with pytest.raises(DonationError, match="unknown annotation source"):
    prim.mark(tree, "i", kind="symm_mem", source="other")
  closed = jax.make_jaxpr(lambda t: prim.mark(t, "i", kind="k", source="context"),
                          axis_env=[("i", 1)])(tree)
  assert [e.params["kind"] for e in closed.jaxpr.eqns] == ["k", "k"]
  assert prim.is_tracing(1.0) is False


def test_scope_names_are_interned_per_axes_and_kind():
  a = prim.scope_name(("i",), "symm_mem")
  assert a == prim.scope_name(("i",), "symm_mem")
  assert len({a, prim.scope_name(("i",), "nccl"), prim.scope_name(("i", "j"), "symm_mem")}) == 3
  assert a.startswith("donate_symm#")


def test_context_spec_reads_the_innermost_scope_and_skips_views_and_marks():
  outer, inner = prim.scope_name(("i",), "outer"), prim.scope_name(("i",), "inner")

  def f(x):
    with jax.named_scope(outer):
      y = jnp.sin(x)
      with jax.named_scope(inner):
        z = jnp.cos(y).reshape(2, 2)
      return bind(z * 2.0)

  eqns = jax.make_jaxpr(f)(jnp.ones(4)).jaxpr.eqns
  specs = {e.primitive.name: prim.context_spec(e) for e in eqns}
  assert specs["sin"] == (("i",), "outer") and specs["mul"] == (("i",), "outer")
  assert specs["cos"] == (("i",), "inner")
  assert specs["reshape"] is None and specs["symmetric"] is None


def test_context_spec_skips_the_backward_pass():
  scope = prim.scope_name(("i",), "symm_mem")

  def f(x):
    with jax.named_scope(scope):
      return jnp.sin(x) * x

  eqns = jax.make_jaxpr(jax.grad(f))(1.0).jaxpr.eqns
  backward = [e for e in eqns if "transpose(" in str(e.source_info.name_stack)]
  assert backward and all(prim.context_spec(e) is None for e in backward)
  assert any(prim.context_spec(e) is not None for e in eqns)
