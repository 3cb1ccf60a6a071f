"""The memory doctor (issue 28): the peak in the user's terms (categories from the dataflow), by
source line with layer counts, measured advice, the persistent compilation cache, the CLI."""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import donate
from donate import _examples as examples
from donate import _profile, targets
from donate._profile import limits, views
from donate._profile.categories import CATEGORIES
from donate._profile.flow import Flow
from donate._xla import hlo as _hlo

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

THIS = os.path.basename(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _line(marker):
  with open(__file__) as fh:
    return next(k for k, text in enumerate(fh, 1) if marker in text and "_line(" not in text)


def _categories(p):
  return {e.path: e.category for e in p.at_peak if e.kind == "argument"}


def _check_sums(p):
  assert {e.category for e in p.at_peak} <= set(CATEGORIES)
  rows = p.by_category()
  assert sum(r.bytes for r in rows) == p.peak_bytes
  assert [r.bytes for r in rows] == sorted((r.bytes for r in rows), reverse=True)
  assert sum(r.count for r in rows) == len(p.at_peak)


def mlp_step(params, x):
  def loss(p):
    h = jnp.tanh(x @ p["w1"])  # mlp: the residual
    return jnp.mean((h @ p["w2"]) ** 2)
  grads = jax.grad(loss)(params)
  return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


def mlp_args(d=256):
  return {"w1": jnp.ones((d, 2 * d)), "w2": jnp.ones((2 * d, d))}, jnp.ones((64, d))


def test_an_mlp_step_parameters_inputs_and_activations():
  p = donate.memory_profile(jax.jit(mlp_step, donate_argnums=0), *mlp_args())
  _check_sums(p)
  assert _categories(p) == {"params['w1']": "parameters", "params['w2']": "parameters",
                            "x": "inputs"}
  acts = [e for e in p.at_peak if e.category == "activations"]
  assert acts and acts[0].source.endswith(f"{THIS}:{_line('mlp: the residual')}")


def momentum_step(params, mu, x):
  def loss(p):
    h = jax.nn.gelu(x @ p["wi"])                       # transformer: ff residual
    att = jax.nn.softmax(h @ h.T / 8.0, axis=-1) @ h
    return jnp.mean((att @ p["wo"]) ** 2)
  grads = jax.grad(loss)(params)
  mu = jax.tree.map(lambda m, g: 0.9 * m + g, mu, grads)
  params = jax.tree.map(lambda w, m: w - 0.01 * m, params, mu)
  return params, mu


def test_a_transformer_step_tells_parameters_optimizer_state_and_activations_apart():
  d, s = 256, 256
  params = {"wi": jnp.full((d, 4 * d), 0.01), "wo": jnp.full((4 * d, d), 0.01)}
  mu = jax.tree.map(jnp.zeros_like, params)
  args = (params, mu, jnp.ones((s, d)))
  p = donate.memory_profile(jax.jit(momentum_step, donate_argnums=(0, 1)), *args)
  _check_sums(p)
  assert _categories(p) == {"params['wi']": "parameters", "params['wo']": "parameters",
                            "mu['wi']": "optimizer state", "mu['wo']": "optimizer state",
                            "x": "inputs"}
  found = {e.category for e in p.at_peak}
  assert "activations" in found
  assert found & {"gradients", "activations"}
  # without the donations: each input pairs with the output computed from it, not mu's output
  plain = donate.memory_profile(jax.jit(momentum_step), *args)
  assert {(s.path, s.output) for s in plain.could_donate} == {
      ("params['wi']", "out[0]['wi']"), ("params['wo']", "out[0]['wo']"),
      ("mu['wi']", "out[1]['wi']"), ("mu['wo']", "out[1]['wo']")}


def scan_step(stack, x):
  def loss(ws):
    def layer(h, w):
      return jnp.tanh(h @ w), None  # scan: one layer's residual
    return jnp.sum(lax.scan(layer, x, ws)[0])
  return stack - 0.1 * jax.grad(loss)(stack)


def test_a_scan_over_layers_counts_one_layer_s_residual_times_the_trip_count():
  layers, d, b = 6, 128, 32
  p = donate.memory_profile(jax.jit(scan_step, donate_argnums=0),
                            jnp.full((layers, d, d), 0.01), jnp.ones((b, d)))
  _check_sums(p)
  assert _categories(p)["stack"] == "parameters"
  where = f"{THIS}:{_line('scan: one layer')}"
  rows = [r for r in p.by_line() if r.source.endswith(where)]
  assert rows and rows[0].category == "activations"
  stacked = [e for e in p.at_peak if e.source and e.source.endswith(where)
             and e.category == "activations" and e.repeat == layers]
  assert stacked and all(e.bytes == layers * b * d * 4 for e in stacked)
  assert rows[0].count >= layers and rows[0].bytes // rows[0].count == b * d * 4
  assert str(rows[0]).startswith(f"{rows[0].count} x 16.0 KiB, layer() at {where}")
  assert f"x 16.0 KiB, layer() at {where}" in str(p)


def decode_loop(cache, w, x):
  def one(i, carry):
    cache, h = carry
    h = jnp.tanh(h @ w)
    return lax.dynamic_update_slice(cache, h[None], (i, 0, 0)), h
  return lax.fori_loop(0, cache.shape[0], one, (cache, x))


def test_a_kv_cache_decode_loop_is_state():
  args = (jnp.zeros((16, 8, 256)), jnp.full((256, 256), 0.01), jnp.ones((8, 256)))
  p = donate.memory_profile(jax.jit(decode_loop, donate_argnums=0), *args)
  _check_sums(p)
  assert _categories(p)["cache"] == "state" and _categories(p)["w"] == "inputs"
  assert "activations" not in {e.category for e in p.at_peak}
  plain = donate.memory_profile(jax.jit(decode_loop), *args)
  assert ("cache", "out[0]") in {(s.path, s.output) for s in plain.could_donate}


def test_a_data_and_tensor_parallel_step_on_8_cpu_devices():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))

  def body(w, x):
    g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * lax.psum(g, "dp")
  step = jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("dp", None)),
                       out_specs=P(None, "tp"), check_vma=False)
  w = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, P(None, "tp")))
  x = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P("dp", None)))
  p = donate.memory_profile(jax.jit(step, donate_argnums=0), w, x)
  _check_sums(p)
  assert _categories(p) == {"w": "parameters", "x": "inputs"}
  w_entry = next(e for e in p.at_peak if e.path == "w")
  assert w_entry.bytes == 256 * 256 * 4 // 4


def _planted(extra):
  def step(params, x):
    def loss(p):
      h = jnp.tanh(x @ p["w1"])
      if extra:
        h = h * jax.nn.sigmoid(h @ p["w3"])  # planted: an extra residual
      return jnp.mean((h @ p["w2"]) ** 2)
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)
  return step


def test_compare_finds_a_planted_residual_in_the_activations():
  d = 512
  params = {"w1": jnp.full((d, d), 0.01), "w2": jnp.full((d, d), 0.01),
            "w3": jnp.full((d, d), 0.01)}
  x = jnp.ones((1024, d))
  before = donate.memory_profile(jax.jit(_planted(False), donate_argnums=0), params, x)
  after = donate.memory_profile(jax.jit(_planted(True), donate_argnums=0), params, x)
  planted = f"{THIS}:{_line('planted: an extra')}"
  grown = [c for c in before.compare(after).grew() if c.key.endswith(planted)]
  assert grown and grown[0].delta >= x.nbytes, str(before.compare(after))
  rows = [r for r in after.by_line() if r.source.endswith(planted)]
  assert rows and rows[0].category == "activations", str(after)
  acts = lambda p: sum(r.bytes for r in p.by_category() if r.key == "activations")
  assert acts(after) - acts(before) >= x.nbytes


def test_printing_compiles_nothing_until_measure():
  p = donate.memory_profile(jax.jit(mlp_step, donate_argnums=0), *mlp_args())
  text, page = str(p), p._repr_html_()
  assert "not measured yet: profile.measure()" in text and "not measured yet" in page
  assert not p.saving_measured
  assert "by category:" in text and "treemap" not in text and "activations" in page
  assert "by category:</p>" in page and "<svg" in page  # the treemap, XLA's packing
  assert len(p.layout) >= sum(e.kind == "temporary" for e in p.at_peak)
  assert p.measure() is p and p.saving_measured
  assert "donation saved" in str(p) and "not measured yet" not in str(p)


def test_each_advice_figure_is_a_compile():
  p = donate.memory_profile(jax.jit(mlp_step), *mlp_args())
  items = p.advice()
  donation = next(a for a in items if a.how == "donate_argnums=0")
  direct = donate.memory_profile(jax.jit(mlp_step, donate_argnums=0), *mlp_args())
  assert donation.peak_bytes == direct.peak_bytes
  assert donation.saving_bytes == p.peak_bytes - direct.peak_bytes > 0
  option = next(a for a in items if "xla_cpu_scheduler_type" in a.how)
  compiled = jax.jit(mlp_step).lower(*mlp_args()).compile(
      compiler_options={"xla_cpu_scheduler_type": MEMORY_SCHEDULER})
  assert option.peak_bytes == donate.memory_profile(compiled).peak_bytes
  assert option.saving_bytes == p.peak_bytes - option.peak_bytes
  assert all(a.peak_bytes is not None for a in items if "checkpoint" not in a.how)


MEMORY_SCHEDULER = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"


def test_the_memory_scheduler_lowers_a_step_s_peak_measured():
  d = 512
  params = {"wi": jnp.full((d, 4 * d), 0.01), "wo": jnp.full((4 * d, d), 0.01)}
  # A batch of 128: the memory scheduler lowers this step's peak on jaxlib 0.10.2 to 0.12.1 (with
  # a batch of 512 it raises it on 0.12.1).
  args = (params, params, jnp.ones((128, d)))
  jitted = jax.jit(momentum_step, donate_argnums=(0, 1))
  p = donate.memory_profile(jitted, *args)
  [option] = [a for a in p.advice() if "xla_cpu_scheduler_type" in a.how]
  direct = jitted.lower(*args).compile(compiler_options={"xla_cpu_scheduler_type":
                                                         MEMORY_SCHEDULER})
  assert option.peak_bytes == donate.memory_profile(direct).peak_bytes < p.peak_bytes
  assert option.saving_bytes == p.peak_bytes - option.peak_bytes > 0
  assert "lowers the peak" in str(option)


def test_checkpoint_advice_states_the_lines_of_the_residuals():
  """Where the profile cannot trace the step again (its Lowered alone), the lines whose saved
  values a checkpoint policy would recompute are stated, not compiled (test_memory_fit.py
  measures them where it can)."""
  lowered = jax.jit(scan_step, donate_argnums=0).lower(
      jnp.full((6, 128, 128), 0.01), jnp.ones((256, 128)))
  p = donate.memory_profile(lowered)
  stated = [a for a in p.advice(candidates=["checkpoint"]) if a.peak_bytes is None]
  acts = {}
  for e in p.at_peak:
    if e.category == "activations" and e.source:
      acts[e.source] = acts.get(e.source, 0) + e.bytes
  assert stated and all("jax.checkpoint" in a.how for a in stated)
  assert all(a.saving_bytes == acts[a.how.split(" at ")[1].split(" ")[0]] for a in stated)


def test_advice_of_a_compiled_alone_names_what_to_pass():
  compiled = jax.jit(mlp_step).lower(*mlp_args()).compile()
  with pytest.raises(donate.DonationError, match=r"advice\(\).*Fix: donate.memory_profile"):
    donate.memory_profile(compiled).advice()


CACHED = textwrap.dedent("""
  import sys, jax, jax.numpy as jnp, donate
  jax.config.update("jax_compilation_cache_dir", sys.argv[1])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  def step(w, x):
    return w - 0.1 * jnp.tanh(x @ w)
  w, x = jnp.ones((256, 256)), jnp.ones((256, 256))
  peaks = [donate.memory_profile(jax.jit(step, donate_argnums=0), w, x).peak_bytes
           for _ in range(2)]
  from donate import targets
  if targets.available():
    mesh = targets.gpu_mesh("h100", 8)
    s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    a = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=s)
    peaks += [donate.memory_profile(jax.jit(step, donate_argnums=0), a, a).peak_bytes
              for _ in range(2)]
  print(peaks)
""")


def test_a_persistent_compilation_cache(tmp_path):
  """The second profile of each program comes from the cache (a separate process: JAX sets its
  cache up once per process)."""
  out = subprocess.run([sys.executable, "-c", CACHED, str(tmp_path)], capture_output=True,
                       text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  peaks = eval(out.stdout.strip().splitlines()[-1])
  assert peaks[0] == peaks[1] and all(p == peaks[k & ~1] for k, p in enumerate(peaks))
  assert any(name.startswith("jit_step") for name in os.listdir(tmp_path))


SCRIPT = textwrap.dedent("""
  import sys, jax, jax.numpy as jnp
  def step(params, x):
    g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"]) ** 2))(params)
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, g)
  params = jax.jit(step, donate_argnums=0)({"w": jnp.ones((256, 512))}, jnp.ones((64, 256)))
  print("script output", sys.argv[1:])
  if "--fail" in sys.argv:
    raise ValueError("the script's own error")
  sys.exit(3)
""")


def test_the_cli_keeps_the_script_s_output_and_status(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(SCRIPT)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  run = lambda *a: subprocess.run([sys.executable, "-m", "donate.profile", *a], cwd=tmp_path,
                                  capture_output=True, text=True, env=env, timeout=600)
  ok = run("--out", "pages", "train.py", "a", "b")
  assert ok.returncode == 3, ok.stderr[-3000:]
  assert ok.stdout.strip() == "script output ['a', 'b']"
  assert "compiled programs" in ok.stderr and "  step: peak " in ok.stderr, ok.stderr[-3000:]
  pages = os.listdir(tmp_path / "pages")
  assert any(p.endswith("_step.html") for p in pages)
  page = next(p for p in pages if p.endswith("_step.html"))
  assert "parameters" in (tmp_path / "pages" / page).read_text()
  bad = run("train.py", "--fail")
  assert bad.returncode == 1 and "script output" in bad.stdout
  assert 'File "train.py", line 9' in bad.stderr and "ValueError: the script's own error" in \
      bad.stderr and "runpy" not in bad.stderr


def unrelated(w, x):
  s = jnp.sum(w)
  u = jnp.sort(jnp.sort(x, axis=0) * 2, axis=1)  # unrelated: a temporary of w's size
  c = lax.fori_loop(0, 3, lambda i, c: c + u[i, i], 0.0)
  return jnp.full_like(w, 1.0) * c + s, u[0]


def test_a_temporary_of_the_donated_size_is_not_blamed_without_dataflow():
  """The temporary of w's size live beside the donated buffer at the peak does not make w's
  output (computed from a scalar): no shadow is named, whatever the sizes."""
  w, x = jnp.ones((512, 512)), jnp.ones((512, 512))
  p = donate.memory_profile(jax.jit(unrelated, donate_argnums=0), w, x)
  same = [e for e in p.at_peak if e.kind == "temporary" and e.bytes == w.nbytes]
  assert same and same[0].source.endswith(f"{THIS}:{_line('unrelated: a temporary')}")
  assert p.alias_bytes == w.nbytes and p.shadowed == ()


def test_advice_of_a_donate_jit_compiled_is_measured():
  compiled = donate.jit(mlp_step, donate_argnums=0).lower(*mlp_args()).compile()
  p = compiled.memory_profile()
  [option] = p.advice()[:1]
  direct = jax.jit(mlp_step, donate_argnums=0).lower(*mlp_args()).compile(
      compiler_options={"xla_cpu_scheduler_type": MEMORY_SCHEDULER})
  assert option.peak_bytes == donate.memory_profile(direct).peak_bytes
  assert {e.path: e.category for e in p.at_peak if e.kind == "argument"}["params['w1']"] == \
      "parameters"


def test_a_flax_nnx_step_with_optax_adam():
  """Adam's mu and nu are optimizer state, every kernel and bias (the last layer's bias too,
  which XLA fuses into a backward kernel) parameters, the count state; each input is paired with
  the output computed from it."""
  nnx = pytest.importorskip("flax.nnx")
  optax = pytest.importorskip("optax")

  class MLP(nnx.Module):
    def __init__(self, rngs):
      self.l1, self.l2 = nnx.Linear(256, 1024, rngs=rngs), nnx.Linear(1024, 256, rngs=rngs)

    def __call__(self, x):
      return self.l2(jax.nn.gelu(self.l1(x)))

  graphdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
  tx = optax.adam(1e-3)

  def step(params, opt, x):
    grads = jax.grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(x) ** 2))(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt

  args = (params, tx.init(params), jnp.ones((512, 256)))
  p = donate.memory_profile(jax.jit(step, donate_argnums=(0, 1)), *args)
  _check_sums(p)
  found = _categories(p)
  assert all(c == "parameters" for k, c in found.items() if k.startswith("params")), found
  assert all(c == "optimizer state" for k, c in found.items() if ".mu[" in k or ".nu[" in k)
  assert found["opt[0].count"] == "state" and found["x"] == "inputs"
  assert "activations" in {e.category for e in p.at_peak}
  plain = donate.memory_profile(jax.jit(step), *args)
  pairs = {(s.path, s.output) for s in plain.could_donate}
  assert ("params['l1']['kernel'].value", "out[0]['l1']['kernel'].value") in pairs
  assert ("opt[0].mu['l1']['kernel'].value", "out[1][0].mu['l1']['kernel'].value") in pairs



def _stats(compiled):
  s = compiled.memory_analysis()
  return {"argument": s.argument_size_in_bytes, "output": s.output_size_in_bytes,
          "alias": s.alias_size_in_bytes, "temp": s.temp_size_in_bytes}


def test_a_flax_linen_step_with_optax_adam():
  """A linen MLP's step (value_and_grad, Adam, parameters and optimizer state donated) under
  jax.jit and donate.jit: at its peak, in the backward pass, the parameters, Adam's mu and nu,
  a kernel's gradient waiting for its update and the layers' saved activations, each told apart;
  the figures are the compiled program's memory_analysis()."""
  nn = pytest.importorskip("flax.linen")
  optax = pytest.importorskip("optax")

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      for _ in range(3):
        x = nn.gelu(nn.Dense(512)(x))  # linen: each layer's residual
      return nn.Dense(256)(x)

  model, x = MLP(), jnp.ones((256, 256))
  params = model.init(jax.random.key(0), x)["params"]
  tx = optax.adam(1e-3)

  def step(params, opt, x):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean(model.apply({"params": p}, x) ** 2))(
        params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss

  args = (params, tx.init(params), x)
  where = f"{THIS}:{_line('linen: each layer')}"
  kernels = {a.nbytes for a in jax.tree.leaves(params) if a.ndim == 2}
  for jitted in (jax.jit(step, donate_argnums=(0, 1)), donate.jit(step, donate_argnums=(0, 1))):
    p = donate.memory_profile(jitted, *args)
    _check_sums(p)
    compiled = jitted.lower(*args).compile()
    assert p.memory_analysis_figures() == _stats(compiled)
    assert p.xla_peak_bytes == getattr(compiled.memory_analysis(), "peak_memory_in_bytes", None)
    found = _categories(p)
    assert all(c == "parameters" for k, c in found.items() if k.startswith("params")), found
    assert all(c == "optimizer state" for k, c in found.items() if ".mu[" in k or ".nu[" in k)
    assert found["opt[0].count"] == "state" and found["x"] == "inputs"
    assert {"parameters", "optimizer state", "gradients", "activations"} <= {
        g.key for g in p.by_category()}
    grads = [e for e in p.at_peak if e.category == "gradients"]
    assert grads and {e.bytes for e in grads} <= kernels  # a Dense kernel's gradient
    [row] = [r for r in p.by_line() if r.source.endswith(where) and r.category == "activations"]
    assert row.count >= 2  # several layers' residuals from the one line


JOINED = """HloModule m

%join (p0: f32[4,2], p1: f32[4,2]) -> f32[4,4] {
  %p0 = f32[4,2]{1,0} parameter(0)
  %p1 = f32[4,2]{1,0} parameter(1)
  ROOT %c = f32[4,4]{1,0} concatenate(%p0, %p1), dimensions={1}, metadata={op_name="w['k']"}
}

ENTRY %main (q: f32[4,2], k: f32[4,2], x: f32[3,4]) -> f32[3,4] {
  %q = f32[4,2]{1,0} parameter(0), metadata={op_name="w['q']"}
  %k = f32[4,2]{1,0} parameter(1), metadata={op_name="w['k']"}
  %x = f32[3,4]{1,0} parameter(2), metadata={op_name="x"}
  %j = f32[4,4]{1,0} fusion(%q, %k), kind=kLoop, calls=%join, metadata={op_name="w['k']"}
  %b = f32[4,4]{1,0} bitcast(%j)
  ROOT %y = f32[3,4]{1,0} dot(%x, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp()/dot_general"}
}"""


def test_weights_xla_joins_for_one_matmul_are_read_by_the_forward_pass():
  """XLA:GPU concatenates the query, key and value weights into one kernel's operand (a fusion
  named after a weight, outside any pass): the forward matmul that reads the join reads each."""
  m = _hlo.parse_module(JOINED)
  flow = Flow(m)
  for name in ("q", "k"):
    assert "forward" in flow.reader_phases(m.find(name)), name


def _gpu_step(kind, devices, d_model=128, d_ff=512):
  """The transformer block's training step (shard_map over dp x tp: sequence-parallel
  attention and MLP, the gradients summed over dp, clipping, momentum) on `devices` abstract
  GPUs, 8 per host, tensor parallel within a host."""
  mesh = targets.gpu_mesh(kind, devices, ("dp", "tp"), shape=(devices // 8, 8))
  args = examples.block_abstract_args(mesh, batch=2 * (devices // 8), seq=64, d_model=d_model,
                                      d_ff=d_ff)
  step = examples.block_train_step(mesh, annotate=False)
  return jax.jit(step, donate_argnums=(0, 1)).lower(*args)


@pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")
@pytest.mark.parametrize("devices", [8, 64, 256])
@pytest.mark.parametrize("kind", ["h100", "b200"])
def test_a_data_and_tensor_parallel_step_compiled_ahead_of_time_for_gpus(kind, devices, tmp_path):
  """Compiled for 8 to 256 H100s or B200s (nothing runs): each device's profile has XLA's
  figures (memory_analysis() and the dump's allocations), its peak is XLA's up to the bytes
  XLA's heap trace leaves out, its categories sum to it and fits() reads the device's memory."""
  lowered = _gpu_step(kind, devices)
  p = _profile.profile_of_lowered(lowered, {"xla_dump_to": str(tmp_path)})
  compiled = lowered.compile()
  stats = compiled.memory_analysis()
  assert p.platform == "gpu"
  _check_sums(p)
  assert p.memory_analysis_figures() == _stats(compiled)
  [dump] = tmp_path.glob("*after_optimizations-buffer-assignment.txt")
  allocations = re.findall(r"^allocation \d+: size (\d+), (.*):$", dump.read_text(), re.M)
  assert sum(int(n) for n, what in allocations if "preallocated-temp" in what) == p.temp_bytes
  assert p.xla_peak_bytes == stats.peak_memory_in_bytes <= p.peak_bytes <= p.reserved_bytes
  assert p.peak_bytes - stats.peak_memory_in_bytes < 1024, p.explain()  # 16 B on 64, 256 H100s
  found = _categories(p)
  assert all(c == "parameters" for k, c in found.items() if k.startswith("params")), found
  assert all(c == "optimizer state" for k, c in found.items() if k.startswith("momentum"))
  assert found["x"] == found["y"] == "inputs" and len(found) == 18
  fit, capacity = p.fits(kind), targets.gpu_spec(kind).device_memory_bytes
  assert fit and fit.capacity_bytes == capacity and fit.needed_bytes == p.reserved_bytes
  assert fit.usable_bytes == limits.usable(kind).usable_bytes <= capacity
  assert fit.headroom_bytes == fit.usable_bytes - p.reserved_bytes
  assert p.fits(p.reserved_bytes) and not p.fits(p.reserved_bytes - 1)


@pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")
def test_a_step_too_large_for_an_h100_fits_a_b200():
  """An MLP of 2**23 (parameters, momentum and gradients of 32 GiB each per device): compiled for
  8 B200s it needs about 97 GiB per device, fits a B200 and not an H100; compiled for 8 H100s,
  XLA rematerializes towards the H100's memory and stops above it, which fits() says."""
  big = {}
  for kind in ("b200", "h100"):
    lowered = _gpu_step(kind, 8, d_model=4096, d_ff=1 << 23)
    big[kind] = p = donate.memory_profile(lowered)
    _check_sums(p)
    assert p.xla_peak_bytes <= p.peak_bytes <= p.reserved_bytes
    top = {g.key for g in p.by_category()[:3]}
    assert top == {"parameters", "optimizer state", "gradients"}, p.by_category()
  usable = {k: limits.usable(k).usable_bytes for k in big}
  b200, h100 = big["b200"], big["h100"]
  assert b200.fits("b200") and not b200.fits("h100")
  assert b200.fits("h100").headroom_bytes == usable["h100"] - b200.reserved_bytes < 0
  assert not h100.fits("h100") and h100.peak_bytes < b200.peak_bytes

def test_the_cli_runs_a_module(tmp_path):
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "train.py").write_text(SCRIPT)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
  out = subprocess.run([sys.executable, "-m", "donate.profile", "--out", "pages", "-m",
                        "pkg.train", "x"], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=600)
  assert out.returncode == 3 and out.stdout.strip() == "script output ['x']", out.stderr[-3000:]
  assert any(p.endswith("_step.html") for p in os.listdir(tmp_path / "pages"))
  usage = subprocess.run([sys.executable, "-m", "donate.profile"], capture_output=True,
                         text=True, env=env, timeout=600)
  assert usage.returncode == 2 and "usage: python -m donate.profile" in usage.stderr


def layer(h, w):
  return jnp.tanh(h @ w)  # repeated: each call's residual


def deep_step(params, mu, x):
  def loss(p):
    h = x
    for w in p:
      h = layer(h, w)
    return jnp.mean(h ** 2)
  grads = jax.grad(loss)(params)
  norm = jnp.sqrt(sum(jnp.sum(g * g) for g in grads))  # clipping: every gradient at once
  grads = [g / jnp.maximum(norm, 1.0) for g in grads]
  mu = jax.tree.map(lambda m, g: 0.9 * m + g, mu, grads)
  return jax.tree.map(lambda w, m: w - 0.01 * m, params, mu), mu


def test_a_repeated_layer_s_activations_gradients_and_optimizer_state_at_one_peak():
  """Four calls of one layer: its residuals counted per line ("3 x 2.0 MiB, layer() at ..."),
  beside a gradient held for the clipping, the parameters and the momentum."""
  d = 512
  params = [jnp.full((d, d), 0.01) for _ in range(4)]
  p = donate.memory_profile(jax.jit(deep_step, donate_argnums=(0, 1)), params, params,
                            jnp.ones((1024, d)))
  _check_sums(p)
  keys = {g.key for g in p.by_category()}
  assert {"activations", "gradients", "parameters", "optimizer state", "inputs"} <= keys
  where = f"{THIS}:{_line('repeated: each call')}"
  [row] = [r for r in p.by_line() if r.source.endswith(where) and r.category == "activations"]
  assert row.count >= 2 and row.bytes == row.count * 1024 * d * 4
  assert str(row) == f"{row.count} x 2.0 MiB, layer() at {where} (activations)"
  grads = [e for e in p.at_peak if e.category == "gradients"]
  assert all(e.bytes == d * d * 4 for e in grads)


LOOP_012 = """HloModule m

%body (p: (s32[], f32[4], f32[2,4], f32[4])) -> (s32[], f32[4], f32[2,4], f32[4]) {
  %p = (s32[], f32[4]{0}, f32[2,4]{1,0}, f32[4]{0}) parameter(0)
  %one = s32[] constant(1)
  %i = s32[] add(%p#0, %one), metadata={op_name="jit(f)/jvp()/while/body/add"}
  %h = f32[4]{0} tanh(%p#1), metadata={op_name="jit(f)/jvp()/while/body/tanh"}
  %r = f32[1,4]{1,0} bitcast(%h)
  %zero = s32[] constant(0)
  %s = f32[2,4]{1,0} dynamic-update-slice(%p#2, %r, %p#0, %zero), metadata={op_name="jit(f)/jvp()/while/body/dynamic_update_slice"}
  %w = f32[4]{0} copy(%p#3)
  ROOT %t = (s32[], f32[4]{0}, f32[2,4]{1,0}, f32[4]{0}) tuple(%i, %h, %s, %w)
}

%cond (c: (s32[], f32[4], f32[2,4], f32[4])) -> pred[] {
  %c = (s32[], f32[4]{0}, f32[2,4]{1,0}, f32[4]{0}) parameter(0)
  %two = s32[] constant(2)
  ROOT %lt = pred[] compare(%c#0, %two), direction=LT
}

ENTRY %main (a: f32[4], w: f32[4]) -> (f32[4], f32[2,4]) {
  %a = f32[4]{0} parameter(0), metadata={op_name="a"}
  %w = f32[4]{0} parameter(1), metadata={op_name="w"}
  %zero = s32[] constant(0)
  %z = f32[2,4]{1,0} broadcast(%zero), dimensions={}
  %init = (s32[], f32[4]{0}, f32[2,4]{1,0}, f32[4]{0}) tuple(%zero, %a, %z, %w)
  %loop = (s32[], f32[4]{0}, f32[2,4]{1,0}, f32[4]{0}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(f)/jvp()/while"}, backend_config={"known_trip_count":{"n":"2"}}
  %g = f32[2,4]{1,0} multiply(%loop#2, %loop#2), metadata={op_name="jit(f)/transpose(jvp())/mul"}
  ROOT %out = (f32[4]{0}, f32[2,4]{1,0}) tuple(%loop#1, %g)
}"""


def test_the_0_12_dump_spelling_of_a_tuple_element_is_read_as_a_get_tuple_element():
  """XLA 0.12's dumped modules (what the CLI reads) write `loop#2` where 0.10 has a
  get-tuple-element: the scan's stacked residual is read by the backward pass (activations, not
  a loop's state), and a carry the body passes on (`p#3`) is the argument it came from."""
  from types import SimpleNamespace

  from donate._profile import categories
  from donate._profile.flow import Flow
  from donate._xla import hlo as _hlo

  m = _hlo.parse_module(LOOP_012)
  flow = Flow(m)
  loop = m.find("loop")
  assert flow.reader_phases(loop, (2,)) == {"backward"}
  assert flow.origin(loop, (3,)) == (m.find("w", "main"), ())
  stacked = SimpleNamespace(kind="loop carry", value="loop{2}")
  assert categories.temporary_category(flow, stacked, {}) == "activations"
  assert categories.repeat_of(flow, stacked) == 2
  carried = SimpleNamespace(kind="loop carry", value="loop{3}")
  assert categories.temporary_category(flow, carried, {1: "parameters"}) == "parameters"


CACHED_SCRIPT = textwrap.dedent("""
  import sys, jax, jax.numpy as jnp
  jax.config.update("jax_compilation_cache_dir", sys.argv[1])  # as MaxText's config does
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  if "--cached" in sys.argv:  # a script that turns the cache back on: its programs are counted
    jax.config.update("jax_enable_compilation_cache", True)
  def step(params, x):
    g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"]) ** 2))(params)
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, g)
  jax.jit(step, donate_argnums=0)({"w": jnp.ones((256, 512))}, jnp.ones((64, 256)))
""")


def test_the_cli_profiles_a_script_that_sets_a_compilation_cache_every_time(tmp_path):
  """A script that sets `jax_compilation_cache_dir` (MaxText does) run twice: the second run's
  programs are compiled again, not read from the cache, so both runs profile the step."""
  (tmp_path / "train.py").write_text(CACHED_SCRIPT)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  cache = str(tmp_path / "cache")
  for k in range(2):
    out = subprocess.run([sys.executable, "-m", "donate.profile", "--out", f"pages{k}",
                          "train.py", cache], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert any(p.endswith("_step.html") for p in os.listdir(tmp_path / f"pages{k}")), out.stderr
    assert "persistent compilation cache" not in out.stderr
  for k in range(2):
    on = subprocess.run([sys.executable, "-m", "donate.profile", "train.py", cache, "--cached"],
                        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert on.returncode == 0, on.stderr[-3000:]
    said = "read from JAX's persistent compilation cache: not compiled" in on.stderr
    assert said == (k == 1), on.stderr[-3000:]


SCAN_SCRIPT = textwrap.dedent("""
  import jax, jax.numpy as jnp, donate
  def scan_step(stack, x):
    def loss(stack):
      h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, stack)
      return jnp.mean(h ** 2)
    return stack - 0.1 * jax.grad(loss)(stack)
  args = (jnp.full((6, 128, 128), 0.01), jnp.ones((32, 128)))
  text = str(donate.memory_profile(jax.jit(scan_step, donate_argnums=0), *args))
  print(text[text.index("by category:"):text.index("by source line:")])
  jax.jit(scan_step, donate_argnums=0)(*args)
""")


def test_the_cli_and_memory_profile_agree_on_a_scan_step(tmp_path):
  """The CLI reads XLA's dump files (JAX 0.12 spells tuple elements `while.1#2` there), the API
  the compiled program: the same categories at the peak, stacked residuals as activations."""
  (tmp_path / "train.py").write_text(SCAN_SCRIPT)
  out = subprocess.run([sys.executable, "-m", "donate.profile", "--out", "pages", "train.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT})
  assert out.returncode == 0, out.stderr[-3000:]
  [page] = [p for p in os.listdir(tmp_path / "pages") if p.endswith("_scan_step.html")]
  text = (tmp_path / "pages" / page).read_text().split("<pre>")[-1]
  block = text[text.index("by category:"):text.index("by source line:")]
  assert block.strip() == out.stdout.strip() and "activations" in block


@pytest.mark.slow
def test_two_jax_distributed_processes_profile_a_data_parallel_step():
  """Two processes on 127.0.0.1 (two CPU devices each), one global mesh: each profiles the
  step it compiled, and its figures are that program's `memory_analysis()`, per device."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from _multiprocess_step import run_two  # noqa: PLC0415

  reports = run_two("_multiprocess_profile_worker.py", timeout=120)
  assert sorted(r["process_index"] for r in reports) == [0, 1]
  for r in reports:
    assert r["devices"] == 4
    for name in ("jax.jit", "donate.jit"):
      got = r[name]
      assert got["profile"] == got["compiled"], (name, got)
      assert got["xla_peak"][0] == got["xla_peak"][1] <= got["peak"] <= got["reserved"]
      assert got["profile"]["alias"] == 2 * 128 * 256 * 4  # both parameters donated
      assert got["profile"]["argument"] == got["profile"]["alias"] + got["x_bytes"]  # a shard
      assert got["categories"] == {"params['w1']": "parameters", "params['w2']": "parameters",
                                   "x": "inputs"}


def accumulated_step(params, mu, batches):
  def loss(p, x):
    return jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2

  def micro(acc, x):
    return jax.tree.map(jnp.add, acc, jax.grad(loss)(params, x)), None

  grads, _ = lax.scan(micro, jax.tree.map(jnp.zeros_like, params), batches)  # microbatch sums
  mu = jax.tree.map(lambda m, g: 0.9 * m + g, mu, grads)
  return jax.tree.map(lambda w, m: w - 0.01 * m, params, mu), mu


def test_gradient_accumulation_over_microbatches_in_a_loop():
  """The backward pass runs inside a loop over microbatches (MaxText's
  gradient_accumulation_steps): the parameters it reads there are parameters, the momentum
  optimizer state, and the loop's sums of gradients gradients, not a loop's state."""
  d = 256
  params = {"w1": jnp.full((d, 2 * d), 0.01), "w2": jnp.full((2 * d, d), 0.01)}
  p = donate.memory_profile(jax.jit(accumulated_step, donate_argnums=(0, 1)), params, params,
                            jnp.ones((4, 64, d)))
  _check_sums(p)
  assert _categories(p) == {"params['w1']": "parameters", "params['w2']": "parameters",
                            "mu['w1']": "optimizer state", "mu['w2']": "optimizer state",
                            "batches": "inputs"}
  sums = [e for e in p.at_peak if e.kind == "loop carry" and e.source
          and e.source.endswith(f"{THIS}:{_line('microbatch sums')}")]
  assert sums and all(e.category == "gradients" for e in sums)
  assert "state" not in {e.category for e in p.at_peak}


def swapped_momentum_step(params, mu, x):
  new_params, new_mu = momentum_step(params, mu, x)
  return new_mu, new_params  # the other order: donate.jit re-pairs, jax.jit does not run it


def test_advice_of_a_donate_jit_function_offers_what_it_could_donate_measured():
  """A donate.jit program jax.jit does not run as its own (re-paired by dataflow) still gets the
  "donate what could be donated" candidate, compiled: the same trace with mu donated too."""
  d = 256
  params = {"wi": jnp.full((d, 4 * d), 0.01), "wo": jnp.full((4 * d, d), 0.01)}
  args = (params, params, jnp.ones((256, d)))
  f = donate.jit(swapped_momentum_step, donate_argnums=0)
  assert f.trace(*args).__donate_program__().traced is None  # not jax.jit's own program
  direct = donate.memory_profile(jax.jit(swapped_momentum_step, donate_argnums=(0, 1)), *args)
  jitted = jax.jit(swapped_momentum_step, donate_argnums=0)
  for p in (donate.memory_profile(f, *args), f.lower(*args).compile().memory_profile(),
            donate.memory_profile(jitted, *args)):
    assert {s.argnum for s in p.could_donate} == {1}
    [donation] = [a for a in p.advice() if a.how == "donate_argnums=(0, 1)"]  # 0 kept
    assert donation.measured and donation.peak_bytes == direct.peak_bytes
    assert donation.saving_bytes == p.peak_bytes - direct.peak_bytes
    assert "mu['wi']" in donation.change


def test_the_cli_summary_names_the_top_category_and_its_share():
  """A program's line in the summary: its peak, its largest category's share and its group."""
  from donate._profile import report

  p = donate.memory_profile(jax.jit(momentum_step, donate_argnums=(0, 1)),
                            {"wi": jnp.ones((256, 1024)), "wo": jnp.ones((1024, 256))},
                            {"wi": jnp.ones((256, 1024)), "wo": jnp.ones((1024, 256))},
                            jnp.ones((256, 256)))
  top = p.by_category()[0]
  row = report.summary([p]).splitlines()[-1]
  share = round(100 * top.total_bytes / p.peak_bytes)
  assert row.startswith(f"  momentum_step: peak {views.size(p.peak_bytes)}, {share}% {top.key}")


def test_advice_says_when_a_change_raises_the_peak():
  """MaxText's tiny train step peaks 1.5 KiB higher with the memory scheduler: said as such."""
  from donate._profile.advice import Advice

  up, same, down = (Advice("schedule", "opt", 1000 - s, s) for s in (-24, 0, 24))
  assert str(up) == "schedule: raises the peak to 1.0 KiB (24 B more), measured - opt"
  assert str(same) == "schedule: leaves the peak at 1000 B, measured - opt"
  assert str(down) == "schedule: lowers the peak to 976 B (24 B saved), measured - opt"
