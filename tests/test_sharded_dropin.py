"""donate.jit against jax.jit over the 8 virtual CPU devices: the same results, the same inputs
consumed, the same "Some donated buffers were not usable" warnings (JAX's sentence, donate's leaf
paths removed) and a compiled peak no higher, on meshes of Auto and Explicit axes, with output
shardings stated and not, for sharded, replicated and host (numpy) inputs.

`jax.jit` matches donations by the avals on one device (`mlir._set_up_aliases` over the sharded
avals), states an Explicit mesh's typed output sharding at lowering, and over several devices
with an output sharding left to propagation offers every donated input to XLA as a donor."""

import itertools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import donate

N = 64

FUNS = {
  "same": (lambda a, b: (a * 2, b + 1), 2),
  "swap": (lambda a, b: (b * 2, a + 1), 2),
  "sum": (lambda a, b: (a + b,), 1),
  "smaller": (lambda a, b: (a[: N // 2] * 2,), 1),
  "reduce": (lambda a, b: (a.sum() + b,), 1),
  "reversed": (lambda a, b: (b[::-1], a * 3), 2),
  "three": (lambda a, b: (a + 1, b + 1, a * b), 3),
}


def meshes(axis):
  return (jax.make_mesh((8,), ("x",), axis_types=(axis,)),
          jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis, axis)))


def inputs(kind, mesh, mesh2):
  row, rep = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
  put = jax.device_put
  made = {
    "row,row": lambda: (put(jnp.arange(N, dtype=jnp.float32), row), put(jnp.ones(N), row)),
    "row,rep": lambda: (put(jnp.arange(N, dtype=jnp.float32), row), put(jnp.ones(N), rep)),
    "np,row": lambda: (np.ones(N, np.float32), put(jnp.ones(N), row)),
    "rep,rep": lambda: (put(jnp.arange(N, dtype=jnp.float32), rep), put(jnp.ones(N), rep)),
    "2d": lambda: tuple(put(jnp.ones((8, 8)), NamedSharding(mesh2, P("x", None))) for _ in "ab"),
  }
  return made[kind]


def run(jit, fun, make, kwargs):
  """(outputs as numpy, which inputs were consumed, JAX's sentence of each donation warning), or
  the type of what the call raised (XLA rejects some of `jax.jit`'s own programs)."""
  def f(*a):  # a function of its own: no cache of an earlier case answers
    return fun(*a)

  args = make()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      out = [np.asarray(x) for x in jit(f, **kwargs)(*args)]
    except Exception as e:  # noqa: BLE001 (compared with jax.jit's)
      return type(e)
  consumed = tuple(getattr(a, "is_deleted", lambda: None)() for a in args)
  said = tuple(re.sub(r" \([^)]*\)", "", str(w.message).split("\n")[0])
               for w in caught if "donated buffers" in str(w.message))
  return out, consumed, said


def peak(jit, fun, make, kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    m = jit(lambda *a: fun(*a), **kwargs).lower(*make()).compile().memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)


def compare(fun, make, kwargs):
  theirs, ours = run(jax.jit, fun, make, kwargs), run(donate.jit, fun, make, kwargs)
  if isinstance(theirs, type):
    assert ours is theirs
    return ours
  assert len(theirs[0]) == len(ours[0])
  for x, y in zip(theirs[0], ours[0]):
    np.testing.assert_array_equal(x, y)
  assert ours[1:] == theirs[1:]
  assert peak(donate.jit, fun, make, kwargs) <= peak(jax.jit, fun, make, kwargs)
  return ours


def case(axis, fun_name, kind, stated):
  mesh, mesh2 = meshes(axis)
  fun, n_out = FUNS[fun_name]
  kwargs = {"donate_argnums": (0, 1)}
  if stated:
    where = (mesh2, P("x", None)) if kind == "2d" else (mesh, P("x"))
    kwargs["out_shardings"] = (NamedSharding(*where),) * n_out
  context = jax.set_mesh(mesh2 if kind == "2d" else mesh) if axis == AxisType.Explicit else None
  if context is None:
    return compare(fun, inputs(kind, mesh, mesh2), kwargs)
  with context:
    return compare(fun, inputs(kind, mesh, mesh2), kwargs)


def test_an_explicit_meshs_typed_output_is_matched_per_device_and_warned_about_as_jax_jit():
  # a[:32] * 2 is typed P('x') on the Explicit mesh: jax.jit states it at lowering, so `a`
  # (8 elements on each device) is no donor for an output of 4 and is warned about, by its aval
  # on one device; `b` is not read.
  _, consumed, said = case(AxisType.Explicit, "smaller", "row,row", stated=False)
  assert consumed == (False, False)
  assert said == ("Some donated buffers were not usable: float32[8].",)


def test_a_host_value_beside_sharded_arrays_with_stated_output_shardings():
  # The numpy value's copy is whole on each device: no output of 8 elements per device can take
  # it (before: a KeyError while planning, where jax.jit runs and warns).
  for axis in (AxisType.Auto, AxisType.Explicit):
    _, consumed, said = case(axis, "three", "np,row", stated=True)
    assert consumed == (None, True)
    assert said == ("Some donated buffers were not usable: float32[64].",)


def test_a_donor_xla_does_not_reuse_in_jax_jits_own_program_is_silent_as_in_jax_jit():
  # Auto axes, output sharding left to propagation: jax.jit offers both inputs to XLA as donors,
  # XLA reuses the replicated `b`, and nothing is warned about.
  _, consumed, said = case(AxisType.Auto, "reduce", "row,rep", stated=False)
  assert consumed == (False, True) and said == ()


def test_a_donated_python_scalar_offered_to_xla_with_the_rest_is_silent_as_in_jax_jit():
  mesh, _ = meshes(AxisType.Auto)
  make = lambda: (2.0, jax.device_put(jnp.ones(N), NamedSharding(mesh, P("x"))))  # noqa: E731
  _, consumed, said = compare(lambda s, b: (b * s,), make, {"donate_argnums": (0, 1)})
  assert consumed == (None, True) and said == ()


@pytest.mark.parametrize("first", ["numpy", "one device"])
def test_an_input_the_program_prunes_does_not_place_it_on_several_devices(first):
  # `b` (sharded over 8 devices) is not read: jax.jit prunes it, the program runs on one device,
  # and `a`, which no output can take, is warned about (not offered to XLA as a donor).
  mesh, _ = meshes(AxisType.Auto)
  a = (lambda: np.ones(N, np.float32)) if first == "numpy" else (lambda: jnp.ones(N))
  make = lambda: (a(), jax.device_put(jnp.ones(N), NamedSharding(mesh, P("x"))))  # noqa: E731
  _, consumed, said = compare(FUNS["smaller"][0], make, {"donate_argnums": (0, 1)})
  assert consumed == ((None if first == "numpy" else False), False)
  assert said == ("Some donated buffers were not usable: float32[64].",)


@pytest.mark.slow
@pytest.mark.parametrize("stated", [False, True], ids=["unspecified", "stated"])
@pytest.mark.parametrize("axis", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_every_case_is_jax_jits(axis, stated):
  kinds = ("row,row", "row,rep", "np,row", "rep,rep", "2d")
  for fun_name, kind in itertools.product(FUNS, kinds):
    if not (fun_name == "smaller" and kind == "2d"):
      case(axis, fun_name, kind, stated)
