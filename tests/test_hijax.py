"""JAX's experimental high-level types (`jax.experimental.hijax`) through `donate.jit`.

A hijax value is one argument that lowers to several buffers; donate does not plan such a call
and runs, traces and lowers it as `jax.jit` does (JAX's own `hijax_test.py` passes rewritten to
`donate.jit`). These tests compare the two on a value of two arrays.
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import hijax

import donate

JITS = pytest.mark.parametrize("jit", [jax.jit, donate.jit], ids=["jax", "donate"])


@dataclasses.dataclass(frozen=True)
class Pair:
  a: jax.Array
  b: jax.Array


@dataclasses.dataclass(frozen=True)
class PairTy(hijax.HiType):
  shape: tuple

  def lo_ty(self):
    return [hijax.ShapedArray(self.shape, jnp.dtype("float32"))] * 2

  def lower_val(self, v):
    return [v.a, v.b]

  def raise_val(self, a, b):
    return Pair(a, b)


hijax.register_hitype(Pair, lambda p: PairTy(p.a.shape))


def pair():
  return Pair(jnp.arange(4.0), jnp.ones(4))


def step(p, x):
  return p, x * 2.0


def _run(jit, kw, staged):
  p, x = pair(), jnp.ones(4)
  g = jit(step, **kw)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = g.lower(p, x).compile()(p, x) if staged else g(p, x)
  seen = (type(out[0]).__name__, out[0].a.tolist(), out[0].b.tolist(), out[1].tolist())
  consumed = (p.a.is_deleted(), p.b.is_deleted(), x.is_deleted())
  return seen, consumed, [str(w.message) for w in caught]


@pytest.mark.parametrize("staged", [False, True], ids=["call", "aot"])
@pytest.mark.parametrize("kw", [{}, {"donate_argnums": 0}, {"donate_argnums": (0, 1)}],
                         ids=["none", "pair", "both"])
def test_a_hijax_value_runs_and_is_donated_as_in_jax_jit(kw, staged):
  theirs, ours = _run(jax.jit, kw, staged), _run(donate.jit, kw, staged)
  assert ours == theirs
  assert ours[1][0] == ("donate_argnums" in kw)  # the donation happened, for both


@JITS
def test_a_hijax_value_traces_and_lowers_as_in_jax_jit(jit):
  p, x = pair(), jnp.ones(4)
  theirs = jax.jit(step, donate_argnums=0).lower(p, x).as_text()
  assert jit(step, donate_argnums=0).lower(p, x).as_text() == theirs
  assert "tf.aliasing_output" in theirs  # the pair's buffers are donated at lowering
  out_info = jit(step).trace(p, x).out_info
  assert isinstance(out_info[0], PairTy) and out_info[1].shape == (4,)
  assert not p.a.is_deleted()


def test_plan_of_a_hijax_call_says_why_and_consumes_nothing():
  p, x = pair(), jnp.ones(4)
  match = r"donate.jit of step: .*hijax types \(PairTy\)"
  with pytest.raises(donate.DonationError, match=match) as e:
    donate.jit(step, donate_argnums=(0, 1)).plan(p, x)
  assert isinstance(e.value, TypeError)
  assert not (p.a.is_deleted() or p.b.is_deleted() or x.is_deleted())
