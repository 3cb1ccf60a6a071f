"""Unit tests of donate._plan.dataflow: origins, in-place sources and annotations of a traced program."""

import jax
import jax.numpy as jnp
import pytest

import donate
from donate._base.errors import DonationError
from donate._plan import dataflow as df

X = jnp.ones(8)


def flow(f, *args):
  return df.analyze(jax.make_jaxpr(f)(*args))


def test_strengths_order_the_links_between_outputs_and_inputs():
  def f(a, b, c, d):
    return a, b.at[0].set(1.0), c * 2.0, d.sum() + jnp.zeros(8)
  out = flow(f, X, X, X, X).out_sources
  assert out[0] == {0: df.IDENTITY}
  assert out[1] == {1: df.UPDATE}
  assert out[2] == {2: df.ELEMENTWISE}
  assert out[3] == {}  # a reduction makes a new buffer: no in-place link
  assert df.IDENTITY > df.UPDATE > df.CARRY > df.ELEMENTWISE


def test_a_loop_carry_updated_in_place_links_to_its_input():
  def f(buf, xs):
    def body(c, x):
      return c.at[0].set(x), None
    return jax.lax.scan(body, buf, xs)[0]
  assert flow(f, X, jnp.ones(3)).out_sources[0] == {0: df.CARRY}

  def g(buf):
    return jax.lax.fori_loop(0, 3, lambda i, c: c.at[i].set(1.0), buf)
  assert flow(g, X).out_sources[0] == {0: df.CARRY}


def test_cond_merges_both_branches():
  def f(p, a, b):
    return jax.lax.cond(p, lambda a, b: a * 2.0, lambda a, b: b.at[0].set(0.0), a, b)
  sources = flow(f, True, X, X).out_sources[0]
  assert sources == {1: df.ELEMENTWISE, 2: df.UPDATE}


def test_optimization_barrier_keeps_each_operand_one_to_one():
  def f(a, b):
    x, y = jax.lax.optimization_barrier((a, b))
    return y, x
  assert flow(f, X, X).out_sources == ({1: df.IDENTITY}, {0: df.IDENTITY})


def test_annotations_resolve_to_inputs_through_nesting():
  def f(a, b):
    a = donate.donate_buffer(a)
    inner = jax.jit(lambda v: donate.alias(v, v + 1.0))
    return a * 2.0, inner(b)
  result = flow(f, X, X)
  kinds = {(a.kind, a.origin) for a in result.annotations}
  assert ("donate_buffer", 0) in kinds and ("alias", 1) in kinds
  assert result.out_explicit[1] == frozenset({1})


def test_inner_jit_donation_is_recorded_as_such():
  def f(a):
    return jax.jit(lambda v: v + 1.0, donate_argnums=0)(a)
  (annotation,) = flow(f, X).annotations
  assert (annotation.kind, annotation.origin) == ("inner_jit", 0)


def test_reading_a_donated_value_afterwards_is_an_error():
  def f(a):
    b = donate.donate_buffer(a)
    return b * 2.0, a + 1.0
  with pytest.raises(DonationError, match="donate_buffer"):
    flow(f, X)


def test_used_inputs_and_skipped_constants():
  def f(a, b):
    del b
    return a + 1.0
  closed = jax.make_jaxpr(f)(X, X)
  assert df.analyze(closed).used == (True, False)
  # With one leading input taken as a hoisted constant, it is nobody's origin.
  assert df.analyze(closed, skip=1).out_sources[0] == {}


@pytest.mark.parametrize("make_key", [jax.random.PRNGKey, jax.random.key], ids=["raw", "typed"])
def test_a_key_made_from_the_donated_key_is_linked_to_it_and_the_plan_says_so(make_key):
  """`jax.random.split` / `fold_in` of a key (raw `uint32[2]` data, wrapped and unwrapped, or a
  typed key) and the keys picked out of the split: each is derived from the input key."""

  def f(key, other):
    k1, k2 = jax.random.split(key)
    return k1, jax.random.fold_in(k2, 3), jax.random.split(other)[0]

  key = make_key(0)
  out = flow(f, key, make_key(1)).out_sources
  assert out[0] == {0: df.KEY} and out[1] == {0: df.KEY} and out[2] == {1: df.KEY}
  assert df.ELEMENTWISE > df.KEY > 0
  assert flow(lambda k: jax.random.bits(k, (2,), jnp.uint32), key).out_sources == ({},)
  g = donate.jit(f, donate_argnums=0)
  (d, kept) = g.plan(key, make_key(1)).decisions
  assert d.cause == donate.Cause.DERIVED_KEY and d.output == "out[0]"
  assert d.reason == "a PRNG key made from this key (split / fold_in)", d.reason
  expected = jax.jit(f)(make_key(0), make_key(1))
  got = g(key, make_key(1))  # the call's own (quick) plan agrees with the full one
  assert key.is_deleted() and not kept.consumed
  data = lambda k: jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k
  for a, b in zip(got, expected):
    assert (data(a) == data(b)).all()
