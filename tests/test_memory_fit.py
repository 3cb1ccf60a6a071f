"""Does it fit, and what do I change (issue 62): the usable limit JAX's allocator gives, checkpoint
policies measured by tracing the step again, the plan that composes remedies, the largest batch.

Every figure the doctor gives is checked against a compile the test makes itself, written as a
user writes the change (`nn.remat(Block, policy=...)`, `jax.checkpoint` around a scan body, the
compiler option, a smaller batch)."""

import ast
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate
from donate import targets
from donate._profile import advice, limits, profile_of_lowered

CPS = jax.checkpoint_policies
MEMORY_SCHEDULER = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


# -- the usable limit ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, fraction, why",
    [
        ({}, 0.75, "at JAX's default 75%"),
        ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}, 0.5, "at XLA_PYTHON_CLIENT_MEM_FRACTION=.5"),
        ({"XLA_CLIENT_MEM_FRACTION": "0.9"}, 0.9, "at XLA_CLIENT_MEM_FRACTION=0.9"),
        ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, 0.75, "grown on demand"),
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, 1.0, "XLA_PYTHON_CLIENT_ALLOCATOR=platform"),
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, 0.75, "at JAX's default 75%"),
    ],
)
def test_fits_compares_with_what_jax_s_allocator_gives(monkeypatch, env, fraction, why):
  """XLA's allocators are sized `total_memory * memory_fraction` (preallocated or grown up to
  it); the platform allocator asks CUDA for each buffer, up to the card."""
  for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION",
               "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR"):
    monkeypatch.delenv(name, raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  p = donate.memory_profile(jax.jit(lambda x: jnp.sin(x) * 2), jnp.ones((1024, 256)))
  card = targets.gpu_spec("h100").device_memory_bytes
  fit = p.fits("h100")
  assert fit and fit.usable_bytes == int(card * fraction) and fit.capacity_bytes == card
  assert fit.headroom_bytes == fit.usable_bytes - max(p.reserved_bytes, p.peak_bytes)
  assert why in str(fit) and str(fit).startswith("fits an H100: needs ")
  usable = fit.usable_bytes
  assert not limits.fit(usable + 1, "h100") and limits.fit(usable, "h100")
  assert p.fits("h100", fraction=0.5).usable_bytes == int(card * 0.5)


def test_both_fraction_variables_are_refused_as_jax_refuses_them(monkeypatch):
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")
  monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", ".6")
  p = donate.memory_profile(jax.jit(jnp.sin), jnp.ones(8))
  with pytest.raises(ValueError, match="XLA_CLIENT_MEM_FRACTION"):
    p.fits("h100")
  assert p.fits(1 << 20).usable_bytes == 1 << 20  # a byte count is taken as it is


# -- a scan over layers without a checkpoint ---------------------------------------------------


def _layer(w, h):
  return jnp.tanh(jnp.sin(h @ w) @ w)


def _scan_step(policy=None):
  def loss(ws, x):
    def body(h, w):
      return _layer(w, h), None
    if policy is not None:
      body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    h, _ = jax.lax.scan(body, x, ws)
    return jnp.mean(h ** 2)

  def step(ws, x):
    return ws - 0.1 * jax.grad(loss)(ws, x)
  return step


def _scan_args(batch=256):
  return jnp.full((4, 128, 128), 0.01), jnp.linspace(0, 1, batch * 128).reshape(batch, 128)


def _policy_of(how: str):
  name = re.search(r"checkpoint_policies\.(\w+)", how).group(1)
  return getattr(CPS, name)


def _as_written(plan):
  """`(compiler options, checkpoint policy)` of a plan's steps, as a user writes them."""
  options, policy = {}, None
  for s in plan.steps:
    if s.how.startswith("compiler_options="):
      options.update(ast.literal_eval(s.how.removeprefix("compiler_options=")))
    else:
      policy = _policy_of(s.how)
  return options, policy


@pytest.mark.slow
def test_a_scan_over_layers_checkpointed_is_measured_as_written():
  """Without a checkpoint in the code, each layer loop's body is checkpointed with each named
  policy: the peak equals the step written with `jax.checkpoint` around the scan body, the FLOPs
  ratio is XLA's, the outputs are the original's bit for bit."""
  args = _scan_args()
  p = donate.memory_profile(jax.jit(_scan_step()), *args)
  items = [a for a in p.advice() if "checkpoint" in a.change]
  assert len(items) == 3 and all(a.peak_bytes is not None for a in items)
  base_flops = jax.jit(_scan_step()).lower(*args).compile().cost_analysis()["flops"]
  for a in items:
    written = jax.jit(_scan_step(_policy_of(a.how)))
    direct = donate.memory_profile(written, *args)
    assert a.peak_bytes == direct.peak_bytes, a
    assert a.saving_bytes == p.peak_bytes - direct.peak_bytes
    flops = written.lower(*args).compile().cost_analysis()["flops"]
    assert a.flops_ratio == pytest.approx(flops / base_flops)
    assert a.same_values == "bitwise", a
    ours = jax.tree.leaves(written(*args))
    assert all(np.array_equal(x, y) for x, y in zip(ours, jax.tree.leaves(jax.jit(_scan_step())(*args))))
    assert "jax.lax.scan(jax.checkpoint(body" in a.how and "test_memory_fit.py" in a.how
  nothing = next(a for a in items if "nothing_saveable" in a.how)
  assert nothing.saving_bytes > 0 and nothing.flops_ratio > 1.0


@pytest.mark.slow
def test_the_plan_reaches_a_budget_and_its_peak_is_a_compile_with_all_its_changes():
  args = _scan_args()
  step = _scan_step()
  p = donate.memory_profile(jax.jit(step), *args)
  budget = p.peak_bytes - (p.peak_bytes - p.advice()[-3].peak_bytes) // 2  # needs a checkpoint
  plan = p.fit(budget)
  assert plan and plan.fits and plan.steps and plan.peak_bytes == plan.steps[-1].peak_bytes
  assert plan.needed_bytes <= budget < p.peak_bytes
  options, policy = _as_written(plan)
  lowered = jax.jit(_scan_step(policy)).lower(*args)
  direct = donate.memory_profile(lowered.compile(compiler_options=options or None))
  assert plan.peak_bytes == direct.peak_bytes
  previous = p.peak_bytes
  for s in plan.steps:
    assert s.saving_bytes == previous - s.peak_bytes > 0
    previous = s.peak_bytes
  assert plan.same_values == "bitwise"
  text = str(plan)
  assert "it fits after" in text and "compiles" in text and plan.steps[-1].how in text
  hopeless = p.fit(1 << 10)
  assert not hopeless and "nothing measured makes it fit" in str(hopeless)
  assert hopeless.peak_bytes <= plan.peak_bytes


@pytest.mark.slow
def test_the_largest_batch_fits_and_the_next_one_does_not():
  args = _scan_args(256)
  step = jax.jit(_scan_step())
  p = donate.memory_profile(step, *args)
  budget = p.peak_bytes + (p.peak_bytes // 3)
  found = p.largest_batch(budget)
  assert found.batch > 256 and found.compiles >= 3 and found.argnum == 1

  def needed(batch):
    q = donate.memory_profile(step, args[0], jax.ShapeDtypeStruct((batch, 128), jnp.float32))
    return q.fits(budget), q.peak_bytes
  fits, peak = needed(found.batch)
  assert fits and peak == found.peak_bytes
  assert not needed(found.batch + 1)[0]
  assert "batch" in str(found) and f"{found.compiles} compiles" in str(found)
  assert found.scales is True and found.sizes[:2] == (256, 512)


def test_the_batch_search_stops_when_the_step_slices_its_batch():
  """A step that takes its batch size from a config value and slices its input to it (MaxText's
  train step keeps `micro_batch_size_to_train_on` rows): a larger input adds no compute, only
  its own bytes. The search says so after two compiles instead of answering the batch at which
  the input alone fills the budget."""
  optax = pytest.importorskip("optax")
  micro, opt = 4, optax.adam(1e-3)

  def step(params, opt_state, data):
    data = {k: v[:micro] for k, v in data.items()}

    def loss(w):
      return jnp.mean((jnp.tanh(data["inputs"] @ w) - data["targets"]) ** 2)
    updates, opt_state = opt.update(jax.grad(loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def data(batch):
    return {"inputs": jnp.ones((batch, 64)), "targets": jnp.zeros((batch, 64))}
  params = jnp.full((64, 64), 0.01)
  jitted = jax.jit(step, donate_argnums=(0, 1))
  p = donate.memory_profile(jitted, params, opt.init(params), data(micro))
  budget = 2 * p.peak_bytes
  found = p.largest_batch(budget)
  assert found.batch == micro and found.peak_bytes == p.peak_bytes and found.compiles == 2
  assert found.scales is False and found.sizes == (micro, 2 * micro)
  text = str(found)
  assert "does not scale the step" in text and f"batch {micro} fits" in text

  def flops(batch):
    return jitted.lower(params, opt.init(params), data(batch)).compile().cost_analysis()["flops"]
  assert flops(2 * micro) == flops(micro)  # what the doctor read: no compute on the extra rows
  # and a search by bytes alone would have answered a batch the step never computes over
  assert donate.memory_profile(jitted, params, opt.init(params), data(16 * micro)).fits(budget)


# -- flax linen GPT, with and without nn.remat ---------------------------------------------------


def _gpt(remat=False, policy=None, vocab=64, d=32, heads=2, layers=2):
  nn = pytest.importorskip("flax.linen")

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.LayerNorm()(x)
      h = nn.SelfAttention(num_heads=heads, deterministic=True)(h, mask=nn.make_causal_mask(x[..., 0]))
      x = x + h
      h = nn.Dense(4 * d)(nn.LayerNorm()(x))
      return x + nn.Dense(d)(nn.gelu(h))

  block = nn.remat(Block, policy=policy) if remat else Block

  class GPT(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      x = nn.Embed(vocab, d)(tokens)
      for _ in range(layers):
        x = block()(x)
      return nn.Dense(vocab)(nn.LayerNorm()(x))
  return GPT()


def _gpt_step(model):
  optax = pytest.importorskip("optax")
  tx = optax.sgd(1e-2, momentum=0.9)  # adamw compiles for 3x as long on XLA:CPU

  def step(params, opt, tokens):
    def loss(p):
      logits = model.apply({"params": p}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, value
  return step, tx


def _gpt_args(model, tx, batch=4, seq=17):
  tokens = jax.random.randint(jax.random.key(1), (batch, seq), 0, 64)
  params = model.init(jax.random.key(0), tokens[:, :-1])["params"]
  return params, tx.init(params), tokens


@pytest.mark.slow
def test_a_flax_gpt_with_nn_remat_each_policy_measured_as_written():
  model = _gpt(remat=True)
  step, tx = _gpt_step(model)
  args = _gpt_args(model, tx)
  p = donate.memory_profile(jax.jit(step, donate_argnums=(0, 1)), *args)
  items = p.advice(["checkpoint policy"])
  assert {_policy_of(a.how) for a in items} == {
      CPS.nothing_saveable, CPS.dots_saveable, CPS.dots_with_no_batch_dims_saveable}
  for a in items:
    if _policy_of(a.how) is CPS.nothing_saveable:  # nn.remat's default: the step as profiled
      assert a.peak_bytes == p.peak_bytes and a.flops_ratio == 1.0
      continue
    written = _gpt(remat=True, policy=_policy_of(a.how))
    direct = donate.memory_profile(jax.jit(_gpt_step(written)[0], donate_argnums=(0, 1)), *args)
    assert a.peak_bytes == direct.peak_bytes, a
    assert a.same_values is not None and a.same_values.split()[0] in ("bitwise", "allclose"), a
    assert "nn.remat" in a.how
  dots = next(a for a in items if "dots_saveable" in a.how and "no_batch" not in a.how)
  assert dots.flops_ratio < 1.0  # it saves what nothing_saveable recomputes


@pytest.mark.slow
def test_a_flax_gpt_without_remat_has_its_layer_calls_measured_and_its_plan_says_so():
  """A linen GPT with its layers unrolled and no checkpoint: no loop to checkpoint, so advice
  checkpoints each layer call (measured, tests/test_memory_remedies.py checks the figures), and
  a plan of XLA's options for a budget below what they reach says plainly that nothing measured
  makes it fit."""
  model = _gpt()
  step, tx = _gpt_step(model)
  args = _gpt_args(model, tx)
  p = donate.memory_profile(jax.jit(step, donate_argnums=(0, 1)), *args)
  items = [a for a in p.advice() if "checkpoint" in a.change]
  assert items and all("layer calls" in a.change and a.peak_bytes is not None for a in items)
  plan = p.fit(p.peak_bytes // 4, candidates=["xla_cpu_scheduler_type"])
  assert not plan and "nothing measured makes it fit" in str(plan)
  if plan.steps:
    lowered = jax.jit(step, donate_argnums=(0, 1)).lower(*args)
    assert plan.peak_bytes == donate.memory_profile(
        lowered.compile(compiler_options=MEMORY_SCHEDULER)).peak_bytes


# -- equinox ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_equinox_model_with_filter_checkpoint_measured_as_written():
  eqx = pytest.importorskip("equinox")

  def make(policy):
    def step(layers, x):
      def loss(layers):
        h = x
        for layer in layers:
          def apply(l, v):
            return jax.nn.gelu(jax.vmap(l)(v))
          h = eqx.filter_checkpoint(apply, policy=policy)(layer, h)
        return jnp.mean(h ** 2)
      grads = eqx.filter_grad(loss)(layers)
      return jax.tree.map(lambda w, g: w - 0.1 * g, layers, grads)
    return jax.jit(step)

  keys = jax.random.split(jax.random.key(0), 3)
  layers = [eqx.nn.Linear(128, 128, key=k) for k in keys]
  x = jnp.linspace(0, 1, 256 * 128).reshape(256, 128)
  p = donate.memory_profile(make(None), layers, x)
  items = [a for a in p.advice() if "checkpoint policy" in a.change]
  assert len(items) == 3
  for a in items:
    assert a.peak_bytes == donate.memory_profile(make(_policy_of(a.how)), layers, x).peak_bytes, a
    assert a.same_values == "bitwise", a
    assert "eqx.filter_checkpoint" in a.how


# -- host offload on compile-only H100s ------------------------------------------------------------


def offload_step(policy):
  """A scan over 4 layers, each checkpointed with `policy`, one value named "proj"."""
  from jax.ad_checkpoint import checkpoint_name

  def layer(w, h):
    return jnp.tanh(checkpoint_name(h @ w, "proj") @ w)

  def loss(ws, x):
    def body(h, w):
      return jax.checkpoint(layer, policy=policy)(w, h), None
    h, _ = jax.lax.scan(body, x, ws)
    return jnp.mean(h ** 2)
  return jax.jit(lambda ws, x: ws - 0.1 * jax.grad(loss)(ws, x))


def offload_args():
  """`offload_step`'s arguments, abstract, replicated over 8 compile-only H100s."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  s = NamedSharding(targets.gpu_mesh("h100", 8, ("x",)), P())
  return (jax.ShapeDtypeStruct((4, 512, 512), jnp.float32, sharding=s),
          jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=s))


@pytest.mark.slow
@pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")
def test_offload_on_h100s_is_measured_with_its_host_bytes():
  """On a GPU target the offload policies are compiled too: the peak and the host bytes equal
  the step written with the policy, compiled for 8 H100s; FLOPs from the traced matmuls (a
  compile-only GPU program has no cost analysis)."""
  make, args = offload_step, offload_args()
  p = donate.memory_profile(make(None), *args)
  assert p.platform == "gpu"
  offload = [a for a in p.advice(["pinned_host"])]
  assert len(offload) == 2 and all("openxla/xla#46231" in a.change for a in offload)
  policies = {
      "offload_dot": CPS.offload_dot_with_no_batch_dims("device", "pinned_host"),
      "save_and_offload": CPS.save_and_offload_only_these_names(
          names_which_can_be_saved=(), names_which_can_be_offloaded=["proj"],
          offload_src="device", offload_dst="pinned_host"),
  }
  for a in offload:
    [policy] = [v for k, v in policies.items() if k in a.how]
    written = make(policy)
    stats = written.lower(*args).compile().memory_analysis()
    assert a.peak_bytes == donate.memory_profile(written, *args).peak_bytes, a
    assert a.host_bytes == stats.host_temp_size_in_bytes > 0, a
    assert a.flops_ratio is not None and a.same_values is None


# -- flax nnx ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_flax_nnx_model_with_nnx_remat_measured_as_written():
  nnx = pytest.importorskip("flax.nnx")

  def make(policy):
    class MLP(nnx.Module):
      def __init__(self, rngs):
        self.layers = nnx.List([nnx.Linear(128, 128, rngs=rngs) for _ in range(3)])

      def __call__(self, x):
        for layer in self.layers:
          x = nnx.remat(lambda l, h: jax.nn.gelu(l(h)), policy=policy)(layer, x)
        return x
    graphdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)

    def step(params, x):
      grads = jax.grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(x) ** 2))(params)
      return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)
    return jax.jit(step), params

  step, params = make(None)
  x = jnp.linspace(0, 1, 256 * 128).reshape(256, 128)
  p = donate.memory_profile(step, params, x)
  items = p.advice(["checkpoint policy"])
  assert len(items) == 3
  for a in items:
    written, _ = make(_policy_of(a.how))
    assert a.peak_bytes == donate.memory_profile(written, params, x).peak_bytes, a
    assert a.same_values == "bitwise", a


# -- the cost a user waits for: announced, counted, compiled two at a time ---------------------


def _fit_in_threads(p, budget, **kw):
  """`p.fit(budget, **kw)` and the names of the threads its compiles ran in (JAX's own
  compile event, in the compiling thread)."""
  threads = set()

  def listen(event, *_, **__):
    if "backend_compile" in event:
      threads.add(threading.current_thread().name)
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    return p.fit(budget, **kw), threads
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


@pytest.mark.slow
def test_concurrent_and_sequential_rounds_give_the_same_plan(capsys):
  """A round's candidates compile two at a time in worker threads; the plan, each step's
  figures and every candidate's peak are those of the rounds compiled one at a time."""
  args = _scan_args()
  plans, measured = [], []
  for workers in (1, 2):
    p = donate.memory_profile(jax.jit(_scan_step()), *args)
    plan, threads = _fit_in_threads(p, p.peak_bytes * 6 // 10, max_workers=workers,
                                    progress=False)
    assert any(t.startswith("donate-measure") for t in threads) == (workers == 2), threads
    plans.append(plan)
    measured.append([(a.how, a.peak_bytes, a.flops_ratio) for a in p.advice(progress=False)])
  assert capsys.readouterr().err == ""  # progress=False: nothing printed
  sequential, concurrent = plans
  assert concurrent.steps == sequential.steps and len(concurrent.steps) >= 1
  assert (concurrent.fits, concurrent.peak_bytes, concurrent.compiles) == (
      sequential.fits, sequential.peak_bytes, sequential.compiles)
  assert measured[0] == measured[1]


@pytest.mark.slow
def test_the_compiles_are_announced_first_and_counted_by_a_bar(capsys):
  """One line on stderr says how many compiles a round makes, where, before any is made; the
  bar counts them when asked (off by default where stderr is not a terminal, as here); nothing
  measured again is announced again."""
  args = _scan_args()
  p = donate.memory_profile(jax.jit(_scan_step()), *args)
  n = len(advice.changes(p))
  capsys.readouterr()
  p.fit(p.peak_bytes * 6 // 10, progress=True, max_workers=2)
  err = capsys.readouterr().err
  assert err.splitlines()[0] == (
      f"fit: round 1: measuring the program and {n} candidates ({n + 1} compiles, 2 at a time) "
      "on 1 CPU device"), err
  assert re.search(rf"fit: round 1: +\d+%\|.*\| {n + 1}/{n + 1} ", err), err  # the bar
  p.fit(p.peak_bytes * 6 // 10)
  assert capsys.readouterr().err == ""  # measured already: no compile, nothing said
  q = donate.memory_profile(jax.jit(_scan_step()), *args)
  items = q.advice(["checkpoint"])  # not a terminal: the line, no bar
  err = capsys.readouterr().err
  assert err == (f"advice: measuring the program and {len(items)} candidates "
                 f"({len(items) + 1} compiles) on 1 CPU device\n"), err
  found = q.largest_batch(q.peak_bytes * 2, progress=True)
  err = capsys.readouterr().err
  assert err.startswith("largest_batch: searching axis 0 of argument 1 from 256, one compile "
                        "per size: doubling while it fits, then bisecting, on 1 CPU device\n"), err
  assert f"{found.compiles}compile" in err.replace(" ", ""), err


# -- a Llama-shaped step on 8 compile-only H100s ------------------------------------------------


def _llama_step(policy=None, heads=8, kv_heads=2):
  """Llama's layer (RMSNorm, grouped-query causal attention, SwiGLU) scanned over stacked
  layers, a momentum update; `policy` checkpoints the scan body as a user writes it."""
  def rms(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * w

  def layer(h, p):
    b, s, d = h.shape
    x = rms(h, p["n1"])
    q = (x @ p["wq"]).reshape(b, s, heads, -1)
    k, v = ((x @ p[w]).reshape(b, s, kv_heads, -1).repeat(heads // kv_heads, 2)
            for w in ("wk", "wv"))
    mask = jnp.tril(jnp.ones((s, s), bool))
    att = jax.nn.softmax(jnp.where(mask, jnp.einsum("bqhd,bkhd->bhqk", q, k), -1e9), -1)
    h = h + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d) @ p["wo"]
    x = rms(h, p["n2"])
    return h + (jax.nn.silu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"], None

  if policy is not None:
    layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)

  def loss(params, tokens):
    h, _ = jax.lax.scan(layer, params["embed"][tokens], params["layers"])
    logits = h @ params["embed"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

  def step(params, momentum, tokens):
    grads = jax.grad(loss)(params, tokens)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
    return jax.tree.map(lambda p, m: p - 1e-3 * m, params, momentum), momentum
  return step


def _llama_args(mesh, layers=2, d=256, heads=8, kv_heads=2, ff=768, vocab=2048, batch=8,
                seq=256):
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  def sds(shape, spec):
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
  col, row, rep = P(None, None, "tp"), P(None, "tp", None), P()
  kv = d // heads * kv_heads
  params = {"embed": sds((vocab, d), P("tp", None)), "layers": {
      "wq": sds((layers, d, d), col), "wk": sds((layers, d, kv), col),
      "wv": sds((layers, d, kv), col), "wo": sds((layers, d, d), row),
      "w1": sds((layers, d, ff), col), "w3": sds((layers, d, ff), col),
      "w2": sds((layers, ff, d), row), "n1": sds((layers, d), rep), "n2": sds((layers, d), rep)}}
  tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, rep))
  return params, params, tokens


@pytest.mark.slow
@pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")
def test_a_llama_shaped_step_on_8_h100s_fits_after_its_plan():
  """A Llama-shaped step (2 scanned layers, small dims) tensor parallel over 8 compile-only
  H100s, given a fraction of the card it does not fit: the plan makes it fit, and its final peak
  is the step written with every change of the plan, compiled here."""
  mesh = targets.gpu_mesh("h100", 8, ("tp",))
  args = _llama_args(mesh)
  p = donate.memory_profile(jax.jit(_llama_step(), donate_argnums=(0, 1)), *args)
  card = targets.gpu_spec("h100").device_memory_bytes
  fraction = p.needed_bytes * 0.7 / card
  assert not p.fits("h100", fraction=fraction)
  plan = p.fit("h100", fraction=fraction, candidates=["checkpoint"])
  assert plan and plan.fits and plan.needed_bytes <= plan.limit.usable_bytes
  assert "H100" in str(plan) and "it fits after" in str(plan)
  options, policy = _as_written(plan)
  assert policy is not None  # a checkpointed layer scan
  lowered = jax.jit(_llama_step(policy), donate_argnums=(0, 1)).lower(*args)
  direct = profile_of_lowered(lowered, options or None)  # XLA's dump of an H100 compile
  assert plan.peak_bytes == direct.peak_bytes
  assert direct.fits("h100", fraction=fraction)
