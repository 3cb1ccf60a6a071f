"""`donate.jit`'s staged objects and executables where JAX's own APIs take `jax.jit`'s, on a
re-paired signature (the swapped update, where donate pairs b -> out[0] and a -> out[1] and
`jax.jit` pairs first come, first served): the same results, bitwise, and the user's output
order everywhere, on one device and on eight."""

import inspect
import pickle
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Format, Layout
from jax.experimental.serialize_executable import deserialize_and_load, serialize
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import donate
from test_symbolic import main_args

JAX_EVAL_SHAPE = jax._src.api.eval_shape  # JAX's own (importing donate sets jax.eval_shape)
N = 1 << 16  # 256 KiB of float32: above copy_threshold, so donate re-pairs


def swapped(a, b):
  return b.at[0].set(1.0), a + 1.0


def mesh8():
  return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))


SHARDINGS = {
    "1 device": lambda: jax.sharding.make_single_device_sharding(jax.devices()[0]),
    "8 devices": lambda: NamedSharding(mesh8(), P("x")),
}


def inputs(sharding):
  a = jax.device_put(jnp.arange(N, dtype=jnp.float32), sharding)
  b = jax.device_put(-jnp.arange(N, dtype=jnp.float32), sharding)
  return a, b


def compiled_pair(sharding, **kwargs):
  ours = donate.jit(swapped, donate_argnums=(0, 1), **kwargs)
  theirs = jax.jit(swapped, donate_argnums=(0, 1), **kwargs)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return ours.lower(*inputs(sharding)).compile(), theirs.lower(*inputs(sharding)).compile()


def pointers(x):
  return [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]


def same(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("where", SHARDINGS)
def test_the_re_paired_program_keeps_the_users_output_order(where):
  ours, _ = compiled_pair(SHARDINGS[where]())
  assert ours.plan.aliases == {"out[0]": "b", "out[1]": "a"}
  assert ours.memory_analysis().temp_size_in_bytes < 1024  # no copy of either buffer
  a, b = inputs(SHARDINGS[where]())
  pa, pb = pointers(a), pointers(b)
  x, y = ours(a, b)
  assert a.is_deleted() and b.is_deleted()
  assert (pointers(x), pointers(y)) == (pb, pa)


@pytest.mark.parametrize("where", SHARDINGS)
def test_serialized_executables_give_jax_jits_results(where):
  ours, theirs = compiled_pair(SHARDINGS[where]())
  devices = jax.devices()[:8 if where == "8 devices" else 1]
  loaded_ours = deserialize_and_load(*serialize(ours), execution_devices=devices)
  loaded_theirs = deserialize_and_load(*serialize(theirs), execution_devices=devices)
  same(loaded_ours(*inputs(SHARDINGS[where]())), loaded_theirs(*inputs(SHARDINGS[where]())))
  same(loaded_ours(*inputs(SHARDINGS[where]())), jax.jit(swapped)(*inputs(SHARDINGS[where]())))


@pytest.mark.parametrize("where", SHARDINGS)
def test_per_output_facts_are_the_users(where):
  ours, theirs = compiled_pair(SHARDINGS[where]())
  for name in ("out_info", "output_shardings", "output_formats", "input_shardings",
               "input_formats", "in_tree", "out_tree", "args_info"):
    assert str(getattr(ours, name)) == str(getattr(theirs, name)), name
  assert ours.cost_analysis().keys() == theirs.cost_analysis().keys()
  # The runtime executable returns the user's outputs in order too.
  flat = ours.runtime_executable().execute_sharded(list(inputs(SHARDINGS[where]())))
  outs = flat.disassemble_into_single_device_arrays()
  assert np.asarray(outs[0][0])[0] == 1.0 and np.asarray(outs[1][0])[0] == 1.0
  assert np.asarray(outs[0][0])[1] == -1.0 and np.asarray(outs[1][0])[1] == 2.0
  text = ours.as_text()
  assert "input_output_alias={ {0}: (1, {}, may-alias), {1}: (0, {}, may-alias) }" in text


@pytest.mark.parametrize("where", SHARDINGS)
def test_compiled_with_in_shardings_and_called_again(where):
  sharding = SHARDINGS[where]()
  ours, theirs = compiled_pair(sharding, in_shardings=(sharding, sharding))
  same(ours(*inputs(sharding)), theirs(*inputs(sharding)))
  same(ours(*inputs(sharding)), theirs(*inputs(sharding)))


@pytest.mark.parametrize("donate_argnums", [(0, 1), ()], ids=["re-paired", "donating nothing"])
def test_jax_eval_shape_keeps_out_shardings_and_layouts(donate_argnums):
  # jax.eval_shape asks JAX's own jit type for its trace's out_info and wraps anything else in a
  # fresh jax.jit, whose outputs state no sharding (on an Auto mesh) and no layout.
  sharding = NamedSharding(mesh8(), P("x"))
  layout = Format(Layout(major_to_minor=(0, 1)), sharding)
  a = jax.device_put(jnp.ones((64, 8), jnp.float32), sharding)
  b = jax.device_put(jnp.zeros((64, 8), jnp.float32), sharding)
  kwargs = {"donate_argnums": donate_argnums, "out_shardings": (layout, sharding)}

  def shapes_and_traces(jit):
    traces = []

    def f(x, y):
      traces.append(1)
      return swapped(x, y)

    g = jit(f, **kwargs)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # (jax.jit's unusable donation of a in lower())
      got = jax.eval_shape(g, a, b)
      assert str(g.trace(a, b).out_info) == str(got)  # the same trace, not a second one
    return got, len(traces)

  got, traces = shapes_and_traces(donate.jit)
  assert (got, traces) == shapes_and_traces(jax.jit) == (got, 1)
  assert (got[0].format, got[1].sharding) == (layout, sharding)
  assert not (a.is_deleted() or b.is_deleted())
  # Anything else reaches JAX's own eval_shape, which for a donate.jit function would say neither.
  assert jax.eval_shape(swapped, a, b)[1].sharding is None
  assert jax.eval_shape.__wrapped__(donate.jit(swapped, **kwargs), a, b)[1].sharding is None
  # ... and jax.eval_shape keeps JAX's name, documentation and signature, and pickles as itself.
  assert (jax.eval_shape.__name__, jax.eval_shape.__doc__) == ("eval_shape", JAX_EVAL_SHAPE.__doc__)
  assert inspect.signature(jax.eval_shape) == inspect.signature(JAX_EVAL_SHAPE)
  assert pickle.loads(pickle.dumps(jax.eval_shape)) is jax.eval_shape


def test_jax_export_of_a_re_paired_signature():
  spec = jax.ShapeDtypeStruct((N,), jnp.float32)
  exported = jax.export.export(donate.jit(swapped, donate_argnums=(0, 1)))(spec, spec)
  again = jax.export.deserialize(exported.serialize())
  same(again.call(*inputs(SHARDINGS["1 device"]())), jax.jit(swapped)(*inputs(
      SHARDINGS["1 device"]())))
  assert "tf.aliasing_output = 1" in exported.mlir_module()


@pytest.mark.parametrize("donate_argnums", [(), (0, 1)])
def test_a_program_calling_the_export_pairs_by_its_own_donations(donate_argnums):
  """The plan's aliases in the exported module never reach a program that calls it: its own
  donations pair the arguments, exactly as for `jax.jit`'s export (docs/limitations.md)."""
  spec = jax.ShapeDtypeStruct((N,), jnp.float32)
  compiled = []
  for jit in (donate.jit, jax.jit):
    exported = jax.export.export(jit(swapped, donate_argnums=(0, 1)))(spec, spec)
    call = jax.export.deserialize(exported.serialize()).call
    compiled.append(jax.jit(call, donate_argnums=donate_argnums).lower(spec, spec).compile())
  ours, theirs = (re.findall(r"input_output_alias=\{[^}]*\}", c.as_text()) for c in compiled)
  assert ours == theirs and bool(ours) == bool(donate_argnums)
  memory = [c.memory_analysis() for c in compiled]
  assert memory[0].temp_size_in_bytes == memory[1].temp_size_in_bytes
  assert memory[0].alias_size_in_bytes == memory[1].alias_size_in_bytes


_CACHE_RUN = """
import sys, jax, jax.numpy as jnp, numpy as np, donate
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
swapped = lambda a, b: (b.at[0].set(1.0), a + 1.0)
a, b = jnp.arange(2.0**16), -jnp.arange(2.0**16)
pb = b.unsafe_buffer_pointer()
x, y = donate.jit(swapped, donate_argnums=(0, 1))(a, b)
want = jax.jit(swapped)(jnp.arange(2.0**16), -jnp.arange(2.0**16))
assert np.array_equal(x, want[0]) and np.array_equal(y, want[1])
assert x.unsafe_buffer_pointer() == pb and a.is_deleted()

def kept_first_come(a, b):  # re-paired, a stays as out[2] and peaks higher: jax.jit's own is kept
  c = a * 0 + 1
  d = c + c * 2
  return jnp.flip(c + jnp.sum(c.at[0].set(7))), d, a, d

make = lambda: (jnp.arange(2.0**14), -jnp.arange(2.0**14))
f = donate.jit(kept_first_come, donate_argnums=(0, 1))
got, want = f(*make()), jax.jit(kept_first_come)(*make())
assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
assert any("jax.jit's own is kept" in n for n in f.plan(*make()).notes)
print("ok")
"""


def test_persistent_compilation_cache_hits_give_the_same_results(tmp_path):
  """Two processes share a persistent cache: the second one's programs are cache hits (the
  cache is process-wide once set, so each run is a process of its own), a re-paired one and,
  for a step whose re-paired program peaks higher, both programs its first call compiles (the
  second run picks `jax.jit`'s own again, with `jax.jit`'s results)."""
  import subprocess
  import sys
  cache = tmp_path / "cache"
  for run in range(2):
    done = subprocess.run([sys.executable, "-c", _CACHE_RUN, str(cache)], capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ,
                                                       "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    entries = sorted(p.name for p in cache.iterdir())
    if run == 0:
      first = entries
      assert first  # written by the first run
  assert entries == first  # the second run read them and wrote nothing new


def _main_aliases(lowered):
  return main_args(lowered.as_text())


def test_the_re_paired_module_is_its_own_jax_jits_lowering_of_the_same_trace_is_untouched():
  # The re-paired lowering sets its aliases in place on a module lowered for its plan alone:
  # JAX's caches still give the gate's own (first-come) lowering of the same trace its own
  # module, before and after, and a second re-paired lowering finds the re-paired one.
  f = donate.jit(swapped, donate_argnums=(0, 1))
  a, b = inputs(SHARDINGS["1 device"]())
  traced = f.trace(a, b)
  prep = traced._signature.prepared
  assert prep.realiased
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    first_come_before = prep.traced.lower()
    ours = traced.lower()
    first_come_after = prep.traced.lower()
    again = donate.jit(swapped, donate_argnums=(0, 1)).lower(a, b)
  assert _main_aliases(ours) == [1, 0] == _main_aliases(again)
  assert _main_aliases(first_come_before) == [0, 1] == _main_aliases(first_come_after)
  got = ours.compile()(*inputs(SHARDINGS["1 device"]()))
  same(got, jax.jit(swapped)(*inputs(SHARDINGS["1 device"]())))
