"""`_pairing._pair` at scale: the near-linear matching equals the quadratic definition (every
compatible pair sorted by strength, output, leaf, taken greedily) on random programs, and plans
of 10,000 leaves stay near-linear in the number of `_compatible` calls. Also: JAX turns donation
off under `jax_debug_nans`, and the plan says so."""

import warnings

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pairing import flow, leaf, out

import donate
from donate._plan import dataflow as df
from donate._plan import keys as _keys
from donate._plan import pairing as _pairing

SHAPES = [(4,), (8,), (2, 2)]
DTYPES = ["float32", "int32"]


def quadratic_pair(leaves, outputs, donated, dataflow):
  """The definition: every compatible pair, strongest link first, then output, then leaf."""
  candidates = []
  for i in donated:
    for j, o in enumerate(outputs):
      if _keys.compatible(leaves[i], o):
        strength = (df.EXPLICIT if i in dataflow.out_explicit[j]
                    else dataflow.out_sources[j].get(i, 0))
        candidates.append((-strength, j, i))
  pairs, taken = {}, set()
  for neg, j, i in sorted(candidates):
    if i not in pairs and j not in taken:
      pairs[i] = (j, -neg)
      taken.add(j)
  return pairs


@st.composite
def programs(draw):
  n_in, n_out = draw(st.integers(1, 12)), draw(st.integers(0, 12))
  kinds = st.tuples(st.sampled_from(SHAPES), st.sampled_from(DTYPES))
  leaves = [leaf(f"x{i}", *draw(kinds)) for i in range(n_in)]
  outputs = [out(f"out[{j}]", *draw(kinds)) for j in range(n_out)]
  strengths = st.sampled_from([df.IDENTITY, df.UPDATE, df.CARRY, df.ELEMENTWISE])
  sources = [draw(st.dictionaries(st.integers(0, n_in - 1), strengths, max_size=3))
             for _ in range(n_out)]
  donated = sorted(draw(st.sets(st.integers(0, n_in - 1))))
  return leaves, outputs, donated, flow(sources, n_in)


@settings(max_examples=300, deadline=None)
@given(programs())
def test_near_linear_pairing_equals_the_quadratic_definition(program):
  leaves, outputs, donated, dataflow = program
  assert _pairing._pair(leaves, outputs, donated, dataflow) == quadratic_pair(
      leaves, outputs, donated, dataflow)


def test_ten_thousand_leaves_pair_with_a_near_linear_number_of_comparisons(monkeypatch):
  n = 10_000
  leaves = [leaf(f"x{i}") for i in range(n)]
  outputs = [out(f"out[{j}]") for j in range(n)]
  dataflow = flow([{j: df.ELEMENTWISE} for j in range(n)], n)
  calls = [0]
  compatible = _keys.compatible

  def counting(a, b):
    calls[0] += 1
    return compatible(a, b)

  monkeypatch.setattr(_pairing, "compatible", counting)
  plan = _pairing.make_plan("f", leaves, outputs, dict.fromkeys(range(n), "donate_argnums"),
                            dataflow)
  assert plan.pairs() == {i: i for i in range(n)}
  assert calls[0] <= 3 * n  # the quadratic definition makes n * n = 10^8


def test_debug_nans_turns_donation_off_and_the_plan_says_so():
  f = donate.jit(lambda a, b: (b.at[0].set(1.0), a + 1.0), donate_argnums=(0, 1))
  strict = donate.jit(lambda a, b: (a * 2.0, b), donate_argnums=(0, 1), strict=True)
  a, b = jnp.zeros(4), jnp.ones(4)
  with jax.debug_nans(True):
    plan = f.plan(a, b)
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # jax.jit says nothing here, and neither does donate.jit
      f(a, b)
    with pytest.raises(donate.DonationError, match="jax_debug_nans"):
      strict(a, b)
  assert not a.is_deleted() and not b.is_deleted()  # as jax.jit: nothing consumed
  assert [d.action for d in plan.decisions] == ["kept", "kept"]
  assert all("jax_debug_nans is on" in d.reason for d in plan.decisions)
  assert plan.bytes_reused == 0 and plan.memory.alias == 0
