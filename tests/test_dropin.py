"""`donate.jit` is a drop-in for `jax.jit`: the same answers, exception types and warnings.

Every check here runs the same code under `jax.jit` and under `donate.jit` and compares what a user
sees: results, which arrays are consumed, staged objects and their members, errors and warnings.
"""

import functools
import inspect
import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import monitoring
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import donate
from donate._demo import swapped_update

JITS = pytest.mark.parametrize("jit", [jax.jit, donate.jit], ids=["jax", "donate"])
SDS = jax.ShapeDtypeStruct((8,), jnp.float32)


def fresh(n=8, value=1.0):
  return jnp.full((n,), value, jnp.float32)


def step(x, y):
  return x * 2.0, y + 1.0


def mesh8():
  return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))


# ---- abstract arguments and the ahead-of-time workflow ----------------------------------------

@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
def test_abstract_arguments_plan_lower_and_compile_like_arrays(fun):
  g = donate.jit(fun, donate_argnums=(0, 1))
  plan = g.plan(SDS, SDS)
  assert [d.action for d in plan.decisions] == ["aliased", "aliased"]
  assert [d.sharding for d in plan.decisions] == ["-", "-"]
  traced = g.trace(SDS, SDS)
  assert [a.donated for a in jax.tree.leaves(traced.args_info)] == [True, True]
  assert g.eval_shape(SDS, SDS) == jax.jit(fun).eval_shape(SDS, SDS)
  lowered = traced.lower()
  assert lowered.as_text().count("tf.aliasing_output") == 2
  compiled = lowered.compile()
  assert "input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }" in \
      compiled.as_text() or "input_output_alias={ {1}: (0" in compiled.as_text()
  a, b = fresh(), fresh(value=2.0)
  expect = jax.jit(fun)(fresh(), fresh(value=2.0))
  out = compiled(a, b)
  assert a.is_deleted() and b.is_deleted()
  for got, want in zip(out, expect):
    np.testing.assert_array_equal(got, want)


def test_sharded_abstract_arguments():
  row = NamedSharding(mesh8(), P("x"))
  sds = jax.ShapeDtypeStruct((64,), jnp.float32, sharding=row)
  g = donate.jit(lambda a: a * 2, donate_argnums=0)
  plan = g.plan(sds)
  assert (plan.decisions[0].action, plan.decisions[0].sharding) == ("aliased", "P('x')")
  assert g.lower(sds).compile().input_shardings[0][0] == row


@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
def test_jax_export_exports_a_donate_jit_function(fun):
  exported = jax.export.export(donate.jit(fun, donate_argnums=(0, 1)))(SDS, SDS)
  expect = jax.export.export(jax.jit(fun))(SDS, SDS)
  assert exported.in_avals == expect.in_avals and exported.out_avals == expect.out_avals
  for got, want in zip(exported.call(fresh(), fresh(value=3.0)),
                       expect.call(fresh(), fresh(value=3.0))):
    np.testing.assert_array_equal(got, want)


def count_compiles(fn):
  events = []

  def listener(name, *args, **kwargs):
    events.append(name)
  monitoring.register_event_duration_secs_listener(listener)
  try:
    fn()
  finally:
    monitoring.unregister_event_duration_listener(listener)
  return sum("backend_compile" in e for e in events)


@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
def test_lower_compiles_nothing_and_the_first_call_compiles_once(fun):
  fun = lambda x, y, fun=fun: fun(x, y)  # a function of this test's own: no cache has it
  args = [fresh() for _ in range(6)]
  g = donate.jit(fun, donate_argnums=(0, 1))
  assert count_compiles(lambda: g.lower(args[0], args[1])) == 0
  h = donate.jit(fun, donate_argnums=(0, 1))
  assert count_compiles(lambda: h(args[2], args[3])) == 1
  assert count_compiles(lambda: h(args[4], args[5])) == 0


@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
def test_staged_objects_answer_every_member_jax_has(fun):
  ours = donate.jit(fun, donate_argnums=(0, 1), copy_threshold=0)
  theirs = jax.jit(fun, donate_argnums=(0, 1))
  args = (fresh(), fresh())
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    t_ours, t_theirs = ours.trace(*args), theirs.trace(*args)
    l_ours, l_theirs = t_ours.lower(), t_theirs.lower()
    c_ours = l_ours.compile(compiler_options={"xla_cpu_enable_fast_math": False})
    c_theirs = l_theirs.compile(compiler_options={"xla_cpu_enable_fast_math": False})
  for a, b, names in (
      (t_ours, t_theirs, ["args_info", "out_info", "fun_name", "in_tree", "out_tree", "in_avals"]),
      (l_ours, l_theirs, ["args_info", "out_info", "in_tree", "out_tree", "in_avals",
                          "donate_argnums"]),
      (c_ours, c_theirs, ["args_info", "out_info", "in_tree", "out_tree", "in_avals",
                          "input_shardings", "output_shardings", "input_formats",
                          "output_formats", "donate_argnums"])):
    for name in names:
      assert str(getattr(a, name)) == str(getattr(b, name)), name
  assert l_ours.cost_analysis() is not None and c_ours.runtime_executable() is not None
  assert c_ours.memory_analysis().temp_size_in_bytes == 0
  out = c_ours(*args)
  assert all(x.is_deleted() for x in args)
  assert c_ours.plan.compiled and c_ours.plan.bytes_reused == 64
  np.testing.assert_array_equal(out[0], jax.jit(fun)(fresh(), fresh())[0])


@JITS
def test_jit_of_the_same_function_again_reuses_the_compiled_program(jit):
  traces = []

  def f(x):
    traces.append(1)
    return x + 1

  xs = [fresh(value=k) for k in range(3)]
  np.testing.assert_array_equal(jit(f)(xs[0]), np.full(8, 1.0))
  for k in (1, 2):  # jit(f) written inline in a loop: no new trace, no new compile
    out = []
    assert count_compiles(lambda: out.append(jit(f)(xs[k]))) == 0
    np.testing.assert_array_equal(out[0], np.full(8, k + 1.0))
  assert len(traces) == 1


def test_a_function_that_donates_nothing_shares_jax_jits_trace_cache():
  # jax.eval_shape(f) and then jax.jit(f) trace f once (JAX's test_eval_shape_trace_cache_share);
  # so does donate.jit(f) when it donates no argument: it traces as jax.jit(f) itself.
  def traced_once_after_eval_shape(jit):
    traces = []

    def f(x):
      traces.append(1)
      return x * 2

    x = fresh()
    jax.eval_shape(f, x)
    np.testing.assert_array_equal(jit(f)(x), np.full(8, 2.0))
    np.testing.assert_array_equal(jit(f)(fresh()), np.full(8, 2.0))
    return len(traces), jit(f).trace_count if jit is donate.jit else 1

  assert traced_once_after_eval_shape(jax.jit) == (1, 1)
  assert traced_once_after_eval_shape(donate.jit) == (1, 1)


def test_a_shared_trace_lends_no_donation_to_the_users_own_jax_jit():
  # donate.jit(h), donating nothing, traces h as jax.jit(h); the user's jax.jit(h,
  # donate_argnums=0) nested in a donate.jit stays a plain inner jit: its donation is ignored
  # unless adopt_inner_donation, as without donate.jit(h) before it.
  def h(b):
    return b * 2

  donate.jit(h)(fresh())
  inner = jax.jit(h, donate_argnums=0)
  g = donate.jit(lambda a: inner(a) + 1)
  a = fresh()
  np.testing.assert_array_equal(g(a), np.full(8, 3.0))
  assert not a.is_deleted()
  assert g.plan(a).decisions[0].action == "kept"


def test_the_wrapped_function_keeps_jax_jit_attributes():
  def documented(x):
    """Doubles x."""
    return x * 2

  g = donate.jit(documented, donate_argnums=0)
  assert g.__wrapped__ is documented and g.__name__ == "documented"
  assert g.__doc__ == "Doubles x."
  assert g._cache_size() == 0
  g(fresh())
  g(fresh(16))
  assert g._cache_size() == 2
  g.clear_cache()
  assert g._cache_size() == 0
  s = donate.jit(swapped_update, donate_argnums=(0, 1), copy_threshold=0)
  s(fresh(), fresh())
  assert s._cache_size() == 1


def scaled(x, scale):  # module level: pickled by reference
  return x * scale


def _as_a_function(jit):
  """What a user or a framework does with a jitted function as a Python object, by name: each
  answer is compared between `jax.jit` and `donate.jit` (a `functools.partial` subclass, a plain
  function or a bound method would each change one of these)."""
  x, s = fresh(value=2.0), fresh(value=3.0)
  g = jit(scaled, donate_argnums=0)

  jvp = jax.custom_jvp(jit(scaled))  # JAX binds keywords through the signature
  jvp.defjvp(lambda p, t: (scaled(*p), t[0] * p[1]))
  vjp = jax.custom_vjp(jit(scaled))
  vjp.defvjp(lambda x, scale: (scaled(x, scale), scale), lambda scale, ct: (ct * scale, ct * 0))

  class Scaler:  # hashable: its instances are the static `self` of a jitted method
    def __init__(self, by):
      self.by = by

    def __hash__(self):
      return hash(self.by)

    def __eq__(self, other):
      return isinstance(other, Scaler) and other.by == self.by

    apply = jit(lambda self, x: x * self.by, static_argnums=0)  # bound to the instance

  outer = jax.jit(lambda x: jit(scaled)(x, 2.0))
  return {
    "signature": str(inspect.signature(g)),
    "signature, the object's own": str(inspect.signature(g, follow_wrapped=False)),
    "__signature__": str(g.__signature__),
    "signature of a partial": str(inspect.signature(jit(functools.partial(scaled, scale=s)))),
    "__wrapped__": g.__wrapped__ is scaled,
    "a method descriptor (bound as a method)": inspect.ismethoddescriptor(g),
    "its type's name": type(g).__name__,
    "custom_jvp keyword": jvp(fresh(), scale=s),
    "custom_jvp jvp": jax.jvp(lambda x: jvp(x, scale=s), (fresh(),), (fresh(),))[1],
    "custom_vjp keyword grad": jax.grad(lambda x: vjp(x, scale=s).sum())(fresh()),
    "checkpoint keyword": jax.checkpoint(jit(scaled))(fresh(), scale=s),
    "tree_util.Partial": jax.tree_util.Partial(jit(scaled), scale=s)(fresh()),
    "method": Scaler(4.0).apply(fresh()),
    "name of a nested call": outer.trace(fresh()).jaxpr.eqns[0].params["name"],
    "JAX's debug info": jax.make_jaxpr(jit(scaled))(fresh(), s).jaxpr.debug_info.func_src_info,
    "called": g(x, s),
    "consumed": x.is_deleted(),
  }


def test_the_function_object_behaves_as_jax_jits_in_pythons_and_jaxs_protocols():
  ours, theirs = _as_a_function(donate.jit), _as_a_function(jax.jit)
  assert ours.keys() == theirs.keys()
  for what, expected in theirs.items():
    if isinstance(expected, jax.Array):
      np.testing.assert_array_equal(ours[what], expected, err_msg=what)
    else:
      assert str(ours[what]) == str(expected), what
  # and it pickles as the same function with the same keywords (`jax.jit`'s needs cloudpickle)
  g = pickle.loads(pickle.dumps(donate.jit(scaled, donate_argnums=0)))
  x = fresh(value=2.0)
  np.testing.assert_array_equal(g(x, 3.0), fresh(value=6.0))
  assert x.is_deleted()


def test_tools_that_look_at_a_jitted_function_see_one_as_jax_jits():
  """chex recognises a jitted function by its type's name (`asserts_internal.is_traceable`
  looks for `PjitFunction` in `str(type(f))`; flax, equinox and haiku test no type, equinox's
  module fields compare `type(jax.jit(f))` at import, which under the global patch is donate's).
  A `donate.jit` function is one, named as JAX's so that chex's `assert_max_traces` refuses to
  wrap it (it must be applied inside the jit) and counts the traces inside it, and its signature
  is read without following `__wrapped__` (`chex.fake_pmap`)."""
  g = donate.jit(scaled, donate_argnums=0)
  assert "PjitFunction" in str(type(g)) and "PjitFunction" in str(type(jax.jit(scaled)))
  assert isinstance(g, donate.transforms.JitWrapped)  # the documented type
  assert str(inspect.signature(g, follow_wrapped=False)) == "(x, scale)"
  assert inspect.signature(donate.transforms.JitWrapped).parameters.keys() == {"fun", "options"}


def test_chex_sees_a_donate_jit_function_as_a_jax_jit_one():
  chex = pytest.importorskip("chex")
  with chex.fake_pmap():
    out = jax.pmap(donate.jit(lambda x: x * 2.0))(jnp.ones((1, 3)))
  np.testing.assert_array_equal(out, jnp.full((1, 3), 2.0))
  for jit in (jax.jit, donate.jit):
    with pytest.raises(ValueError, match="must not wrap"):
      chex.assert_max_traces(jit(scaled), n=1)
  g = donate.jit(chex.assert_max_traces(lambda x: x + 1.0, n=1))
  g(fresh()), g(fresh())
  with pytest.raises(AssertionError, match="traced > 1"):
    g(fresh(4))


# ---- modes and configuration ------------------------------------------------------------------

@JITS
def test_disable_jit_runs_the_python_function(jit):
  seen = []

  def f(x):
    seen.append(type(x))
    return x * 2

  g = jit(f, donate_argnums=0)
  x = fresh()
  with jax.disable_jit():
    out = g(x)
  assert seen == [type(x)] and not x.is_deleted()  # no tracer, nothing donated
  np.testing.assert_array_equal(out, x * 2)


@JITS
def test_config_contexts_are_part_of_the_cache_key(jit):
  g = jit(lambda x, y: x + y)
  x, y = jnp.ones(3, jnp.float32), jnp.ones(3, jnp.int32)
  np.testing.assert_array_equal(g(x, y), jnp.full(3, 2.0))
  with jax.numpy_dtype_promotion("strict"):
    with pytest.raises(jax.dtypes.TypePromotionError, match="strict"):
      g(x, y)
  np.testing.assert_array_equal(g(x, y), jnp.full(3, 2.0))


@JITS
def test_negative_donate_argnums(jit):
  g = jit(lambda a, b: (a + 1, b * 2), donate_argnums=-1)
  a, b = fresh(), fresh()
  g(a, b)
  reference_a, reference_b = fresh(), fresh()
  jax.jit(lambda a, b: (a + 1, b * 2), donate_argnums=-1)(reference_a, reference_b)
  assert (a.is_deleted(), b.is_deleted()) == (reference_a.is_deleted(), reference_b.is_deleted())


# ---- warnings ---------------------------------------------------------------------------------

@JITS
def test_the_usual_warning_filter_silences_the_unusable_donation_warning(jit):
  g = jit(lambda x: x.sum(), donate_argnums=0)
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    g(fresh())
  assert not record


def test_no_warning_where_jax_jit_gives_none_and_one_per_compile_where_it_does():
  def warnings_of(jit, fun, *args):
    with warnings.catch_warnings(record=True) as record:
      warnings.simplefilter("always")
      jit(fun, donate_argnums=0)(*args)
    return [str(r.message) for r in record]

  for fun in (lambda x: x + 1, lambda x: (x.sum(), x[:2])):
    theirs, ours = warnings_of(jax.jit, fun, fresh()), warnings_of(donate.jit, fun, fresh())
    assert len(ours) == len(theirs) <= 1
    for t, o in zip(theirs, ours):
      assert t.split(":")[0] == o.split(":")[0] == "Some donated buffers were not usable"


def test_a_donated_host_value_no_output_can_reuse_is_warned_about_as_jax_jit_warns():
  """`jax.jit` donates a host value's copy on the device (a numpy array, a Python or numpy
  scalar), and warns when no output can reuse it; one an output can take gives no warning."""
  def warnings_of(jit, fun, host):
    with warnings.catch_warnings(record=True) as record:
      warnings.simplefilter("always")
      out = jit(fun, donate_argnums=(0, 1))(host, fresh())
    return [str(r.message).split("\n")[0] for r in record], np.asarray(out[0])

  cases = [  # (function, host value, the warned leaf's type and path, or None: no warning)
    (lambda s, b: (b * 2 + s.sum(),), np.ones(3, np.float32), "float32[3] (s)"),
    (lambda s, b: (b * s,), 3, "int32[] (s)"),
    (lambda s, b: (b * s,), np.float32(2.0), "float32[] (s)"),
    (lambda s, b: (b * s, s + 1), 3, None),  # out[1] reuses the scalar's copy
    # One output for two: first come, first served gives it the host value's copy, as jax.jit.
    (lambda s, b: (b * 2 + s,), np.ones(8, np.float32), "float32[8] (b)"),
  ]
  for fun, host, warned in cases:
    (theirs, expected), (ours, got) = (warnings_of(j, fun, host) for j in (jax.jit, donate.jit))
    np.testing.assert_array_equal(got, expected)
    assert len(ours) == len(theirs) == (warned is not None)
    if warned is not None:
      aval = warned.split(" ")[0]
      assert theirs[0].replace("~", "") == f"Some donated buffers were not usable: {aval}."
      assert ours[0] == f"Some donated buffers were not usable: {warned}."
  h = np.ones(3, np.float32)
  with pytest.warns(donate.UnusableDonationWarning, match=r"float32\[3\] \(s\)"):
    plan = donate.jit(cases[0][0], donate_argnums=(0, 1)).plan(h, fresh())
  assert [str(d.action) for d in plan.decisions] == ["unusable", "aliased"]
  assert plan.decisions[0].cause == donate.Cause.NOT_A_DEVICE_BUFFER
  assert "its copy on the device is donated" in plan.decisions[0].reason
  np.testing.assert_array_equal(h, np.ones(3, np.float32))  # never consumed


# ---- errors -----------------------------------------------------------------------------------

def test_the_same_buffer_twice_raises_what_jax_jit_raises_on_first_and_cached_calls():
  def errors(jit):
    found = []
    for warm in (False, True):
      g = jit(lambda a, b: (a + b, b * 2), donate_argnums=0)
      if warm:
        g(fresh(), fresh())
      x = fresh()
      with pytest.raises(Exception) as info:
        g(x, x)
      assert not x.is_deleted()
      found.append(info.value)
    return found

  for theirs, ours in zip(errors(jax.jit), errors(donate.jit)):
    assert isinstance(ours, type(theirs)) and isinstance(ours, donate.DonationError)


def test_duplicate_error_names_the_function_and_both_paths():
  def update(params, grads):
    return jax.tree.map(lambda p, g: p - g, params, grads)

  g = donate.jit(update, donate_argnums=0)
  x = fresh()
  for _ in range(2):  # first call, then the cached one
    with pytest.raises(donate.DonationError, match=r"passed twice to .*update, once as "
                       r"params\['w'\] and once as grads\['w'\]"):
      g({"w": x}, {"w": x})
    g({"w": fresh()}, {"w": fresh()})


@JITS
def test_unhashable_static_argument_is_a_value_error(jit):
  g = jit(lambda x, n: x * len(n), static_argnums=1)
  with pytest.raises(ValueError, match="Non-hashable static arguments are not supported"):
    g(fresh(), [1, 2])


@JITS
def test_overlapping_static_and_donated_names_is_a_value_error(jit):
  with pytest.raises(ValueError, match="static_argnames and donate_argnames cannot intersect"):
    jit(lambda x: x, static_argnames="x", donate_argnames="x")


@JITS
def test_a_non_array_argument_is_a_type_error_naming_the_function_and_path(jit):
  def my_step(params, x):
    return x

  with pytest.raises(TypeError, match=r"my_step.*path params\['lr'\]"):
    jit(my_step, donate_argnums=0)({"lr": "fast"}, fresh())


@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
@pytest.mark.parametrize("at", ["first", "cached"])
def test_calling_with_an_abstract_value_names_the_argument_as_jax_jit_does(fun, at):
  """A `jax.ShapeDtypeStruct` passed to a call (not to `lower`) is a TypeError naming the argument
  leaf and its aval, on every path a signature runs by (the re-laid-out one runs its compiled
  program, whose own error names neither), and the array beside it is not consumed."""
  n = 1 << 14  # above the copy threshold: the swapped update is re-laid out
  seen = []
  for jit in (jax.jit, donate.jit):
    f = jit(lambda a, b: fun(a, b["w"]), donate_argnums=(0, 1))
    if at == "cached":
      f(fresh(n), {"w": fresh(n)})
    x = fresh(n)
    with pytest.raises(TypeError) as info:
      f(x, {"w": jax.ShapeDtypeStruct((n,), jnp.float32)})
    seen.append((type(info.value), str(info.value), x.is_deleted()))
  assert seen[0] == seen[1]
  assert seen[1][1] == (
    "Argument 'b['w']' of shape float32[16384] of type <class 'jax.ShapeDtypeStruct'> is not a valid "
    "JAX type."
  )
  assert seen[1][2] is False

# ---- shardings --------------------------------------------------------------------------------

@JITS
def test_an_uncommitted_array_with_in_shardings(jit):
  row = NamedSharding(mesh8(), P("x"))
  g = jit(lambda a: a * 2, in_shardings=row, donate_argnums=0)
  a = jnp.arange(64.0)
  out = g(a)
  assert out.sharding == row
  np.testing.assert_array_equal(out, jnp.arange(64.0) * 2)


def test_a_replicated_donated_input_with_a_sharded_output_is_not_usable_not_an_error():
  m = mesh8()
  row, rep = NamedSharding(m, P("x")), NamedSharding(m, P())
  f = lambda a: a + 1
  a = jax.device_put(jnp.arange(64.0), rep)
  with pytest.warns(UserWarning, match="Some donated buffers were not usable"):
    expect = jax.jit(f, donate_argnums=0, out_shardings=row)(a)
  g = donate.jit(f, donate_argnums=0, out_shardings=row)
  with pytest.warns(donate.UnusableDonationWarning, match=r"sharding differs \(in P\(\), "
                    r"out P\('x'\)\)"):
    out = g(a)
  assert not a.is_deleted() and out.sharding == row
  np.testing.assert_array_equal(out, expect)
  with pytest.raises(donate.DonationError, match="sharding differs"):
    donate.jit(f, donate_argnums=0, out_shardings=row, strict=True)(a)


@JITS
def test_xla_choosing_an_output_sharding_unlike_the_input_is_not_an_error(jit):
  m = mesh8()
  row, rep = NamedSharding(m, P("x")), NamedSharding(m, P())
  g = jit(lambda a: jax.lax.with_sharding_constraint(a[::-1], rep) + 1, donate_argnums=0)
  c = jax.device_put(jnp.arange(64.0), row)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    out = g(c)
  assert out.sharding.is_equivalent_to(rep, 1)
  np.testing.assert_array_equal(out, jnp.arange(64.0)[::-1] + 1)


def test_plan_table_has_a_sharding_column_and_fits_100_columns():
  row = NamedSharding(mesh8(), P("x"))
  g = donate.jit(lambda params, x: (jax.tree.map(lambda p: p * x.sum(), params), x),
                 donate_argnums=0)
  params = {"encoder": {"layer_0": {"attention": {"kernel": jax.device_put(jnp.ones(64), row)}}}}
  text = str(g.plan(params, fresh()))
  assert "P('x')" in text and "cpu:0" in text
  assert max(map(len, text.splitlines())) <= 100


# ---- the behaviours JAX's own donation tests check (api_test.py, pjit_test.py) ---------------

@JITS
@pytest.mark.parametrize("how", [dict(donate_argnums=(2, 3)), dict(donate_argnames=("c", "d"))])
def test_donation_with_static_arguments_before_it(jit, how):
  f = jit(lambda a, b, c, d: (a + b + c, a + b + d), static_argnums=(0, 1), **how)
  c, d = fresh(2, 2.0), fresh(4, 1.0)
  e, g = f(1, 2, c, d)
  assert c.is_deleted() and d.is_deleted()
  np.testing.assert_array_equal(e, np.full(2, 5.0))
  np.testing.assert_array_equal(g, np.full(4, 4.0))


@JITS
def test_donate_argnames_with_keyword_call_and_static_argnums(jit):
  f = jit(lambda a, b, c, d, e: (a + b + c, a + b + d, a + b + e), static_argnums=(0, 1),
          donate_argnames=("d", "e"))
  c, d, e = fresh(2, 2.0), fresh(4, 1.0), fresh(4, 3.0)
  f(1, 2, c, d=d, e=e)
  assert not c.is_deleted() and d.is_deleted() and e.is_deleted()


@JITS
def test_a_weakly_typed_donated_input_is_consumed(jit):
  x = jnp.broadcast_to(2, (3,))  # weak type in, strong type out
  jit(lambda x: x.astype(int), donate_argnums=0)(x)
  assert x.is_deleted()


@JITS
def test_donate_argnums_and_argnames_together(jit):
  f = jit(lambda a, b, c: (a * 2, b * 2, c * 2), donate_argnums=0, donate_argnames=("b", "c"))
  x, y, z = (jnp.ones((2, 5)) * k for k in (4, 2, 1))
  f(x, b=y, c=z)
  assert x.is_deleted() and y.is_deleted() and z.is_deleted()


@JITS
@pytest.mark.parametrize("how", [dict(donate_argnames=("z", "y")), dict(donate_argnums=(0, 1))])
def test_args_info_says_which_python_scalars_are_donated(jit, how):
  f = jit(lambda z, y, x: (z, y, x), **how)
  args_info, kwargs_info = f.lower({"c": 3.0}, y={"b": 2.0}, x={"a": 1.0}).args_info
  assert args_info[0]["c"].donated and kwargs_info["y"]["b"].donated
  assert not kwargs_info["x"]["a"].donated


@JITS
def test_nested_jax_jit_donation_is_ignored(jit):
  a = jax.device_put(jnp.array(1))
  out = jit(lambda x: jax.jit(lambda y: y ** 2, donate_argnums=0)(x))(a)
  assert not a.is_deleted() and int(out) == 1


@JITS
def test_sharded_donation_with_names_kwargs_and_inferred_output_shardings(jit):
  mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])
  s, rs = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
  tree = lambda n, k: jax.device_put({"a": {"b": np.ones((2, n)) * k}, "c": np.ones((2, n)) * k}, s)
  f = jit(lambda a, b, c: jax.tree.map(lambda x, y, z: x + y + z, a, b, c), out_shardings=s,
          donate_argnames="b")
  x, y, z = tree(5, 4), tree(5, 2), tree(5, 1)
  out = f(x, b=y, c=z)
  jax.tree.map(lambda o: np.testing.assert_array_equal(o, np.full((2, 5), 7.0)), out)
  assert [l.is_deleted() for l in jax.tree.leaves((x, y, z))] == [False] * 2 + [True] * 2 + [
      False] * 2
  g = jit(lambda p, q, r: (jax.lax.with_sharding_constraint(p, rs), p,
                           jax.lax.with_sharding_constraint(q, rs), q,
                           jax.lax.with_sharding_constraint(r, rs), r),
          donate_argnames=("q", "r"))
  x, y, z = tree(5, 4), tree(7, 2), tree(11, 1)
  g(x, y, z)
  assert not any(l.is_deleted() for l in jax.tree.leaves(x))
  assert all(l.is_deleted() for l in jax.tree.leaves((y, z)))


@JITS
def test_a_sharded_donated_input_nothing_can_reuse_stays_alive_silently(jit):
  mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])
  x = jax.device_put(np.arange(16).reshape(8, 2), NamedSharding(mesh, P("x")))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # jax.jit gives no warning here: XLA decides, and declines
    jit(lambda x: x @ x.T, donate_argnames="x")(x)
  assert not x.is_deleted()


@JITS
def test_lowered_and_compiled_report_the_donated_argnums(jit):
  f = jit(lambda *args: args[0] + 4.0, donate_argnums=(0,))
  lowered = f.lower(1.0, 1.0)
  assert lowered.donate_argnums == lowered.compile().donate_argnums == (0,)


# ---- transformations around and inside donate.jit --------------------------------------------

@JITS
def test_transformations_of_an_inner_jit_inside_an_outer_one(jit):
  f = jit(lambda x: x * x)
  assert float(jit(jax.grad(f))(3.0)) == 6.0
  assert float(jit(jax.jacfwd(f))(3.0)) == 6.0 and float(jit(jax.jacrev(f))(3.0)) == 6.0
  seen = []

  def h(x):
    seen.append(x.shape)
    return x * 2

  out = jit(jax.vmap(jit(h)))(jnp.ones((3, 4)))
  assert out.shape == (3, 4) and seen == [(4,)]


@JITS
def test_shaped_array_arguments_lower_like_abstract_values(jit):
  aval = jax.core.ShapedArray((8,), jnp.float32)
  lowered = jit(lambda x: x * 2.0, donate_argnums=0).lower(aval)
  assert lowered.compile()(fresh()).shape == (8,)


@JITS
def test_escaped_tracers_raise_jax_errors(jit):
  leaked = []
  jax.jit(lambda x: leaked.append(x) or x)(1.0)
  with pytest.raises(jax.errors.UnexpectedTracerError):
    jit(lambda y: y + leaked[0])(1.0)


def test_a_new_signature_planned_on_the_way_keeps_jax_jits_cpp_dispatch():
  # JAX's own counter of calls that miss its C++ dispatch (only its test utilities expose it).
  from jax._src import test_util as jtu
  threes, fours = [fresh(3) for _ in range(8)], [fresh(4) for _ in range(8)]
  f = donate.jit(lambda x: x + 1, donate_argnums=0)
  f(threes.pop())
  with jtu.count_pjit_cpp_cache_miss() as count:
    f(fours.pop())  # a new signature: planned by donate, then compiled
    assert count() == 1
    for _ in range(3):
      f(fours.pop())
    f(threes.pop())  # the other signature's entry stays: no miss
    f(threes.pop())
    assert count() == 1
  # Re-paired: the compiled program with the plan's aliases makes its own entry in the same
  # dispatch, and a new signature is planned, lowered from the gate's trace and compiled without
  # running anything through jax.jit's own dispatch.
  s = donate.jit(swapped_update, donate_argnums=(0, 1))
  big = lambda n: jnp.arange(2.0**16 + n)
  s(big(3), big(3))
  fresh_pairs = [(big(4), big(4)) for _ in range(3)]
  with jtu.count_pjit_cpp_cache_miss() as count:
    for a, b in fresh_pairs:
      x, y = s(a, b)
    assert count() == 0
  programs = [sig.program for sig in s._prepared.values()]
  assert len(programs) == 2 and all(p.prep.realiased for p in programs)


def test_the_lowered_module_carries_jax_jits_source_locations():
  """donate's own frames (its gate, its planning) are hidden as JAX's are: the lowered module,
  locations included, is the one `jax.jit` lowers, and none of them names a donate file."""
  def step(x):
    return jnp.sin(x) * 2.0 + 1.0

  x = jnp.ones(8)
  texts = [jit(step, donate_argnums=0).lower(x).as_text(debug_info=True)
           for jit in (jax.jit, donate.jit)]
  assert texts[0] == texts[1]
  assert "donate/_jit/" not in texts[1] and "gate.py" not in texts[1]
  assert "test_dropin.py" in texts[1]


@pytest.mark.parametrize("jit", [jax.jit, donate.jit])
def test_a_deleted_input_at_the_first_call_raises_jaxs_error(jit):
  x = jnp.arange(8.0)
  x.delete()
  with pytest.raises(RuntimeError, match="Array has been deleted"):
    jit(lambda a: a * 2)(x)
  sharded = jax.device_put(jnp.arange(8.0), NamedSharding(jax.make_mesh((1,), ("x",)), P("x")))
  sharded.delete()
  with pytest.raises(RuntimeError, match="Array has been deleted"):
    jit(lambda a: a + 1, donate_argnums=0)(sharded)


@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
def test_a_buffer_a_numpy_view_holds_is_donated_as_in_jax_jit(fun):
  """On CPU `np.asarray(x)` is a view of x's buffer. Whether the runtime then consumes x is the
  runtime's (it keeps x alive up to jaxlib 0.12.0.1, consumes it from 0.12.1); donate.jit does as
  jax.jit does, the view stays valid under both, and the results are the same."""
  seen = []
  for jit in (jax.jit, donate.jit):
    extra = {"copy_threshold": 0} if jit is donate.jit else {}
    a, b = fresh() + 0.0, fresh(value=2.0) + 0.0
    view = np.asarray(a)
    out = jit(fun, donate_argnums=(0, 1), **extra)(a, b)
    assert b.is_deleted()
    np.testing.assert_array_equal(view, np.ones(8, np.float32))
    seen.append((a.is_deleted(), [np.asarray(x) for x in out]))
  (theirs, their_out), (ours, our_out) = seen
  assert ours == theirs
  for x, y in zip(their_out, our_out, strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
@pytest.mark.parametrize("signatures", [1, 2])
def test_a_donated_input_passed_again_to_a_cached_call_raises_jaxs_error(fun, signatures):
  """A cached call of jax.jit raises its dispatch's error for a consumed buffer; so does every
  path of donate.jit (not the error of tracing the call anew)."""
  errors = []
  for jit in (jax.jit, donate.jit):
    extra = {"copy_threshold": 0} if jit is donate.jit else {}
    g = jit(fun, donate_argnums=(0, 1), **extra)
    if signatures == 2:
      g(fresh(4), fresh(4))
    a = fresh()
    g(a, fresh())
    with pytest.raises(Exception) as info:
      g(a, fresh())
    errors.append((type(info.value), str(info.value)))
  assert errors[0][0] in (ValueError, RuntimeError)  # XLA's (jax 0.10) or JAX's (0.12) check
  assert errors[1] == errors[0]


def _swapped_big(jit):
  extra = {"copy_threshold": 0} if jit is donate.jit else {}
  return jit(swapped_update, donate_argnums=(0, 1), **extra)


@JITS
def test_a_cached_signature_follows_the_default_device_as_jax_jit_does(jit):
  """The dispatch is keyed by JAX's jit-keyed configs: a program compiled for another default
  device is not reused outside that context (it would run there and copy, not donate)."""
  f = _swapped_big(jit)
  with jax.default_device(jax.devices()[2]):
    inside = f(fresh(), fresh())
  a, b = fresh(), fresh()
  out = f(a, b)
  assert inside[0].devices() == {jax.devices()[2]}
  assert out[0].devices() == out[1].devices() == {jax.devices()[0]}
  assert a.is_deleted() and b.is_deleted()


@JITS
def test_debug_nans_applies_to_a_cached_signature_as_in_jax_jit(jit):
  f = _swapped_big(jit)
  f(fresh(), fresh())
  with jax.debug_nans(True), pytest.raises(FloatingPointError):
    f(fresh(), fresh(value=np.inf) * 0.0)


def test_a_re_paired_signature_keeps_its_pairs_after_a_native_one_of_the_same_structure():
  """Two signatures of one pytree structure, one re-paired (big buffers) and one native (under
  copy_threshold): each runs its own program, whichever ran last."""
  f = donate.jit(swapped_update, donate_argnums=(0, 1))
  for n in (2**16, 8, 2**16, 8, 2**16):
    a, b = fresh(n), fresh(n)
    pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
    x, y = f(a, b)
    if n > 8:  # the plan's in-place pairs: out[0] in b's buffer, out[1] in a's
      assert (x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()) == (pb, pa)
    assert a.is_deleted() and b.is_deleted()
    np.testing.assert_array_equal(x, jax.jit(swapped_update)(fresh(n), fresh(n))[0])


@JITS
def test_a_donated_host_value_beside_a_re_paired_buffer(jit):
  """A numpy argument in donate_argnums is copied to the device and that copy donated; the
  re-paired program gives its first-come output to another leaf, and compiles."""
  f = _swapped_big(jit)
  host, b = np.ones(8, np.float32), fresh()
  x, y = f(host, b)
  np.testing.assert_array_equal(x, jax.jit(swapped_update)(fresh(), fresh())[0])
  np.testing.assert_array_equal(y, np.full(8, 2.0))
  assert b.is_deleted() and host.sum() == 8


@pytest.mark.parametrize("fun", [step, swapped_update], ids=["native", "re-laid-out"])
def test_a_program_with_host_callbacks_is_found_again_by_the_calls_key(fun):
  """No C++ entry can run a program with host callbacks (`jax.jit` runs it from Python too):
  donate finds it again by the call's key, default device included."""
  seen = []

  def logged(x, y):
    jax.debug.callback(lambda: seen.append(1))
    return fun(x, y)

  f = donate.jit(logged, donate_argnums=(0, 1), copy_threshold=0)
  with jax.default_device(jax.devices()[3]):
    inside = f(fresh(), fresh())
  for _ in range(3):
    a, b = fresh(), fresh()
    out = f(a, b)
    assert out[0].devices() == {jax.devices()[0]} and a.is_deleted() and b.is_deleted()
  assert inside[0].devices() == {jax.devices()[3]}
  assert len(seen) == 4 and f.trace_count == 2  # a trace per default device, as JAX keys them
  assert len(f._no_entry) == 2  # one program a device: the later calls found it again
  np.testing.assert_array_equal(out[0], jax.jit(fun)(fresh(), fresh())[0])


def test_a_signature_whose_first_call_raised_gets_its_cpp_entry_later(monkeypatch):
  """JAX's dispatch keeps an entry whose first call raised on the Python path for good; donate
  drops it, so the signature's later calls run without Python."""
  from donate._jit.wrapper import JitWrapped

  g = donate.jit(lambda p, q: (p + 1.0, q + 1.0), donate_argnums=0)
  x = fresh()
  with pytest.raises(donate.DonationError):
    g(x, x)  # one buffer donated and read: named before anything runs
  misses = []
  miss = JitWrapped._answered  # the first thing every miss does
  monkeypatch.setattr(JitWrapped, "_answered", lambda self, a, k: misses.append(1) or miss(self, a, k))
  for _ in range(3):
    g(fresh(), fresh())
  assert len(misses) == 1


def test_donate_jit_written_inline_runs_from_the_shared_cpp_entries(monkeypatch):
  """Every donate.jit of one function and options shares the dispatch's entries, as every
  jax.jit of a function shares jax.jit's; other donate options do not."""
  from donate._jit.wrapper import JitWrapped

  def swap(a, b):  # a function of this test's own: no other test made entries for it
    return swapped_update(a, b)

  misses = []
  miss = JitWrapped._answered  # the first thing every miss does
  monkeypatch.setattr(JitWrapped, "_answered", lambda self, a, k: misses.append(1) or miss(self, a, k))
  for _ in range(3):
    donate.jit(swap, donate_argnums=(0, 1))(fresh(), fresh())
  assert len(misses) == 1
  a, b = fresh(), fresh()
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  x, y = donate.jit(swap, donate_argnums=(0, 1), copy_threshold=0)(a, b)
  assert len(misses) == 2  # its own plan: re-paired, b's buffer for out[0], a's for out[1]
  assert (x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()) == (pb, pa)


def test_a_signature_with_nothing_donated_is_lowered_once_by_jaxs_own_miss(monkeypatch):
  """Nothing donated or marked: the call runs through jax.jit's own miss, which lowers and
  compiles the program once; donate lowers it only when a plan or stage is asked for."""
  from donate._jit.signature import Prepared

  lowered = []
  lower = Prepared.lower
  monkeypatch.setattr(Prepared, "lower", lambda self, *a, **k: lowered.append(1) or lower(self, *a, **k))

  def add(x, y):  # uncommitted host values, then uncommitted arrays: two signatures, as in JAX
    return x + y

  f = donate.jit(add)
  a = np.arange(3.0, dtype=np.float32)
  out = f(a, a)
  out2 = f(out, out)
  np.testing.assert_array_equal(out2, jax.jit(add)(jax.jit(add)(a, a), jax.jit(add)(a, a)))
  assert not out._committed and not out2._committed and f._cache_size() == 2
  assert lowered == []
  (d, _), g = f.plan(out, out).decisions, donate.jit(add, donate_argnums=0)
  assert str(d.action) == "kept" and len(lowered) == 1
  x = fresh()
  g(x, fresh())
  assert x.is_deleted() and len(lowered) == 2  # a donation: donate lowers, compiles and checks it


@JITS
def test_a_wrapper_made_with_functools_wraps_keeps_its_own_stages(jit):
  """`functools.wraps` and `jax.jit` copy a function's attributes onto the wrapper: nothing of
  donate's that runs the inner function may come with them (its stages would ignore the
  wrapper: a silently wrong result). donate's methods live on its class, not on the object."""
  import functools

  g = jit(lambda x: x * 2)

  @functools.wraps(g)
  def wrapper(x):
    return g(x) + 100.0

  outer = (jax.jit, donate.jit)  # donate.jit outside too: a framework under `jax.jit = donate.jit`
  for h in [o(f, **kw) for o in outer for f, kw in ((wrapper, {}), (g, {"donate_argnums": 0}))]:
    x = fresh()
    want = np.asarray(h(fresh()))
    np.testing.assert_array_equal(h.lower(x).compile()(x), want)
    np.testing.assert_array_equal(jax.eval_shape(h, x).shape, want.shape)
  assert "jit" in str(jax.make_jaxpr(g)(fresh()))  # a call of the function, as for jax.jit


def _frames(jit, mode, marked=False):
  """The (file, function) frames of the traceback a user sees when the function raises (and
  those marked `__tracebackhide__` too, `marked`)."""
  import traceback

  @jit
  def innermost(x):
    raise AssertionError("inside")

  @jit
  def outermost(x):
    return 2 + innermost(x)

  before = jax.config.jax_traceback_filtering
  jax.config.update("jax_traceback_filtering", mode)
  try:
    outermost(jnp.ones(2))
  except AssertionError as e:
    error = e
  finally:
    jax.config.update("jax_traceback_filtering", before)
  walked = [f for f, _ in traceback.walk_tb(error.__traceback__)]
  if mode == "tracebackhide" and not marked:  # (IPython and pytest hide the frames so marked)
    walked = [f for f in walked if "__tracebackhide__" not in f.f_locals]
  return [(f.f_code.co_filename, f.f_code.co_name) for f in walked], error


@pytest.mark.parametrize("mode", ["remove_frames", "quiet_remove_frames", "tracebackhide"])
def test_a_filtered_traceback_starts_at_the_users_call_as_in_jax_jit(mode):
  theirs, _ = _frames(jax.jit, mode)
  ours, error = _frames(donate.jit, mode)
  assert ours == theirs
  assert [name for _, name in ours] == ["_frames", "outermost", "innermost"]
  assert not any("/donate/" in f for f, _ in ours)
  if mode == "remove_frames":  # JAX's unfiltered trace is the cause, as for jax.jit
    assert type(error.__cause__).__name__ == "UnfilteredStackTrace"


@pytest.mark.parametrize("mode", ["remove_frames", "quiet_remove_frames"])
@pytest.mark.parametrize("donated", [(), (0,)])
def test_an_error_below_a_jitted_jax_function_is_filtered_once_as_in_jax_jit(mode, donated):
  # jnp's matmul is a jax.jit function whose boundary, seeing none above it in donate's miss,
  # filters first: JAX's note (or its unfiltered trace) is still given once, as by jax.jit
  import traceback

  def seen(jit):
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", mode)
    try:
      jit(lambda x: x[:2] @ x[:3], donate_argnums=donated)(jnp.ones(3))
    except TypeError as e:
      chain, cause = [], e.__cause__
      while cause is not None:
        chain.append(type(cause).__name__)
        cause = cause.__cause__
      frames = [f.name for f in traceback.extract_tb(e.__traceback__)]
      return str(e), getattr(e, "__notes__", []), chain, frames
    finally:
      jax.config.update("jax_traceback_filtering", before)

  theirs = seen(jax.jit)
  assert seen(donate.jit) == theirs
  assert len(theirs[1]) == (mode == "quiet_remove_frames") and len(theirs[2]) == (mode != "quiet_remove_frames")


def test_tracebackhide_marks_frames_as_in_jax_jit_and_removes_none():
  # "tracebackhide" marks the hidden frames and removes none: a traceback has as many frames as
  # with filtering off (flax's traceback_util_test test_dynamic_exclusion counts them)
  for jit in (jax.jit, donate.jit):
    marked, _ = _frames(jit, "tracebackhide", marked=True)
    assert marked == _frames(jit, "off")[0]
  assert len(marked) > len(_frames(donate.jit, "tracebackhide")[0])


def test_the_function_runs_as_many_frames_below_the_call_as_under_jax_jit():
  # JAX's api_test test_jit_traceback counts them: the dispatch's miss traces in its own frame,
  # as jax.jit's does, and filters the traceback there (no boundary frame of its own)
  import inspect

  def depth(jit):
    seen = []
    f = jit(lambda x: seen.append(len(inspect.stack())) or x * 2.0)
    start = len(inspect.stack())
    f(jnp.ones(3))
    f(jnp.ones(3))  # (cached: not traced again)
    return [n - start for n in seen]

  assert depth(donate.jit) == depth(jax.jit) and len(depth(jax.jit)) == 1


def _python_run_by(call) -> list[str]:
  """The Python functions of donate's package that `call()` runs (`sys.setprofile`)."""
  import os
  import sys

  package = os.path.dirname(os.path.abspath(donate.__file__)) + os.sep
  seen = []

  def profile(frame, event, arg):
    if event == "call" and os.path.abspath(frame.f_code.co_filename).startswith(package):
      seen.append(frame.f_code.co_name)

  sys.setprofile(profile)
  try:
    call()
  finally:
    sys.setprofile(None)
  return seen


def test_a_cached_call_is_the_cpp_dispatch_alone_until_the_function_consumes_a_buffer():
  # JAX records the Python stack of every call it runs, so a frame of donate's before the
  # dispatch costs each cached call more than the dispatch does; one is kept only where it
  # names an array passed twice (JAX rejects it inside the dispatch)
  plain = donate.jit(lambda x, y: (x * 2.0, y + 1.0))
  donating = donate.jit(lambda x, y: (x * 2.0, y + 1.0), donate_argnums=0)
  for f in (plain, donating):
    f(fresh(), fresh())
  assert _python_run_by(lambda: plain(fresh(), fresh())) == []
  assert _python_run_by(lambda: donating(fresh(), fresh())) == ["call"]  # `_checked`'s
  x = fresh()
  np.testing.assert_array_equal(plain(x, x)[0], jax.jit(lambda x: x * 2.0)(x))
  with pytest.raises(donate.DonationError, match=r"passed twice to .*, once as x and once as y"):
    donating(x, x)
  assert not x.is_deleted()


def test_a_function_that_donates_only_through_a_marker_names_an_array_passed_twice_when_cached():
  g = donate.jit(lambda p, q: donate.donate_buffer(p) * 2.0 + q)
  assert _python_run_by(lambda: g(fresh(), fresh()))  # the first call plans
  a = fresh()
  g(a, fresh())
  assert a.is_deleted()  # the marker consumed it
  x = fresh()
  for _ in range(2):  # cached
    with pytest.raises(donate.DonationError, match=r"passed twice to .*, once as p and once as q"):
      g(x, x)
  assert not x.is_deleted()


def test_every_function_sharing_the_entries_of_one_that_consumes_names_an_array_passed_twice():
  def step(p, q):  # a function of this test's own: no other test made entries for it
    return p * 2.0 + q, q + 1.0

  early = donate.jit(step, donate_argnums=0)  # made before anything was planned
  donate.jit(step, donate_argnums=0)(fresh(), fresh())  # plans: the shared entry consumes p
  later = donate.jit(step, donate_argnums=0)
  x = fresh()
  for g in (early, later):  # neither has planned: their calls run the shared entry
    assert _python_run_by(lambda: g(fresh(), fresh())) == ["call"]
    with pytest.raises(donate.DonationError, match=r"passed twice to .*step, once as p and once "
                       r"as q"):
      g(x, x)
  assert not x.is_deleted()


def test_a_nan_found_by_debug_nans_after_cached_calls_raises_as_in_jax_jit():
  for jit in (jax.jit, donate.jit):
    f = jit(lambda x: 0.0 / x)
    x = jnp.array(0.0)
    f(x), f(x)  # cached: the C++ dispatch runs it, and JAX's NaN check runs after it
    with pytest.raises(FloatingPointError):
      with jax.debug_nans(True):
        f(x).block_until_ready()
