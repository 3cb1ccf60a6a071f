"""Donation that reaches the buffers: nested computations, loops, gradient accumulation, aliases,
preallocated outputs. Every check is physical (deleted inputs, pointers, compiled aliases and
memory figures) and numerics match plain `jax.jit`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import donate
from donate import _examples as examples

D = donate.donate_buffer


def fresh(n=8, value=1.0):
  return jnp.full((n,), value, jnp.float32)


@jax.custom_jvp
def _cjvp(c):
  return jnp.sin(D(c))


_cjvp.defjvp(lambda p, t: (_cjvp(p[0]), jnp.cos(p[0]) * t[0]))


@jax.custom_vjp
def _cvjp(c):
  return jnp.sin(D(c))


_cvjp.defvjp(lambda c: (_cvjp(c), c), lambda c, g: (jnp.cos(c) * g,))


def _shard_map(b):
  mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
  body = lambda b: (lambda d: d + lax.psum(d, "i"))(D(b))
  return jax.shard_map(body, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"))(b)


NESTED = {
    "jax.jit": lambda a: jax.jit(lambda b: D(b) * 2)(a),
    "donate.jit": lambda a: donate.jit(lambda b: D(b) * 2)(a),
    "scan": lambda a: lax.scan(lambda c, _: (D(c) + 1, None), a, None, length=3)[0],
    "fori_loop": lambda a: lax.fori_loop(0, 3, lambda i, c: D(c) + 1, a),
    "while_loop": lambda a: lax.while_loop(lambda c: c[0] < 3, lambda c: D(c) + 1, a),
    "cond": lambda a: lax.cond(a[0] > 0, lambda c: D(c) + 1, lambda c: c * 2, a),
    "switch": lambda a: lax.switch(1, [lambda c: D(c) + 1, lambda c: D(c) * 2], a),
    "checkpoint": lambda a: jax.checkpoint(lambda c: jnp.sin(D(c)))(a),
    "custom_jvp": lambda a: _cjvp(a),
    "custom_vjp": lambda a: _cvjp(a),
    "vmap": lambda a: jax.vmap(lambda r: D(r) * 2)(a),
    "grad": lambda a: (lambda w: w - 0.1 * jax.grad(lambda v: jnp.sum(v * v))(w))(D(a)),
    "value_and_grad": lambda a: jax.value_and_grad(lambda w: jnp.sum(jnp.sin(D(w))))(a)[1],
}


@pytest.mark.parametrize("name", sorted(NESTED))
def test_donate_buffer_at_any_depth_reaches_the_outer_input(name):
  f = NESTED[name]
  expect = jax.jit(f)(fresh())
  g = donate.jit(f)
  x = fresh()
  pointer = x.unsafe_buffer_pointer()
  out = g(x)
  assert x.is_deleted(), g.plan(fresh())
  assert out.unsafe_buffer_pointer() == pointer
  np.testing.assert_allclose(out, expect, rtol=1e-6)
  decision = g.plan(fresh()).decisions[0]
  assert decision.action == "aliased" and decision.source.startswith("donate_buffer at ")
  assert "test_nesting.py" in decision.source


def test_donate_buffer_inside_shard_map():
  mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
  x = jax.device_put(jnp.arange(64.0), jax.sharding.NamedSharding(mesh, jax.P("i")))
  expect = jax.jit(_shard_map)(x.copy())
  out = donate.jit(_shard_map)(x)
  assert x.is_deleted()
  np.testing.assert_allclose(out, expect)


def test_inner_jax_jit_donation_is_ignored_by_default_as_jax_jit_does():
  inner_jax = jax.jit(lambda b: b * 2, donate_argnums=0)
  g = donate.jit(lambda a: inner_jax(a) + 1)
  a = fresh()
  out = g(a)
  assert not a.is_deleted()  # the caller donated nothing: nothing is consumed
  np.testing.assert_array_equal(out, jax.jit(lambda a: inner_jax(a) + 1)(a))
  d, = g.plan(a).decisions
  assert d.action == "kept" and "inner jax.jit donation at " in d.reason
  assert "ignored (the caller did not donate this argument)" in d.reason
  assert any("adopt_inner_donation=True" in n for n in g.plan(a).notes)


def test_inner_jit_donate_argnums_is_honoured_at_the_outer_level():
  inner_jax = jax.jit(lambda b: b * 2, donate_argnums=0)
  inner_ours = donate.jit(lambda b: b * 3, donate_argnums=0)
  g = donate.jit(lambda a, b: (inner_jax(a), inner_ours(b)), adopt_inner_donation=True)
  a, b = fresh(), fresh()
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  x, y = g(a, b)
  assert a.is_deleted() and b.is_deleted()
  assert (x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()) == (pa, pb)
  sources = [d.source for d in g.plan(fresh(), fresh()).decisions]
  assert sources[0].startswith("inner jit donation at ")
  assert sources[1].startswith("donate_buffer at ")


def test_annotations_on_intermediates_and_constants_say_they_had_no_effect():
  g = donate.jit(lambda a: (D(a * 2) + 1, D(jnp.ones(8)) + a))
  plan = g.plan(fresh())
  assert plan.decisions[0].action == "kept"
  assert len(plan.notes) == 2
  assert all("had no effect" in n and "test_nesting.py" in n for n in plan.notes)
  assert "note: donate_buffer at" in str(plan)


def test_loop_carry_is_updated_in_place_and_temporaries_are_reported():
  def f(a):
    return lax.fori_loop(0, 4, lambda i, c: c.at[i].set(c[i] * 2.0), a)

  g = donate.jit(f, donate_argnums=0)
  x = jnp.arange(1.0, 1025.0)
  pointer = x.unsafe_buffer_pointer()
  plan = g.plan(x)
  assert plan.decisions[0].reason == "loop carry updated in place"
  assert plan.memory is not None and plan.memory.temp < x.nbytes  # no second full copy
  out = g(x)
  assert out.unsafe_buffer_pointer() == pointer
  np.testing.assert_array_equal(out, f(jnp.arange(1.0, 1025.0)))


# ---- gradient accumulation (source document 1's motivating case) ------------------------------

def _grad_accum_inputs(width=64):
  params = examples.mlp_init(jax.random.key(0), width=width, depth_in=width, out=width)
  acc = jax.tree.map(jnp.zeros_like, params)
  batches = examples.micro_batches(jax.random.key(1), micro=4, batch=8, width=width, out=width)
  return params, acc, batches


def _peak(compiled):
  m = compiled.memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)


@pytest.mark.parametrize("how", ["donate_argnums", "donate_buffer in the scan body"])
def test_gradient_accumulation_peak_equals_best_hand_written_jit(how):
  params, acc, batches = _grad_accum_inputs()
  best = _peak(jax.jit(examples.grad_accum_step, donate_argnums=(0, 1))
               .lower(params, acc, batches).compile())
  none = _peak(jax.jit(examples.grad_accum_step).lower(params, acc, batches).compile())
  if how == "donate_argnums":
    g = donate.jit(examples.grad_accum_step, donate_argnums=(0, 1))
  else:
    g = donate.jit(examples.grad_accum_step_annotated)
  plan = g.plan(params, acc, batches)
  assert plan.memory.peak == best < none
  assert plan.bytes_reused == plan.bytes_requested == 2 * sum(
      x.nbytes for x in jax.tree.leaves(params))
  expect = jax.jit(examples.grad_accum_step)(params, acc, batches)
  leaves = jax.tree.leaves((params, acc))
  out = g(params, acc, batches)
  assert all(x.is_deleted() for x in leaves)
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expect)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- alias chains and rules (source document 4) -----------------------------------------------

def test_alias_chain_of_any_length_resolves_to_the_root():
  def f(a, b):
    x = a
    for k in range(5):
      x = donate.alias(x, x * 2.0 + k)
    return x, b + 1

  g = donate.jit(f)
  a = fresh()
  pointer = a.unsafe_buffer_pointer()
  x, _ = g(a, fresh())
  assert x.unsafe_buffer_pointer() == pointer
  plan = g.plan(fresh(), fresh())
  assert plan.aliases == {"out[0]": "a"}
  assert "a -> out[0]" in str(plan) and "explicit alias" in str(plan)


def test_an_alias_cycle_is_an_error():
  def f(a, b):
    x = donate.alias(a, b + 1.0)  # b's successor into a's buffer
    y = donate.alias(b, a + 1.0)  # and a's into b's: reads a after giving it up
    return x, y

  a, b = fresh(), fresh()
  with pytest.raises(donate.DonationError, match="given up by alias at .* is read again"):
    donate.jit(f)(a, b)
  assert not a.is_deleted() and not b.is_deleted()


def test_two_outputs_onto_one_buffer_is_an_error_naming_the_paths():
  def f(a):
    x = donate.alias(a, a + 1.0)
    return {"p": x, "q": x + 0.0}

  a = fresh()
  with pytest.raises(donate.DonationError, match=r"one source into two outputs at a.*"
                     r"out\['p'\], out\['q'\]"):
    donate.jit(f)(a)
  assert not a.is_deleted()


# ---- preallocated outputs (source document 4) -------------------------------------------------

def test_into_writes_results_into_the_callers_buffers():
  g = donate.jit(lambda x, y: {"sum": x + y, "diff": x - y})
  buf = jnp.empty(8)
  pointer = buf.unsafe_buffer_pointer()
  out = g.into({"sum": buf, "diff": None})(fresh(value=3.0), fresh(value=1.0))
  assert buf.is_deleted()
  assert out["sum"].unsafe_buffer_pointer() == pointer
  np.testing.assert_array_equal(out["sum"], jnp.full(8, 4.0))
  np.testing.assert_array_equal(out["diff"], jnp.full(8, 2.0))


def test_into_keeps_a_stable_address_across_steps():
  g = donate.jit(lambda x, s: x * s)
  x = fresh(value=2.0)
  out = jnp.empty(8)
  pointer = out.unsafe_buffer_pointer()
  for step in range(4):
    out = g.into(out)(x, float(step))
    assert out.unsafe_buffer_pointer() == pointer
  assert not x.is_deleted()
  np.testing.assert_array_equal(out, jnp.full(8, 6.0))
  # Ping-pong between two buffers.
  a, b = jnp.empty(8), jnp.empty(8)
  pointers = [a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()]
  for step in range(4):
    a, b = g.into(b)(x, 1.0), a
    assert a.unsafe_buffer_pointer() == pointers[(step + 1) % 2]


@pytest.mark.parametrize("bad, match", [
    ({"sum": jnp.empty(4), "diff": None}, r"at into\['sum'\]: expected float32\[8\], got float32\[4\]"),
    ({"sum": jnp.empty(8, jnp.int32), "diff": None}, r"expected float32\[8\], got int32\[8\]"),
    ((jnp.empty(8), None), "does not match the structure"),
])
def test_into_mismatch_raises_before_anything_is_consumed(bad, match):
  g = donate.jit(lambda x, y: {"sum": x + y, "diff": x - y})
  x, y = fresh(), fresh()
  with pytest.raises(donate.DonationError, match=match):
    g.into(bad)(x, y)
  for leaf in jax.tree.leaves((bad, x, y)):
    assert not leaf.is_deleted()


def test_into_sharding_mismatch_raises_before_anything_is_consumed():
  mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
  row = jax.sharding.NamedSharding(mesh, jax.P("i"))
  g = donate.jit(lambda x: x * 2, out_shardings=row)
  buf = jnp.empty(64)  # on one device, but the output is sharded over eight
  x = jax.device_put(jnp.ones(64), row)
  with pytest.raises(donate.DonationError, match="sharding"):
    g.into(buf)(x)
  assert not buf.is_deleted() and not x.is_deleted()


@pytest.mark.parametrize("fill", [examples.fill_fori, examples.fill_map])
def test_slices_are_written_straight_into_the_preallocated_output(fill):
  T, width = 64, 1024
  xs = jax.random.normal(jax.random.key(0), (T, width))
  g = donate.jit(fill)
  buf = jnp.empty((T, width))
  pointer = buf.unsafe_buffer_pointer()
  out = g.into(buf)(xs)
  assert out.unsafe_buffer_pointer() == pointer
  np.testing.assert_allclose(out, jax.jit(fill)(xs), rtol=1e-6)
  plan = g.into(jnp.empty((T, width))).plan(xs)
  slice_bytes = width * 4
  assert plan.memory.temp < 2 * slice_bytes  # not a second full [T, D] output
  assert plan.memory.alias == T * slice_bytes


def test_an_inner_donate_jit_already_compiled_at_the_top_level_is_honoured_inside():
  inner = donate.jit(lambda b: b * 3, donate_argnums=0)
  inner(fresh())  # traced and cached at the top level: the nested call below is a cache hit
  g = donate.jit(lambda a, b: (a + 1, inner(b)))
  a, b = fresh(), fresh()
  pb = b.unsafe_buffer_pointer()
  x, y = g(a, b)
  assert not a.is_deleted() and b.is_deleted() and y.unsafe_buffer_pointer() == pb
  sources = [d.source for d in g.plan(fresh(), fresh()).decisions]
  assert sources[0] == "-" and sources[1].startswith(("inner donate.jit at ", "donate_buffer at "))
  h = jax.jit(lambda a, b: (a + 1, inner(b)))  # under plain jax.jit: ignored, as jax.jit does
  a, b = fresh(), fresh()
  h(a, b)
  assert not a.is_deleted() and not b.is_deleted()


def test_linear_transpose_of_a_donating_function_is_jax_jits():
  # donate's markers are identities: their cotangents pass through (`alias`'s source gets none)
  def f(a, b):
    return a * 2.0 + b, b * 3.0

  def marked(a, b):
    a = donate.donate_buffer(a)
    return donate.alias(a, a * 2.0), b - a

  x, ct = (jnp.ones(4), jnp.ones(4)), (jnp.arange(4.0), jnp.ones(4))
  for fun in (f, marked):
    want = jax.linear_transpose(jax.jit(fun), *x)(ct)
    for kw in ({}, {"donate_argnums": 0}, {"donate_argnums": (0, 1)}):
      got = jax.linear_transpose(donate.jit(fun, **kw), *x)(ct)
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(jax.linear_transpose(marked, *x)(ct)[0], [-1.0, 1.0, 3.0, 5.0])
