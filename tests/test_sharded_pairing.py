"""Dataflow pairing over several devices: the swapped update `(a, b) -> (b.at[0].set(1), a + 1)`
on meshes of the 8 virtual CPU devices. `jax.jit` pairs first come, first served (a -> out[0],
b -> out[1]) and copies; donate.jit states the shardings of the re-laid-out call so that the
planned pairs (b -> out[0], a -> out[1]) are the compiled program's `input_output_alias`."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import donate

N = 1 << 16


def swapped(a, b):
  return b.at[0].set(1.0), a + 1.0


def mesh_1d():
  return jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))


def mesh_2d():
  return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))


def pointers(a):
  return [s.data.unsafe_buffer_pointer() for s in a.addressable_shards]


def inputs(sharding, shape=(N,)):
  size = int(np.prod(shape))
  a = jax.device_put(jnp.arange(size, dtype=jnp.float32).reshape(shape), sharding)
  b = jax.device_put(-jnp.arange(size, dtype=jnp.float32).reshape(shape), sharding)
  return a, b


def aliases(compiled) -> dict[int, int]:
  """{parameter: output} from the compiled program's input_output_alias."""
  line = re.search(r"input_output_alias=\{([^\n]*)", compiled.as_text()).group(1)
  return {int(p): int(o) for o, p in re.findall(r"\{(\d+)\}:\s*\((\d+),", line)}


CASES = {
    "P(x)": (mesh_1d, P("x"), (N,), False),
    "replicated": (mesh_1d, P(), (N,), False),
    "P(x) with out_shardings": (mesh_1d, P("x"), (N,), True),
    "2-D mesh P(x, y)": (mesh_2d, P("x", "y"), (256, 256), False),
    "2-D mesh P(y) with out_shardings": (mesh_2d, P("y"), (256, 256), True),
}


@pytest.mark.parametrize("case", CASES)
def test_swapped_update_pairs_by_dataflow_on_every_sharding(case):
  make_mesh, spec, shape, give_out = CASES[case]
  sharding = NamedSharding(make_mesh(), spec)
  kwargs = dict(out_shardings=(sharding, sharding)) if give_out else {}
  f = donate.jit(swapped, donate_argnums=(0, 1), copy_threshold=0, **kwargs)
  a, b = inputs(sharding, shape)
  want = jax.jit(swapped)(*inputs(sharding, shape))
  plan = f.plan(a, b)
  assert plan.aliases == {"out[0]": "b", "out[1]": "a"}, plan
  assert [d.action for d in plan.decisions] == ["aliased", "aliased"]
  compiled = f.lower(a, b).compile()
  # Both inputs aliased, in the user's order: b (parameter 1) -> out[0], a -> out[1]; the
  # pointers below show where each user output lives.
  assert aliases(compiled) == {1: 0, 0: 1}
  # jax.jit's full copy is 2 x the per-device bytes; what is left is index arithmetic.
  assert compiled.memory_analysis().temp_size_in_bytes < 1024
  jax_temp = jax.jit(swapped, donate_argnums=(0, 1), **kwargs).lower(
      *inputs(sharding, shape)).compile().memory_analysis().temp_size_in_bytes
  assert jax_temp >= a.addressable_shards[0].data.nbytes
  pa, pb = pointers(a), pointers(b)
  x, y = f(a, b)
  assert a.is_deleted() and b.is_deleted()
  assert pointers(x) == pb and pointers(y) == pa
  assert x.sharding.is_equivalent_to(want[0].sharding, len(shape))
  np.testing.assert_array_equal(x, want[0])
  np.testing.assert_array_equal(y, want[1])


def test_a_pair_whose_output_sharding_differs_is_unusable_warned_and_strict_raises():
  mesh = mesh_1d()
  row, rep = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
  a, b = inputs(row)
  kwargs = dict(donate_argnums=(0, 1), out_shardings=(rep, rep))
  with pytest.raises(donate.DonationError, match="sharding differs"):
    donate.jit(swapped, strict=True, **kwargs)(a, b)
  assert not a.is_deleted() and not b.is_deleted()  # nothing consumed
  with pytest.warns(donate.UnusableDonationWarning, match="sharding differs"):
    plan = donate.jit(swapped, **kwargs).plan(a, b)
  assert all(d.action == "unusable" and "sharding differs" in d.reason for d in plan.decisions)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x, y = donate.jit(swapped, **kwargs)(a, b)
  assert any(str(w.message).startswith("Some donated buffers were not usable:") for w in caught)
  np.testing.assert_array_equal(y, jax.jit(lambda a: a + 1.0)(jnp.arange(N, dtype=jnp.float32)))


def test_abstract_sharded_arguments_plan_and_lower_with_the_planned_aliases():
  sharding = NamedSharding(mesh_1d(), P("x"))
  spec = jax.ShapeDtypeStruct((N,), jnp.float32, sharding=sharding)
  f = donate.jit(swapped, donate_argnums=(0, 1), copy_threshold=0)
  assert f.plan(spec, spec).aliases == {"out[0]": "b", "out[1]": "a"}
  text = f.lower(spec, spec).as_text()
  assert text.count("tf.aliasing_output") == 2


def test_in_order_outputs_on_a_mesh_run_on_jax_jits_own_path():
  sharding = NamedSharding(mesh_1d(), P("x"))
  f = donate.jit(lambda a, b: (a * 2.0, b + 1.0), donate_argnums=(0, 1))
  a, b = inputs(sharding)
  f(a, b)
  assert all(sig.program.prep.jax_own for sig in f._prepared.values())


def test_a_donor_xla_reuses_says_what_differs_from_its_output():
  """XLA puts a.T into a's buffer after partitioning: the reason names the shardings compared,
  not a fixed text."""
  a = jax.device_put(jnp.ones((512, 512)), NamedSharding(mesh_1d(), P("x")))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    d = donate.jit(lambda a: a.T, donate_argnums=0).plan(a).decisions[0]
  assert d.action == "aliased" and d.output == "out"
  assert d.reason.startswith("XLA reuses it for out (sharding P(None, 'x') vs P('x'))"), d.reason


@pytest.mark.parametrize("host_first", [True, False])
def test_an_output_put_in_host_memory_is_never_paired_with_a_device_buffer(host_first):
  # The output's type says host memory: jax.jit pairs by the aval, memory space included, and an
  # alias to a device buffer would fail at run time after both inputs were consumed
  sx = NamedSharding(mesh_1d(), P("x"))
  host = sx.with_memory_kind("pinned_host")

  def f(a, b):
    moved = jax.device_put(b + 1.0, host)
    return (moved, a * 2.0) if host_first else (a * 2.0, moved)

  seen = []
  for jit in (jax.jit, donate.jit):
    a, b = inputs(sx)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      out = jit(f, donate_argnums=(0, 1))(a, b)
    assert [o.sharding.memory_kind for o in out] == (
      ["pinned_host", "device"] if host_first else ["device", "pinned_host"]
    )
    seen.append(([np.asarray(o) for o in out], a.is_deleted(), b.is_deleted()))
  (want, *jax_deleted), (got, *deleted) = seen
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  assert deleted == jax_deleted == [True, False]
  plan = donate.jit(f, donate_argnums=(0, 1)).plan(*inputs(sx))
  assert [d.output for d in plan.decisions] == ["out[1]" if host_first else "out[0]", None]


@pytest.mark.parametrize("memory", ["output", "input"])
def test_a_donation_to_another_memory_kind_is_warned_about_as_jax_jit_warns(memory):
  # jax.jit offers a leftover donated input only to an output of its memory kind (when every
  # kind is known): none here, so both warn and keep the input alive
  sx = NamedSharding(mesh_1d(), P("x"))
  host = sx.with_memory_kind("pinned_host")
  arg_sharding, out_sharding = (sx, host) if memory == "output" else (host, sx)
  heads = []
  for jit in (jax.jit, donate.jit):
    a = jax.device_put(jnp.ones(N), arg_sharding)
    with warnings.catch_warnings(record=True) as seen:
      warnings.simplefilter("always")
      out = jit(lambda a: a + 1.0, donate_argnums=0, out_shardings=out_sharding)(a)
    np.testing.assert_array_equal(out, np.full(N, 2.0))
    assert not a.is_deleted()
    heads.append([str(w.message).split("\n")[0] for w in seen])
  (theirs,), (ours,) = heads  # JAX's sentence, then the leaf's path
  assert theirs.startswith("Some donated buffers were not usable: float32")
  assert ours.startswith(theirs.rstrip(".") + " (a)")
  d = donate.jit(lambda a: a + 1.0, donate_argnums=0, out_shardings=out_sharding).plan(
    jax.device_put(jnp.ones(N), arg_sharding)
  ).decisions[0]
  assert d.action == "unusable" and "memory kind" in d.reason
