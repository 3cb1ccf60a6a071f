"""donate.jit at the top level: call forms, per-leaf plans, pairing, physical donation, bad input."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate
from donate._demo import swapped_update


def fresh(n=8, value=0.0):
  return jnp.full((n,), value, jnp.float32)


def alive(*xs):
  for x in xs:
    assert not x.is_deleted()
    np.asarray(x)  # still readable


# ---- call forms and jax.jit keywords ----------------------------------------------------------

def test_three_call_forms_and_numerics_match_jax_jit():
  def f(x, y):
    return x * 2 + y

  @donate.jit
  def g1(x, y):
    return x * 2 + y

  g2 = donate.jit(donate_argnums=0)(f)
  g3 = donate.jit(f, donate_argnums=(0,))
  expect = jax.jit(f)(fresh(value=1.0), fresh(value=3.0))
  for g in (g1, g2, g3):
    np.testing.assert_array_equal(g(fresh(value=1.0), fresh(value=3.0)), expect)


def test_static_args_keep_unused_and_compiler_options_pass_through():
  @donate.jit(static_argnums=(1,), static_argnames=("mode",), donate_argnums=0, keep_unused=True,
              compiler_options={"xla_cpu_enable_fast_math": False})
  def f(x, n, unused, mode="add"):
    return x + n if mode == "add" else x * n

  x = fresh(value=2.0)
  np.testing.assert_array_equal(f(x, 3, fresh(), mode="mul"), jnp.full(8, 6.0))
  assert x.is_deleted()
  np.testing.assert_array_equal(f(fresh(value=2.0), 3, fresh()), jnp.full(8, 5.0))
  plan = f.plan(fresh(), 3, fresh())
  assert [d.path for d in plan.decisions] == ["x", "unused"]
  assert plan.decisions[1].action == "kept"  # keep_unused: not pruned


def test_shardings_pass_through():
  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  row = jax.sharding.NamedSharding(mesh, jax.P("x"))
  rep = jax.sharding.NamedSharding(mesh, jax.P())
  f = donate.jit(lambda a, b: (a + 1, b * 2), donate_argnums=0, in_shardings=(row, rep),
                 out_shardings=(row, rep))
  a = jax.device_put(jnp.arange(64.0), row)
  out_a, out_b = f(a, jnp.arange(64.0))
  assert out_a.sharding == row and out_b.sharding == rep
  assert a.is_deleted()
  np.testing.assert_array_equal(out_a, jnp.arange(64.0) + 1)


def test_donate_argnames_and_keyword_passed_arguments_are_donated():
  f = donate.jit(lambda params, x: jax.tree.map(lambda p: p - x, params), donate_argnames="params")
  params = {"w": fresh(value=1.0), "b": fresh(value=2.0)}
  out = f(x=fresh(value=1.0), params=params)
  assert all(p.is_deleted() for p in params.values())
  np.testing.assert_array_equal(out["b"], jnp.ones(8))
  # donate_argnums resolves to the name too, so a keyword call donates.
  g = donate.jit(lambda a, b: a + b, donate_argnums=0)
  a = fresh()
  g(b=fresh(), a=a)
  assert a.is_deleted()


def test_unknown_names_and_out_of_range_numbers_raise_as_jax_jit_does():
  def f(a, b):
    return a

  cases = [dict(donate_argnums=2), dict(donate_argnames="c"),
           dict(donate_argnums=0, static_argnums=0)]
  for kwargs in cases:
    with pytest.raises(ValueError) as theirs:
      jax.jit(f, **kwargs)
    with pytest.raises(donate.DonationError) as ours:
      donate.jit(f, **kwargs)
    assert isinstance(ours.value, ValueError)
    assert str(theirs.value).rstrip('.') in str(ours.value)  # jax.jit's sentence: regexes match
    assert ".f(a, b)" in str(ours.value)  # names the function and its parameters
  with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
    donate.jit(f, donate_argnums="a")


# ---- the plan ---------------------------------------------------------------------------------

def test_swapped_update_pairs_by_dataflow_physically():
  f = donate.jit(swapped_update, donate_argnums=(0, 1), copy_threshold=0)
  a, b = fresh(value=5.0), fresh(value=7.0)
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  x, y = f(a, b)
  assert a.is_deleted() and b.is_deleted()
  assert x.unsafe_buffer_pointer() == pb and y.unsafe_buffer_pointer() == pa
  ex, ey = jax.jit(swapped_update)(fresh(value=5.0), fresh(value=7.0))
  np.testing.assert_array_equal(x, ex)
  np.testing.assert_array_equal(y, ey)


def test_lowered_and_compiled_modules_carry_the_planned_aliases():
  f = donate.jit(swapped_update, donate_argnums=(0, 1), copy_threshold=0)
  lowered = f.lower(fresh(), fresh())
  text = lowered.as_text()
  main = re.search(r"func.func public @main\((.*?)\) ->", text, re.S).group(1)
  args = main.split("%arg")[1:]
  # Arguments and results in the user's order: b (arg1) feeds output 0, a (arg0) output 1.
  assert "tf.aliasing_output = 1" in args[0] and "tf.aliasing_output = 0" in args[1]
  compiled = lowered.compile()
  assert "input_output_alias={ {0}: (1, {}, may-alias), {1}: (0, {}, may-alias) }" in \
      compiled.as_text()
  assert compiled.memory_analysis().temp_size_in_bytes == 0
  out = compiled(fresh(), fresh(value=2.0))
  np.testing.assert_array_equal(out[1], jnp.ones(8))


def test_jax_jit_pairs_the_swapped_case_wrongly():
  """The reason the planner exists: first come, first served gives a full copy."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    compiled = jax.jit(swapped_update, donate_argnums=(0, 1)).lower(fresh(), fresh()).compile()
  assert compiled.memory_analysis().temp_size_in_bytes > 0
  ours = donate.jit(swapped_update, donate_argnums=(0, 1), copy_threshold=0).plan(fresh(), fresh())
  assert ours.memory.temp == 0


def test_realized_aliases_that_differ_from_the_plan_are_reported_as_made():
  plan = donate.jit(swapped_update, donate_argnums=(0, 1), copy_threshold=0).plan(fresh(), fresh())
  realized = plan.realize({0: 0}, None)  # a -> out[0] (first come, first served); b: no alias
  a, b = realized.decisions
  assert (a.action, a.output, a.reason) == ("aliased", "out[0]", "XLA reuses it for out[0] "
                                            "(planned out[1])")
  assert (b.action, b.output) == ("unusable", None) and "did not make the alias" in b.reason


def test_plan_consumes_nothing_and_golden_text():
  f = donate.jit(swapped_update, donate_argnums=(0, 1), copy_threshold=0)
  a, b = fresh(), fresh()
  plan = f.plan(a, b)
  alive(a, b)
  assert str(plan) == """\
DonationPlan for swapped_update: 2 input leaves, 2 outputs
  action   bytes  type        sharding  input -> output
  aliased  32 B   float32[8]  cpu:0     a -> out[1]
      elementwise update of this input [donate_argnums]
  aliased  32 B   float32[8]  cpu:0     b -> out[0]
      updated in place (.at[].set / dynamic_update_slice / scatter) [donate_argnums]
note: memory profile: peak 88 B per device, donation saved 64 B at the peak (152 B without it)
    (plan.profile lists every buffer at the peak)
totals (global arrays): requested 64 B, reused 64 B
compiled (per device): arguments 64 B, outputs 80 B, aliased 64 B, temporaries 0 B, peak 80 B"""
  assert max(map(len, str(plan).splitlines())) <= 100
  html = plan._repr_html_()
  assert "<table>" in html and "out[1]" in html and "aliased" in html
  d = plan.decisions[0]
  assert (d.path, d.shape, d.dtype, d.nbytes, d.requested, d.action, d.output) == (
      "a", (8,), "float32", 32, True, "aliased", "out[1]")
  assert plan.bytes_requested == 64 and plan.bytes_reused == 64


def test_trace_and_lower_keep_the_aot_workflow():
  f = donate.jit(lambda x, y: (x + y, y), donate_argnums=0)
  traced = f.trace(fresh(), fresh())
  assert "add" in str(traced.jaxpr)
  compiled = traced.lower().compile()
  x = fresh(value=1.0)
  out = compiled(x, fresh(value=2.0))
  assert x.is_deleted()
  np.testing.assert_array_equal(out[0], jnp.full(8, 3.0))


def test_cached_calls_do_not_retrace_or_replan():
  f = donate.jit(lambda a, b: swapped_update(a, b), donate_argnums=(0, 1))  # traced here only
  a, b = fresh(), fresh()
  for _ in range(5):
    b, a = f(a, b)
  assert f.trace_count == 1
  f(fresh(16), fresh(16))  # a new signature traces once more
  f(fresh(16), fresh(16))
  b, a = f(a, b)
  assert f.trace_count == 2
  np.testing.assert_array_equal(a, jnp.full(8, 6.0))


def test_unusable_donation_warns_once_per_compile_with_the_explanation():
  f = donate.jit(lambda x, y: (x.sum(), y[:4].astype(jnp.int32)), donate_argnums=(0, 1))
  x, y = jnp.ones((2, 3)), fresh()
  with pytest.warns(donate.UnusableDonationWarning) as record:
    f(x, y)
  assert len(record) == 1  # ours replaces jax.jit's, it does not come on top of it
  ours = [r for r in record if r.category is donate.UnusableDonationWarning]
  assert len(ours) == 1 and ours[0].filename == __file__  # points at the user's call
  text = str(ours[0].message)
  assert text.startswith("Some donated buffers were not usable: float32[2,3] (x), float32[8] (y).")
  assert "x: float32[2,3], sharding cpu:0, memory kind device" in text
  assert "nearest is out[0]: shape () vs (2, 3)" in text
  assert "y: float32[8], sharding cpu:0" in text and text.count("nearest is out[0]") == 2
  alive(x, y)  # unusable donations stay alive, as in jax.jit
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    f(x, y)  # cached: no second warning


def test_strict_mode_raises_before_anything_is_consumed():
  f = donate.jit(lambda x, y: (x + 1, y.sum()), donate_argnums=(0, 1), strict=True)
  x, y = fresh(), fresh()
  with pytest.raises(donate.DonationError, match="y: float32\\[8\\]"):
    f(x, y)
  alive(x, y)
  g = donate.jit(lambda x: x + 1, donate_argnums=0, strict=True)
  np.testing.assert_array_equal(g(x), jnp.ones(8))


def test_unused_donated_inputs_stay_alive_as_in_jax_jit_unless_kept():
  f = donate.jit(lambda x, unused: x * 2, donate_argnums=(0, 1))
  x, unused = fresh(value=1.0), fresh()
  plan = f.plan(x, unused)
  assert [d.action for d in plan.decisions] == ["aliased", "unused"]
  f(x, unused)
  assert x.is_deleted() and not unused.is_deleted()
  x2, unused2 = fresh(value=1.0), fresh()
  jax.jit(lambda x, unused: x * 2, donate_argnums=(0, 1))(x2, unused2)
  assert x2.is_deleted() and not unused2.is_deleted()  # what jax.jit does
  g = donate.jit(lambda x, unused: (x * 2, x + 1), donate_argnums=(0, 1), keep_unused=True)
  x, unused = fresh(value=1.0), fresh()
  assert [d.action for d in g.plan(x, unused).decisions] == ["aliased", "aliased"]
  g(x, unused)
  assert x.is_deleted() and unused.is_deleted()


# ---- in-function annotations ------------------------------------------------------------------

def test_donate_buffer_donates_an_input_not_named_in_argnums():
  def f(w, g):
    w = donate.donate_buffer(w)
    return w - 0.1 * g

  step = donate.jit(f)
  w, g = fresh(value=1.0), fresh(value=1.0)
  pw = w.unsafe_buffer_pointer()
  out = step(w, g)
  assert w.is_deleted() and not g.is_deleted()
  assert out.unsafe_buffer_pointer() == pw
  np.testing.assert_allclose(out, jax.jit(f)(fresh(value=1.0), g))
  decision = step.plan(fresh(), fresh()).decisions[0]
  assert decision.source.startswith("donate_buffer at ") and "test_transforms.py" in decision.source


def test_reading_a_donated_value_afterwards_names_both_lines():
  def f(w):
    v = donate.donate_buffer(w)
    return v + w  # reads the original

  w = fresh()
  with pytest.raises(donate.DonationError) as info:
    donate.jit(f)(w)
  lines = re.findall(r"test_transforms\.py:(\d+)", str(info.value))
  assert len(set(lines)) == 2
  alive(w)


def test_alias_chooses_the_buffer():
  def f(a, b):
    # Without the aliases both outputs could take either buffer; ask for the crossed pairing.
    x, y = a * 2.0, b * 3.0
    return donate.alias(b, x), donate.alias(a, y)

  step = donate.jit(f)
  a, b = fresh(value=1.0), fresh(value=1.0)
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  x, y = step(a, b)
  assert x.unsafe_buffer_pointer() == pb and y.unsafe_buffer_pointer() == pa
  np.testing.assert_array_equal(x, jnp.full(8, 2.0))
  assert step.plan(fresh(), fresh()).aliases == {"out[0]": "b", "out[1]": "a"}


def test_alias_chain_resolves_to_the_root():
  def f(a):
    b = donate.alias(a, a + 1.0)
    c = donate.alias(b, b * 2.0)
    return c

  plan = donate.jit(f).plan(fresh())
  assert plan.aliases == {"out": "a"}


@pytest.mark.parametrize("n", [3, 0])
def test_a_donated_leaf_whose_alias_no_output_takes_is_offered_as_jax_jit_offers_it(n):
  """`donate_argnums` asks for x; the alias inside leads only to an output of another dtype.
  `jax.jit` offers x to XLA as a buffer donor (an output has as many elements), which reuses a
  zero-size buffer and not a 12-byte one for a 6-byte output; donate.jit does the same, says so
  in its plan and warns of nothing, as the same program without the alias."""

  def marked(x):
    return (-donate.alias(x, -x)).astype(jnp.bfloat16)

  def plain(x):
    return (x * 1.0).astype(jnp.bfloat16)

  header = {3: "buffer_donor={ (0, {}) }", 0: "input_output_alias={ {}: (0, {}, may-alias) }"}[n]
  for fun in (marked, plain):
    x, y = fresh(n), fresh(n)
    expect = jax.jit(fun, donate_argnums=0).lower(y).compile()
    assert header in expect.as_text()
    g = donate.jit(fun, donate_argnums=0)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      compiled = g.lower(x).compile()
      plan = g.plan(x)
      out = g(x)
    assert header in compiled.as_text()
    np.testing.assert_array_equal(out, jax.jit(fun)(fresh(n)))
    (d,) = plan.decisions
    if n:
      assert (d.action, d.cause, d.consumed) == ("unusable", "donor_not_reused", False)
      alive(x)
    else:
      assert (d.action, d.cause, d.output, d.consumed) == ("aliased", "donor_reused", "out", True)
      assert x.is_deleted()
    jax.jit(fun, donate_argnums=0)(y)
    assert y.is_deleted() == x.is_deleted()


def test_a_requested_leaf_planned_unusable_that_xla_aliases_is_reported_aliased():
  """The plan tells what the compiled program does: a requested leaf it found no output for
  becomes "aliased" when the compiled module aliases it all the same; a leaf nobody asked for
  is never made so."""
  def f(x, y):
    return x[:2] * 2.0, y[:2]

  with pytest.warns(donate.UnusableDonationWarning, match=r"x: float32\[3\]"):
    plan = donate.jit(f, donate_argnums=0).plan(fresh(3), fresh(3))
  assert [(d.action, d.requested) for d in plan.decisions] == [("unusable", True), ("kept", False)]
  realized = plan.realize({0: 0, 1: 1}, None)
  x, y = realized.decisions
  assert (x.action, x.output, x.cause, x.consumed) == ("aliased", "out[0]", "donor_reused", True)
  assert x.reason.startswith("XLA reuses it for out[0] (")
  assert (y.action, y.output) == ("kept", None)


# ---- bad input: error, nothing consumed -------------------------------------------------------

def test_same_array_twice_is_caught_before_dispatch_naming_both_paths():
  f = donate.jit(lambda p, q: (p["w"] + 1, q + 1), donate_argnums=0)
  x = fresh()
  with pytest.raises(donate.DonationError, match=r"once as p\['w'\] and once as q"):
    f({"w": x}, x)
  alive(x)
  y = fresh()
  f({"w": y}, fresh())  # warm the fast path, then pass a duplicate through it
  z = fresh()
  with pytest.raises(donate.DonationError, match="same array is passed twice"):
    f({"w": z}, z)
  alive(z)


def test_an_array_repeated_in_an_argument_the_function_does_not_read_runs_as_in_jax_jit():
  # jax.jit prunes the unread argument: it passes one buffer, donates it, and runs
  for jit in (jax.jit, donate.jit):
    f = jit(lambda a, b: a + 1, donate_argnums=0)
    g = jit(lambda t: t["p"] + 1, donate_argnums=0)
    for call in range(2):  # the first call and a cached one
      x, y = fresh(value=1.0), fresh(value=2.0)
      np.testing.assert_array_equal(f(x, x), fresh(value=2.0))
      np.testing.assert_array_equal(g({"p": y, "q": y}), fresh(value=3.0))
      assert x.is_deleted() and y.is_deleted()
  # kept (keep_unused=True), it is passed twice: both refuse it and consume nothing
  for jit in (jax.jit, donate.jit):
    x = fresh()
    with pytest.raises(jax.errors.JaxRuntimeError):
      jit(lambda a, b: a + 1, donate_argnums=0, keep_unused=True)(x, x)
    alive(x)


def test_leaves_that_are_not_device_buffers_are_planned_not_rejected():
  def step(cfg, x):
    return {"scale": cfg["scale"] * 2, "offset": cfg["offset"] + 1, "w": cfg["w"] * 2}, x * 2

  cfg = {"scale": 2.0, "offset": np.ones(8, np.float32), "w": fresh(value=1.0)}
  f = donate.jit(step, donate_argnums=0)
  plan = f.plan(cfg, fresh())
  by_path = {d.path: d for d in plan.decisions}
  for path, name in (("cfg['scale']", "float"), ("cfg['offset']", "ndarray")):
    assert (by_path[path].action, by_path[path].consumed) == ("kept", False)
    assert by_path[path].reason == f"not donated: not a device buffer ({name})"
  assert by_path["cfg['w']"].action == "aliased"
  expect = jax.jit(step, donate_argnums=0)(dict(cfg, w=fresh(value=1.0)), fresh())
  out = f(cfg, fresh())
  assert cfg["w"].is_deleted() and cfg["offset"].sum() == 8  # numpy value untouched
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expect)):
    np.testing.assert_array_equal(got, want)
  strict = donate.jit(step, donate_argnums=0, strict=True)
  x = fresh()
  cfg = {"scale": 2.0, "offset": np.ones(8, np.float32), "w": fresh()}
  with pytest.raises(donate.DonationError, match=r"strict mode cannot donate a leaf that is not a "
                     r"device buffer .* at cfg\['offset'\]: expected a jax.Array, got ndarray"):
    strict(cfg, x)
  alive(x, cfg["w"])


def test_alias_shape_mismatch_is_an_error():
  x, y = fresh(), fresh(4)
  with pytest.raises(donate.DonationError, match=r"float32\[8\].*float32\[4\]"):
    donate.jit(lambda a, b: donate.alias(a, b))(x, y)
  alive(x, y)


def test_alias_of_one_source_into_two_outputs_is_an_error():
  def f(a):
    b = donate.alias(a, a + 1.0)
    return b, b * 1.0

  x = fresh()
  with pytest.raises(donate.DonationError, match="one source into two outputs.* at a"):
    donate.jit(f)(x)
  alive(x)


def test_inputs_cannot_be_aliased_to_each_other():
  x, y = fresh(), fresh()
  with pytest.raises(donate.DonationError, match="aliases two inputs to each other: a and b"):
    donate.jit(lambda a, b: donate.alias(a, b))(x, y)
  alive(x, y)


def test_a_function_that_raises_consumes_nothing():
  def f(a, b):
    raise RuntimeError("boom")

  x, y = fresh(), fresh()
  with pytest.raises(RuntimeError, match="boom"):
    donate.jit(f, donate_argnums=(0, 1))(x, y)
  alive(x, y)


def test_ordered_effects_do_not_shift_the_checked_aliases():
  from jax.experimental import io_callback  # an ordered effect adds a token parameter to main

  seen = []

  def f(a, b):
    io_callback(lambda x: seen.append(float(x[0])), None, a, ordered=True)
    return swapped_update(a, b)

  g = donate.jit(f, donate_argnums=(0, 1), copy_threshold=0)
  a, b = fresh(value=3.0), fresh()
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  x, y = g(a, b)
  jax.effects_barrier()
  assert x.unsafe_buffer_pointer() == pb and y.unsafe_buffer_pointer() == pa
  assert seen == [3.0]


def test_a_keyword_error_not_about_argument_numbers_is_jax_jits_own():
  from jax.experimental.layout import Layout
  spec = jax.ShapeDtypeStruct((8,), jnp.float32)
  errors = []
  for jit in (jax.jit, donate.jit):
    with pytest.raises(ValueError) as info:
      jit(lambda x: x, in_shardings=Layout.AUTO, out_shardings=Layout.AUTO).lower(spec).compile()
    errors.append(info.value)
  assert str(errors[1]) == str(errors[0]) and "Fix:" not in str(errors[1])
  assert type(errors[1]) is type(errors[0])
