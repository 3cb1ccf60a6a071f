"""Property: on random training and loop steps, `donate.jit` is `jax.jit` with the same donation,
never worse (issue 27): the straight-line programs of `test_pairing_never_worse.py` carried to
the steps users write.

Hypothesis draws a step of one of these kinds, over 1-3 parameters (float32 or bfloat16,
[128, 128], [64, 256], [256, 128], [16384] or [32768]):

* an optax update (Adam, AdamW, SGD with momentum, weight decay chained with momentum,
  Adafactor): `value_and_grad` of a loss, the optimizer's update, the new parameters;
* a loop or branch over two state arrays (`scan`, `fori_loop`, `while_loop`, `cond`) and a
  straight swap;
* arguments donated by name (`donate_argnames`, with or without `donate_argnums`), a static
  argument between donated ones, an equinox module as state;
* with or without `keep_unused`, and over 8 devices with or without every output replicated
  (`out_shardings`);

then what it returns, in any order and nesting (a tuple, a dict, a pair holding a tuple), some
values twice, inputs returned unchanged among them, and which arguments are donated. These are
the returns where first come, first served and dataflow pairing part. On one device and over 8
(sharded along one axis of a 1-D mesh, over both axes of a 4 x 2 mesh, or replicated):

* the compiled peak (arguments + outputs - aliased + temporaries, `memory_analysis()`) is never
  above `jax.jit`'s;
* the first call, a cached call, the `Compiled` object's call and a serialized and reloaded
  executable (`jax.experimental.serialize_executable`) all return `jax.jit`'s results without
  donation, bit for bit, in the user's order; outputs have `jax.jit`'s shardings with donation;
* no argument outside `donate_argnums`/`donate_argnames` is consumed.
"""

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jax.experimental.serialize_executable import deserialize_and_load, serialize
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from test_pairing_liveness import peak_of
from test_pairing_never_worse import settings

import donate

optax = pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")

pytestmark = pytest.mark.slow

N = 1 << 14
SHAPES = [(128, 128), (N,), (64, 256), (2 * N,), (256, 128)]
OPTIMIZERS: dict[str, Callable[[], Any]] = {
  "adam": lambda: optax.adam(1e-3),
  "adamw": lambda: optax.adamw(1e-3),
  "sgd_momentum": lambda: optax.sgd(0.1, momentum=0.9),
  "decay_momentum": lambda: optax.chain(
    optax.add_decayed_weights(1e-4), optax.sgd(0.1, momentum=0.9)
  ),
  "adafactor": lambda: optax.adafactor(1e-3),
}


@dataclasses.dataclass
class Step:
  """A step, a maker of fresh arguments `(args, kwargs)`, and `jax.jit`'s keywords for it."""

  fun: Callable
  arguments: Callable[[], tuple[list, dict]]
  jit_kwargs: dict

  @property
  def static(self) -> tuple[int, ...]:
    return self.jit_kwargs.get("static_argnums", ())

  def plain_kwargs(self) -> dict:
    return {k: v for k, v in self.jit_kwargs.items() if not k.startswith("donate_")}

  def donated(self, args: list, kwargs: dict) -> list:
    """The arguments `jax.jit` donates: by position and by name."""
    nums = self.jit_kwargs.get("donate_argnums", ())
    names = self.jit_kwargs.get("donate_argnames", ())
    return [a for i, a in enumerate(args) if i in nums] + [
      v for k, v in kwargs.items() if k in names]


class _Module(eqx.Module):
  w: jax.Array
  v: jax.Array


def _fill(structure, values: dict):
  if isinstance(structure, str):
    return values[structure]
  if isinstance(structure, dict):
    return {k: _fill(v, values) for k, v in structure.items()}
  return tuple(_fill(v, values) for v in structure)


@st.composite
def returns(draw, names):
  """A random output structure over `names`: some of them, in any order, one maybe twice."""
  order = draw(st.permutations(names))
  chosen = list(order[: draw(st.integers(1, len(names)))])
  if draw(st.booleans()) and draw(st.booleans()):
    chosen.append(draw(st.sampled_from(chosen)))
  form = draw(st.sampled_from(["tuple", "dict", "nested"]))
  if form == "tuple":
    return tuple(chosen)
  if form == "dict":
    return {f"{n}{k}": n for k, n in enumerate(chosen)}
  return (chosen[0], tuple(chosen[1:]))


def _subset(draw, candidates, p_each: float, fallback):
  """A random subset of `candidates` (each with about `p_each`), never empty."""
  picked = tuple(c for c in candidates if draw(st.floats(0, 1)) < p_each)
  return picked or (fallback,)


@st.composite
def steps(draw, kind, sharding_of):
  n = draw(st.integers(1, 3))
  specs = [(draw(st.sampled_from(SHAPES)), draw(st.sampled_from(["float32"] * 4 + ["bfloat16"])))
           for _ in range(n)]
  shape, dtype = specs[0]
  c = draw(st.integers(1, 8)) / 8

  def array(k, s=shape, d=dtype):
    x = jax.random.normal(jax.random.fold_in(jax.random.key(5), k), s).astype(d)
    return jax.device_put(x, sharding_of(s))

  if kind in OPTIMIZERS:
    opt = OPTIMIZERS[kind]()
    structure = draw(returns(["loss", "params", "opt_state", "grads", "old"]))

    def loss_fn(p, batch):
      return sum(jnp.mean(jnp.sin(w.astype(jnp.float32)) * batch.mean()) for w in p.values())

    def train(params, opt_state, batch):
      loss, grads = jax.value_and_grad(loss_fn)(params, batch)
      updates, opt_state = opt.update(grads, opt_state, params)
      new = optax.apply_updates(params, updates)
      return _fill(structure, {"loss": loss, "params": new, "opt_state": opt_state,
                               "grads": grads, "old": params})

    def arguments():
      params = {f"w{i}": array(i, s, d) for i, (s, d) in enumerate(specs)}
      return [params, jax.jit(opt.init)(params), jnp.arange(8.0)], {}

    donated = _subset(draw, (0, 1), 0.8, 1) + (() if draw(st.integers(0, 6)) else (2,))
    return Step(train, arguments, {"donate_argnums": tuple(sorted(donated))})

  if kind in LOOPS:
    core = LOOPS[kind](c)
    names = list(jax.eval_shape(core, *[jax.ShapeDtypeStruct(shape, dtype)] * 2))
    structure = draw(returns(names))
    donated = _subset(draw, (0, 1), 0.7, 0)
    return Step(lambda a, b: _fill(structure, core(a, b)),
                lambda: ([array(0), array(1)], {}), {"donate_argnums": donated})
  if kind == "by_name":
    structure = draw(returns(["m", "p", "g", "pin"]))

    def by_name(p, *, m, g):
      return _fill(structure, {"m": m * c + g, "p": p - 0.1 * m, "g": g * 2, "pin": p})

    names = _subset(draw, ("m", "g"), 0.7, "m")
    nums = (0,) if draw(st.booleans()) else ()
    return Step(by_name, lambda: ([array(0)], {"m": array(1), "g": array(2)}),
                {"donate_argnames": names, "donate_argnums": nums})
  if kind == "static":
    structure = draw(returns(["a", "b", "ab"]))

    def with_static(a, k, b):
      return _fill(structure, {"a": a * k, "b": b + k, "ab": a - b})

    return Step(with_static, lambda: ([array(0), 3, array(1)], {}),
                {"donate_argnums": _subset(draw, (0, 2), 0.7, 2), "static_argnums": (1,)})
  structure = draw(returns(["m", "w", "v", "x"]))

  def module_step(m, x):
    new = _Module(m.v * c + x, m.w - 0.1 * x)
    return _fill(structure, {"m": new, "w": new.w, "v": m.v, "x": x * 2})

  return Step(module_step, lambda: ([_Module(array(0), array(1)), array(2)], {}),
              {"donate_argnums": _subset(draw, (0, 1), 0.7, 0)})


def _scan(c):
  def core(a, b):
    def body(carry, x):
      u, v = carry
      return (v * c + x, u - 0.1 * v), jnp.sum(u)
    (u, v), ys = jax.lax.scan(body, (a, b), jnp.arange(3.0, dtype=a.dtype))
    return {"u": u, "v": v, "ys": ys, "a": a}
  return core


def _fori(c):
  def core(a, b):
    u, v = jax.lax.fori_loop(0, 3, lambda i, s: (s[1] + c, s[0] * 0.5), (a, b))
    return {"u": u, "v": v, "a": a, "b": b}
  return core


def _while(c):
  def core(a, b):
    _, u, v = jax.lax.while_loop(lambda t: t[0] < 3, lambda t: (t[0] + 1, t[2] * c, t[1] + t[2]),
                                 (0, a, b))
    return {"u": u, "v": v, "b": b}
  return core


def _cond(c):
  def core(a, b):
    u, v = jax.lax.cond(jnp.sum(a) > 0, lambda: (b, a * c), lambda: (a + 1, b - c))
    return {"u": u, "v": v, "a": a, "s": jnp.flip(b)}
  return core


def _swap(c):
  def core(a, b):
    return {"u": b * c + a, "v": a, "w": jnp.cumsum(b, axis=-1), "b": b}
  return core


# The two-array steps: kind -> the step, given a constant.
LOOPS = {"scan": _scan, "fori": _fori, "while": _while, "cond": _cond, "swap": _swap}
KINDS = (*OPTIMIZERS, *LOOPS, "by_name", "static", "module")


def _bits(tree) -> list:
  return [(x.shape, x.dtype, np.asarray(x).tobytes()) for x in jax.tree.leaves(tree)]


def _dynamic(step: Step, args: list) -> list:
  return [a for i, a in enumerate(args) if i not in step.static]


def check(step: Step):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # unusable donations: jax.jit's warning and donate's
    args, kwargs = step.arguments()
    want = _bits(jax.jit(step.fun, **step.plain_kwargs())(*args, **kwargs))
    try:
      placed = jax.jit(step.fun, **step.jit_kwargs)(*args, **kwargs)
    except jax.errors.JaxRuntimeError as e:  # XLA rejects jax.jit's own alias
      placed = e
    f = donate.jit(step.fun, **step.jit_kwargs)
    args, kwargs = step.arguments()
    donated = jax.tree.leaves(step.donated(args, kwargs))
    kept = [x for x in jax.tree.leaves((args, kwargs)) if not any(x is y for y in donated)]
    if isinstance(placed, Exception):  # then donate.jit fails alike, or runs right
      try:
        got = f(*args, **kwargs)
      except type(placed):
        return
      assert _bits(got) == want
      assert not [x for x in kept if isinstance(x, jax.Array) and x.is_deleted()]
      return
    got = f(*args, **kwargs)
    assert _bits(got) == want
    assert jax.tree.structure(got) == jax.tree.structure(placed)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(placed), strict=True):
      assert x.sharding == y.sharding, (x.sharding, y.sharding)
    assert not [x for x in kept if isinstance(x, jax.Array) and x.is_deleted()]
    args, kwargs = step.arguments()
    assert _bits(f(*args, **kwargs)) == want  # the cached call
    args, kwargs = step.arguments()
    ours = f.lower(*args, **kwargs).compile()
    theirs = jax.jit(step.fun, **step.jit_kwargs).lower(*args, **kwargs).compile()
    assert peak_of(ours) <= peak_of(theirs), (peak_of(ours), peak_of(theirs))
    assert _bits(ours(*_dynamic(step, args), **kwargs)) == want
    # Reloaded onto the devices it was compiled for (by default JAX reloads onto all 8: an
    # executable of one device then expects 8 shards, jax.jit's own as well).
    devices = ours.runtime_executable().local_devices()
    loaded = deserialize_and_load(*serialize(ours), execution_devices=devices)
    args, kwargs = step.arguments()
    assert _bits(loaded(*_dynamic(step, args), **kwargs)) == want


@pytest.mark.parametrize("kind", KINDS)
@settings(6)
@hypothesis.given(data=st.data())
def test_one_device(kind, data):
  device = jax.devices()[0]
  step = data.draw(steps(kind, lambda shape: jax.sharding.make_single_device_sharding(device)))
  step.jit_kwargs["keep_unused"] = data.draw(st.booleans())
  check(step)


_MESHES: dict[str, Any] = {}


def _mesh(shape, names):
  if names not in _MESHES:
    _MESHES[names] = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names),
                                   devices=jax.devices()[:8])
  return _MESHES[names]


def _placements():
  def along_x(shape):
    mesh = _mesh((8,), ("x",))
    return NamedSharding(mesh, P("x", *[None] * (len(shape) - 1)) if shape[0] % 8 == 0 else P())

  def both_axes(shape):
    mesh = _mesh((4, 2), ("a", "b"))
    return NamedSharding(mesh, P("a", "b") if len(shape) == 2 else P(("a", "b")))

  def replicated(shape):
    return NamedSharding(_mesh((8,), ("x",)), P())

  return st.sampled_from([along_x, both_axes, replicated])


@pytest.mark.parametrize("kind", KINDS)
@settings(3)
@hypothesis.given(data=st.data())
def test_eight_devices(kind, data):
  step = data.draw(steps(kind, data.draw(_placements())))
  step.jit_kwargs["keep_unused"] = data.draw(st.booleans())
  if data.draw(st.booleans()):  # every output replicated: pairs need the input replicated too
    step.jit_kwargs["out_shardings"] = NamedSharding(_mesh((8,), ("x",)), P())
  check(step)
