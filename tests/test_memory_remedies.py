"""The remedies of issue 62 beyond a checkpoint the code has or a layer scan: each repeated layer
call of an unrolled model checkpointed, the optimizer state in host memory, collective memory
against its own region.

Every figure the doctor gives is checked against a compile the test makes itself, with the change
written as a user writes it (`nn.remat(Block, policy=...)`, `jax.checkpoint(layer, policy=...)`,
`with_memory_kind("pinned_host")` shardings)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate
from donate import targets
from donate._profile import layers, limits
from test_memory_fit import _gpt, _gpt_args, _gpt_step

CPS = jax.checkpoint_policies
NAMED = {"nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable"}


def _policy_of(how: str):
  return getattr(CPS, re.search(r"checkpoint_policies\.(\w+)", how).group(1))


def _flops(jitted, *args):
  return jitted.lower(*args).compile().cost_analysis()["flops"]


# -- layers unrolled by a Python for: flax linen -------------------------------------------------


@pytest.mark.slow
def test_a_linen_gpt_unrolled_each_layer_call_checkpointed_as_written():
  """A linen GPT whose `for` loop calls its blocks one after the other, no checkpoint, no
  scan: each block call is checkpointed with each named policy; the peak equals the GPT written
  with `nn.remat(Block, policy=...)`, the FLOPs ratio is XLA's, the outputs are the original's."""
  step, tx = _gpt_step(_gpt())
  args = _gpt_args(_gpt(), tx)
  p = donate.memory_profile(jax.jit(step), *args)
  items = [a for a in p.advice() if "layer calls" in a.change]
  assert {re.search(r"policies\.(\w+)", a.how).group(1) for a in items} == NAMED
  base = _flops(jax.jit(step), *args)
  for a in items:
    assert "each of the 2 layer calls at test_memory_fit.py:" in a.change, a
    assert a.how.startswith("x = nn.remat(block, policy=jax.checkpoint_policies."), a
    model = _gpt(remat=True, policy=_policy_of(a.how))  # its parameters named after nn.remat's
    written, theirs = jax.jit(_gpt_step(model)[0]), _gpt_args(model, tx)
    assert a.peak_bytes == donate.memory_profile(written, *theirs).peak_bytes, a
    assert a.flops_ratio == pytest.approx(_flops(written, *theirs) / base), a
    assert a.same_values is not None and a.same_values.split()[0] in ("bitwise", "allclose"), a
  assert any(a.peak_bytes != p.peak_bytes or a.flops_ratio != 1.0 for a in items)


def test_repeated_calls_are_found_in_the_forward_pass_only_where_layers_repeat():
  """The two block calls of the linen GPT are one run of two identical periods; a step
  without repeated layers has none (a `tree_map` over leaves is not a layer: no matmul)."""
  step, tx = _gpt_step(_gpt())
  jaxpr = jax.make_jaxpr(step)(*_gpt_args(_gpt(), tx))
  (run,) = layers.calls(layers.forward(jaxpr.jaxpr.eqns))
  assert len(run.spans) == 2 and run.linen and run.site[1].endswith("__call__")
  sizes = {stop - start for start, stop in run.spans}
  assert len(sizes) == 1
  plain = jax.make_jaxpr(lambda ws, x: jax.grad(lambda ws: jnp.sum(jnp.tanh(x @ ws[0])))(ws))
  assert layers.calls(layers.forward(plain(jnp.ones((2, 8, 8)), jnp.ones((4, 8))).jaxpr.eqns)) == ()


# -- layers unrolled by a Python for: equinox, plain JAX ---------------------------------------


def _eqx_step(policy=None):
  eqx = pytest.importorskip("equinox")

  def step(model, x):
    def loss(model):
      h = x
      for layer in model:
        if policy is None:
          h = jax.nn.gelu(jax.vmap(layer)(h))
        else:  # as advice writes it
          h = jax.checkpoint(lambda h: jax.nn.gelu(jax.vmap(layer)(h)), policy=policy)(h)
      return jnp.mean(h ** 2)
    grads = eqx.filter_grad(loss)(model)
    return jax.tree.map(lambda w, g: w - 0.1 * g, model, grads)
  return step


@pytest.mark.slow
def test_an_equinox_list_of_layers_each_call_checkpointed_as_written():
  eqx = pytest.importorskip("equinox")
  keys = jax.random.split(jax.random.key(0), 4)
  model = [eqx.nn.Linear(128, 128, key=k) for k in keys]
  x = jnp.linspace(0, 1, 512 * 128).reshape(512, 128)
  p = donate.memory_profile(jax.jit(_eqx_step()), model, x)
  items = [a for a in p.advice() if "layer calls" in a.change]
  assert len(items) == 3
  base = _flops(jax.jit(_eqx_step()), model, x)
  for a in items:
    assert a.how.startswith("h = jax.checkpoint(lambda h: jax.nn.gelu(jax.vmap(layer)(h)), "
                            "policy=jax.checkpoint_policies."), a
    written = jax.jit(_eqx_step(_policy_of(a.how)))
    assert a.peak_bytes == donate.memory_profile(written, model, x).peak_bytes, a
    assert a.flops_ratio == pytest.approx(_flops(written, model, x) / base), a
    assert a.same_values == "bitwise", a
  assert min(a.peak_bytes for a in items) < p.peak_bytes


def test_a_plain_jax_loop_of_layers_checkpointed_as_written():
  def make(policy=None):
    def layer(w, h):
      return jnp.tanh(jnp.sin(h @ w) @ w)

    def step(ws, x):
      def loss(ws):
        h = x
        for w in ws:
          h = layer(w, h) if policy is None else jax.checkpoint(layer, policy=policy)(w, h)
        return jnp.mean(h ** 2)
      return [w - 0.1 * g for w, g in zip(ws, jax.grad(loss)(ws))]
    return jax.jit(step)

  ws = [jnp.full((128, 128), 0.01 * (i + 1)) for i in range(4)]
  x = jnp.linspace(0, 1, 256 * 128).reshape(256, 128)
  p = donate.memory_profile(make(), ws, x)
  items = [a for a in p.advice() if "layer calls" in a.change]
  assert len(items) == 3
  for a in items:
    assert "jax.checkpoint(layer, policy=jax.checkpoint_policies." in a.how, a
    written = make(_policy_of(a.how))
    assert a.peak_bytes == donate.memory_profile(written, ws, x).peak_bytes, a
    assert a.flops_ratio == pytest.approx(_flops(written, ws, x) / _flops(make(), ws, x)), a
    assert a.same_values == "bitwise", a
  assert any(a.peak_bytes != p.peak_bytes for a in items)  # the rewrite is not the original


# -- the optimizer state in host memory --------------------------------------------------------


def _adam_step():
  def step(w, state, x):
    mu, nu = state
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    mu = 0.9 * mu + 0.1 * g
    nu = 0.999 * nu + 0.001 * g * g
    return w - 1e-3 * mu / (jnp.sqrt(nu) + 1e-8), (mu, nu)
  return step


def _host_written(step, device, host):
  """The step as JAX's host-offloading guide writes it: the state in `host` memory at the
  boundary, moved to the device inside and back after the update."""

  def written(w, state, x):
    state = jax.device_put(state, device)
    w, state = step(w, state, x)
    return w, jax.device_put(state, host)
  return written


def test_on_a_cpu_program_the_host_state_is_named_not_measured():
  """XLA:CPU compiles the state in pinned_host, but its memory analysis counts it as device
  memory (no host figures): the remedy is named with that reason and the state's bytes."""
  w = jnp.full((512, 512), 0.01)
  args = (w, (jnp.zeros_like(w), jnp.zeros_like(w)), jnp.ones((64, 512)))
  p = donate.memory_profile(jax.jit(_adam_step(), donate_argnums=(0, 1)), *args)
  [a] = [a for a in p.advice() if "optimizer state in host memory" in a.change]
  assert a.peak_bytes is None and "not measured on cpu" in a.change
  assert a.saving_bytes == 2 * w.nbytes  # the state's bytes, stated
  s = jax.sharding.make_single_device_sharding(jax.devices()[0])
  host = s.with_memory_kind("pinned_host")
  specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), args)
  specs = (specs[0], jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=host),
                                  specs[1]), specs[2])
  written = jax.jit(_host_written(_adam_step(), s.with_memory_kind("device"), host),
                    in_shardings=(s, (host, host), s), out_shardings=(s, (host, host)))
  stats = written.lower(*specs).compile().memory_analysis()
  assert stats.host_argument_size_in_bytes == stats.host_output_size_in_bytes == 0
  assert stats.argument_size_in_bytes >= 3 * w.nbytes  # the state counted with the device's


@pytest.mark.slow
@pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")
def test_on_compile_only_h100s_the_host_state_is_named_with_why_not():
  """The compile-only H100 devices report no memory kinds, so JAX drops pinned_host from their
  shardings: the remedy is named with that reason, not measured."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = targets.gpu_mesh("h100", 8, ("x",))
  rows, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
  assert rows.with_memory_kind("pinned_host").memory_kind is None
  spec = jax.ShapeDtypeStruct((4096, 4096), jnp.float32, sharding=rows)
  args = (spec, (spec, spec), jax.ShapeDtypeStruct((256, 4096), jnp.float32, sharding=whole))
  p = donate.memory_profile(jax.jit(_adam_step(), donate_argnums=(0, 1)), *args)
  [a] = [a for a in p.advice() if "optimizer state in host memory" in a.change]
  assert a.peak_bytes is None and "report no memory kinds" in a.change
  assert a.saving_bytes == 2 * (4096 * 4096 * 4 // 8)


# -- collective memory against its own region -----------------------------------------------------


@pytest.mark.parametrize(
    "env, version, shared, size",
    [
        ({}, (0, 10), False, "rest"),
        ({"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "512"}, (0, 10), False, 512 << 20),
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, (0, 10), True, "card"),
        ({"XLA_FLAGS": "--xla_gpu_enable_allocator_spatial_partitioning=true"}, (0, 10), False, "rest"),
        ({"XLA_FLAGS": "--xla_gpu_enable_allocator_spatial_partitioning=true"}, (0, 12), True, "usable"),
        ({}, (0, 12), True, "usable"),  # XLA's default in jaxlib 0.12: on
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, (0, 12), False, "rest"),
        ({"XLA_FLAGS": "--xla_gpu_enable_allocator_spatial_partitioning=true",
          "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, (0, 12), False, "rest"),
        ({"XLA_FLAGS": "--xla_gpu_enable_allocator_spatial_partitioning=false"}, (0, 12), False, "rest"),
    ],
)
def test_the_collective_region_under_each_setting(env, version, shared, size):
  region = limits.collective("h100", environ=env, version=version)
  limit = limits.usable("h100", environ=env)
  expected = {"rest": limit.card_bytes - limit.usable_bytes, "card": limit.card_bytes,
              "usable": limit.usable_bytes}.get(size, size)
  assert (region.shared, region.usable_bytes) == (shared, expected)
  fit = limits.fit(limit.usable_bytes + (1 << 20), "h100", None, env, 1 << 20, version)
  assert bool(fit) == (not shared)  # in its own region, the 1 MiB leaves the usable limit
  assert "collective memory 1.0 MiB" in str(fit) and region.why in str(fit)


@pytest.mark.slow
@pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")
def test_fits_checks_a_program_s_collective_memory_against_its_region(monkeypatch):
  """A psum placed in collective memory on 8 H100s: `fits` takes its bytes out of the usable
  limit's count and checks them against their own region; a region smaller than them does not
  fit, whatever the headroom."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = targets.gpu_mesh("h100", 8, ("x",))
  x = jax.ShapeDtypeStruct((1 << 22,), jnp.float32, sharding=NamedSharding(mesh, P("x")))

  def body(v):
    return jax.lax.psum(donate.with_symmetric(jnp.sin(v), "x"), "x")
  f = donate.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False))
  p = donate.memory_profile(f.lower(x).compile())
  assert p.collective_peak_bytes > 0
  for name in ("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_FLAGS"):
    monkeypatch.delenv(name, raising=False)
  fit, region = p.fits("h100"), limits.collective("h100")  # the installed jaxlib's region
  own = p.needed_bytes - (0 if region.shared else p.collective_peak_bytes)
  assert fit and fit.needed_bytes == own and fit.collective_bytes == p.collective_peak_bytes
  assert region.why in str(fit)
  if jax.__version_info__[:2] < (0, 12):  # no shared pool: the region is its own
    assert "its own, grown on demand up to the 25% of the card JAX leaves" in str(fit)
  monkeypatch.setenv("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "1")
  small = p.fits("h100")
  assert bool(small) == (limits.collective("h100").shared or p.collective_peak_bytes <= 1 << 20)
