"""Typed decisions: code (strict mode, the warning, the error checks) reads a decision's `action`,
`cause` and `request`, never the words of its `reason` or `source`; the enums are strings too."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate
from donate._base.errors import DonationRuntimeError
from donate._plan import dataflow as df
from donate._plan import donation_plan as dp
from donate._plan import pairing as _pairing


@pytest.fixture
def reworded(monkeypatch):
  """Every planned decision's reason replaced by words no code could recognise."""
  make_plan = _pairing.make_plan

  def plan(*args, **kwargs):
    p = make_plan(*args, **kwargs)
    return dataclasses.replace(p, decisions=tuple(
        dataclasses.replace(d, reason=f"reworded {i}") for i, d in enumerate(p.decisions)))

  monkeypatch.setattr(_pairing, "make_plan", plan)


def test_the_enums_are_their_strings():
  assert donate.Action.ALIASED == "aliased" and str(donate.Action.UNUSABLE) == "unusable"
  assert f"{donate.Action.KEPT:6s}|" == "kept  |"
  assert donate.Kind("host") is donate.Kind.HOST and donate.Request("alias") is donate.Request.ALIAS
  assert str(donate.Cause.SHARDING_DIFFERS) == "sharding_differs"
  # The module's plain names are the members.
  assert (dp.ALIASED, dp.DONOR, dp.KEPT, dp.UNUSABLE, dp.UNUSED) == tuple(
      donate.Action[n] for n in ("ALIASED", "DONOR", "KEPT", "UNUSABLE", "UNUSED"))
  assert (dp.DEVICE, dp.ABSTRACT, dp.HOST) == (donate.Kind.DEVICE, donate.Kind.ABSTRACT,
                                               donate.Kind.HOST)
  assert dp.REF == donate.Action.REF == donate.Kind.REF == "ref"


def test_a_decision_holds_its_leaf_and_replaces_as_a_dataclass():
  info = dp.LeafInfo("w", (4,), "float32", 16, "cpu:0", None, donate.Kind.DEVICE, "ArrayImpl")
  d = dp.LeafDecision(info, donate.Request.DONATE_BUFFER, "f.py:3", donate.Action.ALIASED, "out",
                      donate.Cause.ELEMENTWISE_UPDATE, "elementwise update of this input")
  assert (d.path, d.shape, d.dtype, d.nbytes, d.sharding, d.memory_kind) == (
      "w", (4,), "float32", 16, "cpu:0", None)
  assert d.requested and d.consumed and d.source == "donate_buffer at f.py:3"
  with pytest.raises((AttributeError, TypeError)):  # TypeError: a slotted frozen class on 3.11
    d.path = "v"
  with pytest.raises(dataclasses.FrozenInstanceError):
    d.reason = "other words"
  e = dataclasses.replace(d, action=donate.Action.UNUSABLE, output=None,
                          cause=donate.Cause.ALIAS_NOT_MADE, reason="not made")
  assert e.info is info and not e.consumed and e.source == d.source
  assert dataclasses.replace(d, request=None, where=None).source == "-"
  assert dataclasses.replace(d, request=donate.Request.INNER_JIT).source == (
      "inner jit donation at f.py:3")
  assert dataclasses.replace(d, request=donate.Request.DONATE_ARGNUMS, where=None).source == (
      "donate_argnums")


def test_every_planned_decision_has_a_cause():
  leaves = [dp.LeafInfo(p, (4,), "float32", 16, "cpu:0", None, k, "ArrayImpl")
            for p, k in (("a", dp.DEVICE), ("h", dp.HOST), ("k", dp.DEVICE), ("u", dp.DEVICE),
                         ("x", dp.DEVICE))]
  leaves[4] = dataclasses.replace(leaves[4], shape=(3,), nbytes=12)
  outputs = [dp.OutputInfo("out", (4,), "float32", 16)]
  flow = df.Dataflow((), ({0: df.ELEMENTWISE},), (frozenset(),), (True, True, True, False, True))
  plan = _pairing.make_plan("f", leaves, outputs, {0: "donate_argnums", 1: "donate_argnums",
                                                   3: "donate_argnames", 4: "donate_argnums"}, flow)
  assert [(d.action, d.cause, d.request) for d in plan.decisions] == [
      ("aliased", donate.Cause.ELEMENTWISE_UPDATE, donate.Request.DONATE_ARGNUMS),
      ("unusable", donate.Cause.NOT_A_DEVICE_BUFFER, donate.Request.DONATE_ARGNUMS),
      ("kept", donate.Cause.NOT_REQUESTED, None),
      ("unused", donate.Cause.UNUSED, donate.Request.DONATE_ARGNAMES),
      ("unusable", donate.Cause.NO_MATCHING_OUTPUT, donate.Request.DONATE_ARGNUMS)]
  assert all(isinstance(d.cause, donate.Cause) and isinstance(d.action, donate.Action)
             for d in plan.decisions)
  disabled = _pairing.make_plan("f", leaves, outputs, {0: "donate_argnums"}, flow, disabled=True)
  assert disabled.decisions[0].cause == donate.Cause.JAX_DEBUG_NANS


def test_the_plan_text_prints_the_enums_as_their_words():
  f = donate.jit(lambda a, s: a * s, donate_argnums=(0, 1))
  with pytest.warns(donate.UnusableDonationWarning, match=r"float32\[\] \(s\)"):
    text = str(f.plan(jnp.ones(4), 2.0))  # as jax.jit warns of the scalar's copy on the device
  assert "  aliased   16 B   float32[4]  cpu:0     a -> out\n" in text
  assert "  unusable  4 B    float32[]   host      s\n" in text
  assert "      not a device buffer (float); its copy on the device is donated, as by jax.jit" in text
  assert "Action" not in text and "Cause" not in text and "Request" not in text


def test_strict_mode_finds_a_host_leaf_by_its_cause(reworded):
  f = donate.jit(lambda cfg, x: x * cfg["scale"], donate_argnums=0, strict=True)
  with pytest.raises(donate.DonationError, match=r"not a device buffer \(asked by donate_argnums\) "
                     r"at cfg\['scale'\]: expected a jax.Array, got float"):
    f({"scale": 2.0}, jnp.ones(4))


def test_strict_mode_finds_jax_debug_nans_by_its_cause(reworded):
  f = donate.jit(lambda x: x * 2, donate_argnums=0, strict=True)
  with jax.debug_nans(True):
    with pytest.raises(donate.DonationError, match="jax_debug_nans is on: expected donation of x"):
      f(jnp.ones(4))


def test_strict_mode_and_the_warning_find_unusable_leaves_by_their_action(reworded):
  def fun(x, y):
    return x + 1, y.sum()

  x, y = jnp.ones(8), jnp.ones(8)
  with pytest.warns(donate.UnusableDonationWarning, match=r"y: float32\[8\].*: reworded 1"):
    donate.jit(fun, donate_argnums=(0, 1))(x, y)
  with pytest.raises(donate.DonationError, match=r"y: float32\[8\].*: reworded 1"):
    donate.jit(fun, donate_argnums=(0, 1), strict=True)(jnp.ones(8), jnp.ones(8))


def test_an_explicit_alias_that_cannot_hold_is_found_by_its_request(reworded):
  if jax.device_count() < 2:
    pytest.skip("needs two devices")
  mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])
  row = jax.sharding.NamedSharding(mesh, jax.P("i"))
  g = donate.jit(lambda x: x * 2, out_shardings=row)
  with pytest.raises(donate.DonationError, match=r"into: float32\[64\].*: reworded 0"):
    g.into(jnp.empty(64))(jax.device_put(jnp.ones(64), row))


class _Refusing:
  """A `jax.jit` function whose calls fail with words that name no donation."""

  def __init__(self, jitted):
    self._jitted = jitted

  def __call__(self, *args, **kwargs):
    raise ValueError("an error in other words")

  def __getattr__(self, name):
    return getattr(self._jitted, name)


def test_a_buffer_given_twice_is_named_whatever_the_error_says(monkeypatch):
  g = donate.jit(lambda p, q: (p["w"] + 1, q + 1), donate_argnums=0)
  g({"w": jnp.ones(4)}, jnp.ones(4))  # planned: the next calls take the C++ dispatch
  monkeypatch.setattr(g, "_dispatch", _Refusing(g._dispatch))
  monkeypatch.setattr(g, "_call", donate._jit.calling.checked(g))  # a call of the refusing one
  x = jnp.ones(4)
  with pytest.raises(DonationRuntimeError, match=r"once as p\['w'\] and once as q"):
    g({"w": x}, x)
  with pytest.raises(ValueError, match="^an error in other words$"):  # distinct buffers: as it is
    g({"w": x}, jnp.ones(4))
  assert not x.is_deleted()


def test_an_unknown_keyword_is_jax_jits_own_error():
  def f(x):
    return x

  with pytest.raises(TypeError) as theirs:
    jax.jit(f, not_a_keyword=1)
  with pytest.raises(TypeError) as ours:
    donate.jit(f, not_a_keyword=1)
  assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
  np.testing.assert_array_equal(donate.jit(f)(jnp.ones(2)), jnp.ones(2))
