"""`jax.Ref` arguments under `donate.jit`: they behave as under `jax.jit` (results, ref contents,
exception types), the plan lists each ref leaf as written back in place, no output is paired with
a ref's buffer, and donated arrays beside refs are consumed and aliased as planned. JAX lowers a
ref as an extra result aliased to its parameter; closed-over refs as an extra parameter too."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import donate
from donate._base import compat as _compat
from donate._plan.donation_plan import REF, WRITTEN_BACK

JITS = {"jax.jit": jax.jit, "donate.jit": donate.jit}


def aliases(compiled) -> dict[int, int]:
  """{parameter: output} from the compiled program's input_output_alias."""
  line = re.search(r"input_output_alias=\{([^\n]*)", compiled.as_text())
  found = re.findall(r"\{(\d+)\}:\s*\((\d+),", line.group(1)) if line else []
  return {int(p): int(o) for o, p in found}


def add_and_double(r, x):
  r[...] += x
  return x * 2


def swapped_beside_ref(r, a, b):
  r[...] += a
  return b.at[0].set(1.0), a + 1.0


def test_ref_argument_reads_and_writes_as_under_jax_jit():
  for f in (lambda r, x: r[...] * x, add_and_double):
    got_ref, want_ref = jax.new_ref(jnp.ones(4)), jax.new_ref(jnp.ones(4))
    got = donate.jit(f)(got_ref, jnp.arange(4.0))
    want = jax.jit(f)(want_ref, jnp.arange(4.0))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_ref[...], want_ref[...])
  # Called again: the cached signature writes the same ref again.
  r = jax.new_ref(jnp.zeros(4))
  g = donate.jit(add_and_double)
  for _ in range(3):
    g(r, jnp.ones(4))
  np.testing.assert_array_equal(r[...], jnp.full(4, 3.0))


def test_plan_lists_ref_leaves_as_written_back_in_place():
  plan = donate.jit(add_and_double, donate_argnums=1).plan(jax.new_ref(jnp.zeros(4)), jnp.ones(4))
  ref, x = plan.decisions
  assert (ref.path, ref.action, ref.reason, ref.output, ref.consumed) == (
      "r", REF, WRITTEN_BACK, None, False)
  assert (x.action, x.output) == ("aliased", "out")
  text = str(plan)
  assert "  ref      16 B   float32[4]  cpu:0     r\n      ref: written back in place\n" in text
  assert "<b>ref</b>" in plan._repr_html_()
  assert plan.aliases == {"out": "x"}
  # A ref the function never touches: nothing is written back.
  plan = donate.jit(lambda r, x: x + 1).plan(jax.new_ref(jnp.zeros(4)), jnp.ones(4))
  assert plan.decisions[0].reason == "ref: the computation does not use it"


def test_donated_arrays_beside_a_ref_pair_by_dataflow():
  f = donate.jit(swapped_beside_ref, donate_argnums=(1, 2), copy_threshold=0)
  r, a, b = jax.new_ref(jnp.zeros(4)), jnp.arange(4.0), -jnp.arange(4.0)
  want_r = jax.new_ref(jnp.zeros(4))
  want = jax.jit(swapped_beside_ref)(want_r, jnp.arange(4.0), -jnp.arange(4.0))
  plan = f.plan(r, a, b)
  assert plan.aliases == {"out[0]": "b", "out[1]": "a"}
  assert [d.action for d in plan.decisions] == [REF, "aliased", "aliased"]
  compiled = f.lower(r, a, b).compile()
  # The results keep the user's order: b (parameter 2) -> out[0], a (parameter 1) -> out[1]; the
  # ref (parameter 0) is written back through the extra last result, never a user output.
  assert aliases(compiled) == {2: 0, 1: 1, 0: 2}
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  x, y = f(r, a, b)
  assert a.is_deleted() and b.is_deleted()
  assert x.unsafe_buffer_pointer() == pb and y.unsafe_buffer_pointer() == pa
  np.testing.assert_array_equal(x, want[0])
  np.testing.assert_array_equal(y, want[1])
  np.testing.assert_array_equal(r[...], want_r[...])


def test_refs_and_arrays_in_one_pytree():
  def f(p, x):
    p["r"][...] += p["a"]
    return p["a"] * x

  def make():
    return {"r": jax.new_ref(jnp.zeros(4)), "a": jnp.ones(4)}, jnp.full(4, 2.0)

  got_p, x = make()
  want_p, _ = make()
  with warnings.catch_warnings(record=True) as got_w:
    warnings.simplefilter("always")
    got = donate.jit(f, donate_argnums=0)(got_p, x)
  with warnings.catch_warnings(record=True) as want_w:
    warnings.simplefilter("always")
    want = jax.jit(f, donate_argnums=0)(want_p, jnp.full(4, 2.0))
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got_p["r"][...], want_p["r"][...])
  assert got_p["a"].is_deleted() and want_p["a"].is_deleted()
  # jax.jit warns that the donated ref was not usable; so does donate, naming the leaf.
  assert [type(w.message) for w in want_w] == [UserWarning]
  assert len(got_w) == 1 and issubclass(got_w[0].category, UserWarning)
  assert "(p['r'])" in str(got_w[0].message)
  assert "ref: written back in place; a ref is never donated" in str(got_w[0].message)


def test_a_donated_ref_does_what_jax_jit_does():
  # With a free output of its size, jax.jit offers the ref to XLA as a donor, which XLA rejects;
  # nothing is consumed by either.
  for name, jit in JITS.items():
    r, x = jax.new_ref(jnp.zeros(4)), jnp.ones(4)
    with pytest.raises(jax.errors.JaxRuntimeError, match="already aliased"):
      jit(add_and_double, donate_argnums=0)(r, x)
    assert not x.is_deleted(), name
    np.testing.assert_array_equal(r[...], jnp.zeros(4))
  # With none left free: an unusable donation (a warning); donate's plan says why.
  for name, jit in JITS.items():
    r, x = jax.new_ref(jnp.zeros(4)), jnp.ones(4)
    with pytest.warns(UserWarning, match="Some donated buffers were not usable"):
      out = jit(add_and_double, donate_argnums=(0, 1))(r, x)
    np.testing.assert_array_equal(out, jnp.full(4, 2.0))
    np.testing.assert_array_equal(r[...], jnp.ones(4))
    assert x.is_deleted(), name
  with pytest.warns(UserWarning):
    plan = donate.jit(add_and_double, donate_argnums=(0, 1)).plan(
        jax.new_ref(jnp.zeros(4)), jnp.ones(4))
  assert plan.decisions[0].action == "unusable"
  assert plan.decisions[0].reason.startswith(WRITTEN_BACK)
  # strict: raises before anything runs.
  r, x = jax.new_ref(jnp.zeros(4)), jnp.ones(4)
  with pytest.raises(donate.DonationError):
    donate.jit(add_and_double, donate_argnums=(0, 1), strict=True)(r, x)
  assert not x.is_deleted()


def test_closed_over_ref():
  state = jax.new_ref(jnp.zeros(4))

  def f(a, b):
    state[...] += a
    return b.at[0].set(1.0), a + 1.0

  g = donate.jit(f, donate_argnums=(0, 1), copy_threshold=0)
  plan = g.plan(jnp.ones(4), jnp.ones(4))
  assert plan.aliases == {"out[0]": "b", "out[1]": "a"}
  assert "1 jax.Ref(s) the function closes over: written back in place" in plan.notes
  np.testing.assert_array_equal(state[...], jnp.zeros(4))  # planning runs nothing
  a, b = jnp.ones(4), jnp.ones(4)
  g(a, b)
  g(jnp.ones(4), jnp.ones(4))
  assert a.is_deleted() and b.is_deleted()
  np.testing.assert_array_equal(state[...], jnp.full(4, 2.0))
  compiled = g.lower(jnp.ones(4), jnp.ones(4)).compile()
  # b -> out[0], a -> out[1] in the user's order; the closed-over ref: the last parameter.
  assert aliases(compiled) == {1: 0, 0: 1, 2: 2}


def test_ref_written_in_scan_beside_a_donated_carry():
  def f(r, c, xs):
    def body(c, x):
      r[...] += x
      return c * 2 + x, None
    return jax.lax.scan(body, c, xs)[0]

  def make():
    return jax.new_ref(jnp.zeros(4)), jnp.ones(4), jnp.arange(12.0).reshape(3, 4)

  got_r, c, xs = make()
  want_r, *rest = make()
  got = donate.jit(f, donate_argnums=1)(got_r, c, xs)
  want = jax.jit(f, donate_argnums=1)(want_r, *rest)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got_r[...], want_r[...])
  assert c.is_deleted() and not xs.is_deleted()
  plan = donate.jit(f, donate_argnums=1).plan(*make())
  assert [(d.action, d.output) for d in plan.decisions] == [
      (REF, None), ("aliased", "out"), ("kept", None)]


def test_staged_objects_with_refs():
  f = donate.jit(swapped_beside_ref, donate_argnums=(1, 2), copy_threshold=0)
  sds = jax.ShapeDtypeStruct((4,), jnp.float32)
  traced = f.trace(jax.new_ref(jnp.zeros(4)), jnp.ones(4), jnp.ones(4))
  assert [a.donated for a in jax.tree.leaves(traced.args_info)] == [False, True, True]
  assert "tf.aliasing_output" in traced.lower().as_text()
  # An abstract ref (ShapeDtypeStruct(is_ref=True)) plans as a ref too.
  ref_sds = jax.ShapeDtypeStruct((4,), jnp.float32, sharding=jnp.ones(4).sharding, is_ref=True)
  compiled = f.lower(ref_sds, sds, sds).compile()
  assert compiled.plan.decisions[0].action == REF
  assert compiled.plan.aliases == {"out[0]": "b", "out[1]": "a"}
  r, a, b = jax.new_ref(jnp.zeros(4)), jnp.ones(4), jnp.ones(4)
  x, y = compiled(r, a, b)
  assert a.is_deleted() and b.is_deleted()
  np.testing.assert_array_equal(r[...], jnp.ones(4))
  np.testing.assert_array_equal(y, jnp.full(4, 2.0))


def test_cases_from_jax_mutable_array_tests():
  """What JAX's mutable_array_test.py checks that failed under donate.jit before refs planned."""
  outer = jax.new_ref(jnp.zeros(3))

  @donate.jit
  def nested(y_ref, z):  # test_closed_over_nested: a closed-over ref and a ref argument
    outer[...] += 1.0
    outer[1] += 5
    y_ref[2] += 7
    return z + 9

  y_ref = jax.new_ref(np.zeros(3))
  assert donate.jit(nested)(y_ref, 1) == 10
  np.testing.assert_array_equal(outer[...], [1.0, 6.0, 1.0])
  np.testing.assert_array_equal(y_ref[...], [0.0, 0.0, 7.0])

  def several(x_ref, y, z_ref, w):  # test_multiple_inputs_and_outputs: refs between arrays
    x_ref[...] += 1
    z_ref[...] += 1
    return x_ref[...] + y + z_ref[...] + w, y + w

  x_ref, z_ref = jax.new_ref(jnp.zeros((1, 3))), jax.new_ref(jnp.zeros((2, 3)))
  out = donate.jit(several)(x_ref, jnp.ones((2, 3)), z_ref, jnp.ones((2, 1)))
  np.testing.assert_array_equal(out[0], jnp.full((2, 3), 4.0))
  np.testing.assert_array_equal(z_ref[...], jnp.ones((2, 3)))

  x = jnp.arange(3.0)  # test_defensive_copy: the array a ref was made from stays usable
  donate.jit(lambda r: r[...])(jax.new_ref(x))
  np.testing.assert_array_equal(x + 1, jnp.arange(1.0, 4.0))

  flag = jax.new_ref(0.0)  # test_cond_both_branches_close_over_same_mutable_array

  def branch(pred):
    jax.lax.cond(pred, lambda: flag.__setitem__((), 1.0), lambda: flag.__setitem__((), 2.0))

  for pred, want in ((True, 1.0), (False, 2.0)):
    donate.jit(branch)(pred)
    assert float(flag[...]) == want

  @jax.custom_vjp  # test_custom_vjp_differentiated_ref
  def read(r):
    return r[...]
  read.defvjp(lambda r: (read(r), None), lambda _, g: (g,))
  assert float(donate.jit(read)(jax.new_ref(3.0))) == 3.0

  mesh = jax.make_mesh((1, 1), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2,
                       devices=jax.devices()[:1])  # test_explicit_sharding_after_indexing
  with jax.set_mesh(mesh):
    e = jax.new_ref(jnp.zeros((4, 4), jnp.int32, device=NamedSharding(mesh, P("x", "y"))))
    out = donate.jit(lambda r: r[...] + 1)(e)
  assert out.sharding.spec == P("x", "y")

  f = donate.jit(lambda r: r.__setitem__(..., r[...] + 1.0))  # test_basic_aot
  r = jax.new_ref(jnp.zeros(3))
  f.lower(r).compile()(r)
  np.testing.assert_array_equal(r[...], jnp.ones(3))


def test_compiled_output_shardings_leave_ref_write_backs_out():
  r, x = jax.new_ref(jnp.zeros(4)), jnp.ones(4)
  compiled = jax.jit(add_and_double).lower(r, x).compile()
  assert _compat.compiled_output_shardings(compiled, 1) == [x.sharding]
  plain = jax.jit(lambda a, b: (a, b)).lower(x, x).compile()
  assert _compat.compiled_output_shardings(plain, 2) == jax.tree.leaves(plain.output_shardings)


def mesh_1d():
  return jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))


@pytest.mark.parametrize("spec", [P("x"), P()])
def test_refs_beside_donated_arrays_on_eight_devices(spec):
  sharding = NamedSharding(mesh_1d(), spec)
  n = 1 << 12

  def make():
    return (jax.new_ref(jax.device_put(jnp.zeros(n), sharding)),
            jax.device_put(jnp.arange(n, dtype=jnp.float32), sharding),
            jax.device_put(-jnp.arange(n, dtype=jnp.float32), sharding))

  f = donate.jit(swapped_beside_ref, donate_argnums=(1, 2), copy_threshold=0)
  plan = f.plan(*make())
  assert plan.aliases == {"out[0]": "b", "out[1]": "a"}
  assert plan.decisions[0].action == REF
  want_r, *rest = make()
  want = jax.jit(swapped_beside_ref)(want_r, *rest)
  r, a, b = make()
  x, y = f(r, a, b)
  assert a.is_deleted() and b.is_deleted()
  np.testing.assert_array_equal(x, want[0])
  np.testing.assert_array_equal(y, want[1])
  np.testing.assert_array_equal(r[...], want_r[...])
  assert r.sharding == sharding
  # Ahead of time (test_basic_sharded_aot, test_sharded_aot_mutable_sds): from the ref itself
  # and from its abstract stand-in.
  r, a, b = make()
  ref_sds = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sharding, is_ref=True)
  for first in (r, ref_sds):
    f.lower(first, a, a).compile()(r, *make()[1:])
  np.testing.assert_array_equal(r[...], 2 * jnp.arange(n, dtype=jnp.float32))


def test_donated_arrays_beside_a_sharded_ref_run_where_jax_jit_fails():
  # jax.jit offers the donated buffers to XLA as donors (no output sharding given); XLA pairs one
  # with the ref's write-back and rejects its own aliases. donate.jit states the pairs.
  sharding = NamedSharding(mesh_1d(), P("x"))

  def f(r, a, b):
    r[...] += a
    return a + 1.0, b * 2.0

  def make():
    return (jax.new_ref(jax.device_put(jnp.zeros(64), sharding)),
            jax.device_put(jnp.arange(64.0), sharding), jax.device_put(jnp.ones(64), sharding))

  r, a, b = make()
  with pytest.raises(jax.errors.JaxRuntimeError):
    jax.jit(f, donate_argnums=(1, 2))(r, a, b)
  assert not a.is_deleted()
  g = donate.jit(f, donate_argnums=(1, 2))
  compiled = g.lower(*make()).compile()
  assert compiled.plan.aliases == {"out[0]": "a", "out[1]": "b"}
  assert aliases(compiled) == {1: 0, 2: 1, 0: 2}
  x, y = g(r, a, b)
  assert a.is_deleted() and b.is_deleted()
  np.testing.assert_array_equal(r[...], jnp.arange(64.0))
  np.testing.assert_array_equal(x, jnp.arange(64.0) + 1)
  np.testing.assert_array_equal(y, jnp.full(64, 2.0))


def nnx_model():
  with nnx.var_defaults(ref=True):
    model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
  return model, opt


def train_step(model, opt, x):
  def loss(m):
    return jnp.mean(m(x) ** 2)
  grads = nnx.grad(loss)(nnx.with_vars(model, ref=False))
  opt.update(model, grads)
  return loss(model)


def test_flax_nnx_module_with_ref_variables():
  assert all(isinstance(v, jax.Ref) for v in jax.tree.leaves(nnx_model()[0]))
  x = jnp.ones((2, 4))
  runs = {}
  for name, jit in JITS.items():
    model, opt = nnx_model()
    step = jit(train_step)
    runs[name] = ([float(step(model, opt, x)) for _ in range(3)], model.kernel[...])
  assert runs["donate.jit"][0] == runs["jax.jit"][0]
  np.testing.assert_array_equal(runs["donate.jit"][1], runs["jax.jit"][1])
  plan = donate.jit(train_step).plan(*nnx_model(), x)
  refs = [d for d in plan.decisions if d.action == REF]
  assert len(refs) == len(jax.tree.leaves(nnx_model())) and refs[0].reason == WRITTEN_BACK


def test_nnx_jit_with_donate_jit_underneath(monkeypatch):
  # nnx.jit builds its jax.jit when it wraps the function: patched, it is a donate.jit.
  x = jnp.ones((2, 4))
  runs = {}
  for name, jit in JITS.items():
    monkeypatch.setattr(jax, "jit", jit)
    model, opt = nnx_model()
    step = nnx.jit(train_step)
    monkeypatch.undo()
    assert isinstance(step.jitted_fn, donate.jit(lambda: 0).__class__) == (name == "donate.jit")
    runs[name] = ([float(step(model, opt, x)) for _ in range(3)], model.kernel[...])
  assert runs["donate.jit"][0] == runs["jax.jit"][0]
  np.testing.assert_array_equal(runs["donate.jit"][1], runs["jax.jit"][1])
  # Donating the ref model: XLA rejects it under both, and nothing is consumed.
  for name, jit in JITS.items():
    monkeypatch.setattr(jax, "jit", jit)
    model, opt = nnx_model()
    step = nnx.jit(train_step, donate_argnames=("model", "opt"))
    monkeypatch.undo()
    before = model.kernel[...]
    with pytest.raises(jax.errors.JaxRuntimeError, match="already aliased"), pytest.warns(
        UserWarning, match="Some donated buffers were not usable"):
      step(model, opt, x)
    np.testing.assert_array_equal(model.kernel[...], before)
