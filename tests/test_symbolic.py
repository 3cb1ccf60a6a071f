"""Symbolic shapes (`jax.export.symbolic_shape`): plans, pairing and `jax.export` of donate.jit.

Byte counts become expressions of the dimension variables, pairing compares shapes as `jax.jit`
does (equal expressions), and the exported module carries the plan's `tf.aliasing_output` and
`jax.buffer_donor` attributes, in the user's argument and result order.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import donate
from donate._base import text as _text
from donate._jit import binding as _binding


def spec(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


def main_args(module: str) -> list:
  """Per argument of the module's public `main`: the output index it aliases, "donor", or None."""
  line = next(l for l in module.splitlines() if "func.func public @main(" in l)
  out = []
  for arg in re.split(r"%arg\d+: ", line.split(") -> ")[0])[1:]:
    alias = re.search(r"tf.aliasing_output = (\d+)", arg)
    out.append(int(alias.group(1)) if alias else "donor" if "jax.buffer_donor" in arg else None)
  return out


def without_locations(module: str) -> str:
  """The module text without its source locations (which number differently per trace)."""
  module = re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", module)
  return "\n".join(l for l in module.splitlines() if not l.startswith("#loc"))


def exported(jit, fun, *args, **kwargs):
  """`jax.export.export` of `jit(fun, **kwargs)`, warnings recorded rather than raised."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exp = export.export(jit(fun, **kwargs))(*args)
  return exp, [w for w in caught if "donated" in str(w.message)]


def swapped(a, b):
  return b.at[0].set(1.0), a + 1.0


# ---- byte counts -------------------------------------------------------------------------------
def test_byte_counts_are_expressions_of_the_dimension_variables():
  a, b = export.symbolic_shape("a, b")
  assert str(_binding.aval_nbytes(spec((a, b)))) == "4*a*b"
  assert str(_binding.aval_nbytes(spec((b, 3), jnp.int8))) == "3*b"
  assert _binding.aval_nbytes(spec((2, 3))) == 24 and isinstance(
      _binding.aval_nbytes(spec((2, 3))), int)
  assert _text.format_bytes(4 * a * b) == "4*a*b B"
  assert _text.format_bytes(4 * b + 16) == "(4*b + 16) B"
  assert _text.format_bytes(2048) == "2.0 KiB"
  assert _text.is_symbolic(4 * b) and not _text.is_symbolic(np.int64(3))


def step(x, y, n):
  return x * 2.0 + n, y + 1.0


def test_plan_text_shows_symbolic_bytes_and_totals():
  b, = export.symbolic_shape("b")
  plan = donate.jit(step, donate_argnums=(0, 1)).trace(
      spec((b, 4)), spec((8,)), spec(())).plan
  assert str(plan) == """\
DonationPlan for step: 3 input leaves, 2 outputs
  action   bytes   type          sharding  input -> output
  aliased  16*b B  float32[b,4]  -         x -> out[0]
      elementwise update of this input [donate_argnums]
  aliased  32 B    float32[8]    -         y -> out[1]
      elementwise update of this input [donate_argnums]
  kept     4 B     float32[]     -         n
      not donated
totals (global arrays): requested (16*b + 32) B, reused (16*b + 32) B (symbolic: bytes in terms of
    dimension variables)"""
  assert str(plan.bytes_requested) == "16*b + 32"
  assert "requested (16*b + 32) B, reused (16*b + 32) B (symbolic" in plan._repr_html_()
  concrete = donate.jit(step, donate_argnums=(0, 1)).trace(
      spec((3, 4)), spec((8,)), spec(())).plan
  assert "symbolic" not in str(concrete) and concrete.bytes_requested == 80


# ---- pairing -----------------------------------------------------------------------------------
def test_swapped_update_pairs_by_dataflow_in_the_exported_module():
  a, b = export.symbolic_shape("a, b")
  plan = donate.jit(swapped, donate_argnums=(0, 1), copy_threshold=0).trace(spec((a, b)), spec((a, b))).plan
  assert [(d.path, d.action, d.output) for d in plan.decisions] == [
      ("a", "aliased", "out[1]"), ("b", "aliased", "out[0]")]
  ours, warned = exported(donate.jit, swapped, spec((a, b)), spec((a, b)), donate_argnums=(0, 1))
  theirs, _ = exported(jax.jit, swapped, spec((a, b)), spec((a, b)), donate_argnums=(0, 1))
  assert main_args(ours.mlir_module()) == [1, 0]  # b updates out[0] in place, a becomes out[1]
  assert main_args(theirs.mlir_module()) == [0, 1]  # jax.jit: first come, first served
  assert re.search(r"@_wrapped_jax_export_main\(.*tf.aliasing_output = 1.*tf.aliasing_output = 0",
                   ours.mlir_module())
  assert not warned
  assert (ours.in_avals, ours.out_avals, ours.in_tree, ours.out_tree) == (
      theirs.in_avals, theirs.out_avals, theirs.in_tree, theirs.out_tree)
  for shape in ((3, 5), (1, 2)):
    x, y = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape), jnp.ones(shape)
    for got, want in zip(ours.call(x, y), jax.jit(swapped)(x, y)):
      np.testing.assert_array_equal(got, want)


def test_concrete_exports_pair_by_dataflow_too():
  ours, _ = exported(donate.jit, swapped, spec((4,)), spec((4,)), donate_argnums=(0, 1),
                     copy_threshold=0)
  assert main_args(ours.mlir_module()) == [1, 0]
  got = ours.call(jnp.ones(4), jnp.zeros(4))
  np.testing.assert_array_equal(got[0], [1, 0, 0, 0])
  np.testing.assert_array_equal(got[1], [2, 2, 2, 2])


def test_different_dimension_variables_do_not_pair():
  a, b = export.symbolic_shape("a, b")
  f = donate.jit(lambda x: x[:1] * 2.0, donate_argnums=0)
  with pytest.warns(donate.UnusableDonationWarning,
                    match=r"(?s)float32\[a,b\] \(x\).*nearest is out: shape \(1, b\) vs \(a, b\)"):
    exp = export.export(f)(spec((a, b)))
  assert main_args(exp.mlir_module()) == [None]
  strict = donate.jit(lambda x: x[:1] * 2.0, donate_argnums=0, strict=True)
  with pytest.raises(donate.DonationError, match=r"donate: Some donated buffers were not usable"):
    export.export(strict)(spec((a, b)))
  x = jnp.ones((3, 2))
  with pytest.raises(donate.DonationError):
    strict(x)
  assert not x.is_deleted()


def test_equal_sizes_of_other_shapes_make_a_buffer_donor_as_in_jax_jit():
  a, c = export.symbolic_shape("a, c")
  plan = donate.jit(lambda x: x.T, donate_argnums=0).trace(spec((a, c))).plan
  assert [(d.action, d.output) for d in plan.decisions] == [("donor", None)]
  ours, _ = exported(donate.jit, lambda x: x.T, spec((a, c)), donate_argnums=0)
  theirs, _ = exported(jax.jit, lambda x: x.T, spec((a, c)), donate_argnums=0)
  assert main_args(ours.mlir_module()) == main_args(theirs.mlir_module()) == ["donor"]


def test_an_unread_input_stays_in_the_module_and_is_unusable_as_in_jax_jit():
  # jax.jit prunes no input of a program with symbolic shapes, so `c` stays donated but unused.
  a, = export.symbolic_shape("a")

  def f(x, c):
    return x + 1.0
  plan = donate.jit(f, donate_argnums=(0, 1)).trace(spec((a,)), spec((a,))).plan
  assert [d.action for d in plan.decisions] == ["aliased", "unusable"]
  assert "already reuses x" in plan.decisions[1].reason
  with pytest.warns(donate.UnusableDonationWarning, match=r"float32\[a\] \(c\)"):
    exp = export.export(donate.jit(f, donate_argnums=(0, 1)))(spec((a,)), spec((a,)))
  assert main_args(exp.mlir_module()) == [0, None]


def test_mixed_symbolic_and_concrete_leaves():
  b, = export.symbolic_shape("b")

  def step(params, batch):
    w, m = params["w"], params["m"]
    g = jnp.sum(batch, axis=0)
    return {"m": m * 0.9 + g, "w": w - 0.1 * g}, batch * 2.0
  args = ({"m": spec((4,)), "w": spec((4,))}, spec((b, 4)))
  plan = donate.jit(step, donate_argnums=(0, 1)).trace(*args).plan
  assert [(d.path, d.action, d.output) for d in plan.decisions] == [
      ("params['m']", "aliased", "out[0]['m']"), ("params['w']", "aliased", "out[0]['w']"),
      ("batch", "aliased", "out[1]")]
  assert str(plan.bytes_requested) == "16*b + 32"
  ours, warned = exported(donate.jit, step, *args, donate_argnums=(0, 1))
  theirs, _ = exported(jax.jit, step, *args, donate_argnums=(0, 1))
  assert main_args(ours.mlir_module()) == main_args(theirs.mlir_module()) == [0, 1, 2]
  assert not warned
  params = {"m": jnp.zeros(4), "w": jnp.ones(4)}
  batch = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
  got, want = ours.call(params, batch), jax.jit(step)(params, batch)
  jax.tree.map(np.testing.assert_allclose, got, want)


# ---- the exported module equals jax.jit's when the plan is jax.jit's -----------------------------
def test_export_with_a_donated_symbolic_batch_is_jax_jits_module():
  b, = export.symbolic_shape("b")

  def f(x):
    return jnp.sin(x) * 2.0
  ours, _ = exported(donate.jit, f, spec((b, 4)), donate_argnums=0)
  theirs, _ = exported(jax.jit, f, spec((b, 4)), donate_argnums=0)
  assert main_args(ours.mlir_module()) == [0]
  assert without_locations(ours.mlir_module()) == without_locations(theirs.mlir_module())
  for n in (1, 3, 7):
    x = jnp.arange(4 * n, dtype=jnp.float32).reshape(n, 4)
    np.testing.assert_array_equal(ours.call(x), jax.jit(f)(x))
    np.testing.assert_array_equal(ours.call(x), theirs.call(x))


def test_serialized_exports_keep_the_planned_aliases():
  pytest.importorskip("flatbuffers")  # jax.export's serialization needs it
  a, b = export.symbolic_shape("a, b")
  ours, _ = exported(donate.jit, swapped, spec((a, b)), spec((a, b)), donate_argnums=(0, 1))
  again = export.deserialize(ours.serialize())
  assert main_args(again.mlir_module()) == [1, 0]
  x = jnp.ones((2, 3))
  for got, want in zip(again.call(x, x), swapped(x, x)):
    np.testing.assert_array_equal(got, want)


def test_multi_platform_export_with_donation():
  b, = export.symbolic_shape("b")
  f = donate.jit(swapped, donate_argnums=(0, 1), copy_threshold=0)
  exp = export.export(f, platforms=["cpu", "tpu"])(spec((b,)), spec((b,)))
  assert main_args(exp.mlir_module())[-2:] == [1, 0]  # after the platform index
  x, y = jnp.arange(3.0), jnp.arange(3.0) + 5
  for got, want in zip(exp.call(x, y), swapped(x, y)):
    np.testing.assert_array_equal(got, want)
  with pytest.raises(NotImplementedError, match="either all or no lowering platforms"):
    export.export(f, platforms=["cpu", "tpu", "other"])(spec((b,)), spec((b,)))


# ---- what JAX's export tests check, with donate.jit ---------------------------------------------
def test_export_only_with_a_symbolic_scope():
  scope = export.SymbolicScope()
  exp = export.export(donate.jit(lambda a, b: jnp.concatenate([a, b], axis=0)))(
      spec(export.symbolic_shape("(2*w, h)", scope=scope)),
      spec(export.symbolic_shape("(w, h)", scope=scope)))
  assert [str(a.shape) for a in exp.in_avals + exp.out_avals] == [
      "(2*w, h)", "(w, h)", "(3*w, h)"]
  module = exp.mlir_module()
  assert "jax.uses_shape_polymorphism = true" in module and "shape_assertion" in module
  assert re.search(r"@_wrapped_jax_export_main\(%arg0: tensor<i..> {jax.global_constant = \"h\".*"
                   r"%arg1: tensor<i..> {jax.global_constant = \"w\".*%arg2: tensor<\?x\?xf32>",
                   module)


def test_export_of_pytrees_and_keyword_arguments():
  s = spec(export.symbolic_shape("(w, h)"))
  f = donate.jit(lambda a0, a1, *, ak: jnp.concatenate([a0, a1, ak], axis=0), donate_argnames="ak")
  with pytest.warns(donate.UnusableDonationWarning, match=r"(?s)\(ak\).*shape \(3\*w, h\) vs"):
    exp = export.export(f)(s, s, ak=s)
  assert str(exp.in_avals[0].shape) == "(w, h)" and str(exp.out_avals[0].shape) == "(3*w, h)"
  x = jnp.ones((2, 3))
  np.testing.assert_array_equal(exp.call(x, x, ak=x), jnp.ones((6, 3)))


@pytest.mark.parametrize("poly_spec, shape, error", [
    ("3,4,6*a", (3, 4, 12), None),
    ("3,a,a+8", (3, 4, 12), None),
    ("3,4,a+1", (3, 4, 1), "Expected value >= 1 for dimension variable 'a'"),
    ("3,4,6*a", (3, 4, 13), "Division had remainder 1 when computing the value of 'a'"),
    ("3,a,a+8", (3, 4, 13), "Found inconsistency between dimension size args[0].shape[2] (= 13)"),
])
def test_shape_checks_of_the_exported_module(poly_spec, shape, error):
  def f(x):
    return jnp.reshape(x, (-1, x.shape[1]))
  exp = export.export(donate.jit(f, donate_argnums=0))(spec(export.symbolic_shape(poly_spec)))
  assert exp.uses_global_constants
  x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  if error is None:
    np.testing.assert_array_equal(exp.call(x), f(x))
  else:
    with pytest.raises(Exception, match=re.escape(error)):
      exp.call(x)


def test_unsolvable_shape_constraints_raise_as_in_jax_jit():
  x = jnp.zeros((7, 2, 36))
  with pytest.raises(Exception, match=re.escape("Cannot solve for values of dimension variables")):
    export.export(donate.jit(lambda x: 0.0))(
        spec(export.symbolic_shape("(2 * a + b, a, c * c)"))).call(x)
  m, = export.symbolic_shape("m", constraints=["m >= m1"])
  with pytest.raises(Exception, match="Encountered dimension variable 'm1'"):
    export.export(donate.jit(lambda x: x))(spec((m,)))


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint32, jnp.bfloat16, np.float64,
                                   np.complex64])
def test_numeric_dtypes_and_booleans(dtype):
  f = donate.jit(lambda x: ~x if x.dtype == np.bool_ else x + x, donate_argnums=0)
  with jax.enable_x64(True) if hasattr(jax, "enable_x64") else jax.experimental.enable_x64():
    exp = export.export(f)(spec(export.symbolic_shape("b"), dtype))
    x = np.arange(6).astype(dtype)
    assert main_args(exp.mlir_module()) == [0]
    np.testing.assert_array_equal(exp.call(x), f(x))


def test_symbolic_output_expressions():
  @donate.jit
  def f(x):
    b = x.shape[0]
    return jnp.ones((b + b, b - b, b * b, (b + 13) // b, (b + 13) % b), dtype=x.dtype)
  exp = export.export(f)(spec(export.symbolic_shape("b")))
  x = jnp.arange(5.0)
  np.testing.assert_array_equal(exp.call(x), f(x))
  assert str(exp.out_avals[0].shape) == "(2*b, 0, b^2, floordiv(b + 13, b), mod(b + 13, b))"


def test_vjp_of_a_symbolic_export():
  def f(xi, xf):
    return 2 * xi.T, xf.T * xf.T
  xi, xf = np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(12, dtype=np.float32).reshape(3, 4)
  args = export.symbolic_args_specs([xi, xf], shapes_specs=["2, a", "a, 4"])
  exp = export.export(donate.jit(f, donate_argnums=1))(*args)
  jax.tree.map(np.testing.assert_allclose, exp.call(xi, xf), f(xi, xf))
  out_ct = (np.ones((3, 2), jax.dtypes.float0), np.ones((4, 3), np.float32))
  want = jax.vjp(f, xi, xf)[1](out_ct)
  got = jax.vjp(exp.call, xi, xf)[1](out_ct)
  np.testing.assert_allclose(got[1], want[1])
  assert [str(a.shape) for a in exp.vjp().in_avals][:2] == ["(2, a)", "(a, 4)"]
