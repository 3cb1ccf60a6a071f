"""Reliability of `donate.jit` (issue 7): nothing lost under faults, no leaks, no recompiles.

Every fault test follows one pattern: make arguments, provoke the fault, check that every argument
is alive and holds its old value, then call again and check the function still works (and
donates). The leak test runs a donated training step 5,000 times and measures live arrays,
traces, compiles and the process's resident memory.
"""

import collections
import gc
import os
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate


def on_device(value, dtype=jnp.float32):
  """A device-owned array (a CPU array made from numpy may share host memory, and not donate)."""
  return jax.jit(lambda a: a * 1)(jnp.asarray(value, dtype))


def snapshot(tree):
  return [np.asarray(x).copy() for x in jax.tree.leaves(tree)]


def assert_alive_and_unchanged(tree, before):
  leaves = jax.tree.leaves(tree)
  assert len(leaves) == len(before)
  for x, old in zip(leaves, before):
    assert not x.is_deleted()
    np.testing.assert_array_equal(np.asarray(x), old)


def assert_step_works(g, args, expect):
  """Calls `g(*args)`, compares with `expect` and checks argument 0 (donated) was consumed."""
  out = g(*args)
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expect)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
  assert all(x.is_deleted() for x in jax.tree.leaves(args[0]))


# ---- compile-event counting (public jax.monitoring) --------------------------------------------

_EVENTS = collections.Counter()
_EVENTS_LOCK = threading.Lock()
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
JAXPR_TRACE = "/jax/core/compile/jaxpr_trace_duration"


def _count_event(name, *_, **__):
  with _EVENTS_LOCK:
    _EVENTS[name] += 1


jax.monitoring.register_event_duration_secs_listener(_count_event)


def events(name):
  with _EVENTS_LOCK:
    return _EVENTS[name]


# ---- nothing lost under faults ----------------------------------------------------------------

def make_args(scale=1.0):
  params = {"w": on_device(np.arange(8.0) * scale), "b": on_device(np.full(8, 2.0))}
  return params, on_device(np.linspace(0.0, 1.0, 8))


def good_step(params, x):
  return jax.tree.map(lambda p: p * 0.5 + x, params), jnp.sum(params["w"] * x)


def expected(params, x):
  return jax.jit(good_step)(*jax.tree.map(lambda a: a.copy(), (params, x)))


class Flaky:
  """A step function that fails the first `n` times it is traced, with `exc`."""

  def __init__(self, exc, n=1):
    self.exc, self.n, self.calls = exc, n, 0

  def __call__(self, params, x):
    self.calls += 1
    if self.calls <= self.n:
      raise self.exc
    return good_step(params, x)


@pytest.mark.parametrize("exc", [RuntimeError("boom in tracing"), KeyboardInterrupt(),
                                 TypeError("bad shapes")], ids=["RuntimeError",
                                                                "KeyboardInterrupt", "TypeError"])
def test_an_exception_while_tracing_loses_nothing_and_the_next_call_works(exc):
  fun = Flaky(exc)
  g = donate.jit(fun, donate_argnums=0)
  params, x = make_args()
  before = snapshot((params, x))
  with pytest.raises(type(exc)):
    g(params, x)
  assert_alive_and_unchanged((params, x), before)
  assert_step_works(g, (params, x), expected(*make_args()))
  assert fun.calls == 2 and g.trace_count == 2  # the failed trace was not cached


def test_keyboard_interrupt_while_tracing_a_new_signature_keeps_the_cached_one():
  fun = Flaky(KeyboardInterrupt(), n=0)
  g = donate.jit(fun, donate_argnums=0)
  params, x = make_args()
  params, _ = g(params, x)  # cached for float32[8]
  fun.n = fun.calls + 1  # the next trace raises
  wide = {"w": on_device(np.ones(16)), "b": on_device(np.ones(16))}, on_device(np.ones(16))
  before = snapshot(wide)
  with pytest.raises(KeyboardInterrupt):
    g(*wide)  # same tree structure: the fast path falls through to a new trace, which fails
  assert_alive_and_unchanged(wide, before)
  expect = expected(params, x)
  assert_step_works(g, (params, x), expect)  # the cached signature is untouched
  b, w, x16 = before  # leaves in tree order: params["b"], params["w"], x
  assert_step_works(g, wide, expected({"w": on_device(w), "b": on_device(b)}, on_device(x16)))


def test_a_compile_failure_from_compiler_options_loses_nothing():
  g = donate.jit(good_step, donate_argnums=0, compiler_options={"xla_no_such_option": True})
  params, x = make_args()
  before = snapshot((params, x))
  for _ in range(2):  # the failure is not cached as a half-made entry that would run
    with pytest.raises(jax.errors.JaxRuntimeError, match="xla_no_such_option"):
      g(params, x)
    assert_alive_and_unchanged((params, x), before)
  with pytest.raises(jax.errors.JaxRuntimeError, match="xla_no_such_option"):
    g.plan(params, x)
  assert_alive_and_unchanged((params, x), before)
  fixed = donate.jit(good_step, donate_argnums=0, compiler_options={})
  assert_step_works(fixed, (params, x), expected(*make_args()))


def test_a_compile_failure_then_the_same_function_works_for_another_program():
  def step(params, x, bad):
    if bad:  # a custom call XLA cannot resolve: fails when compiling, before anything runs
      call = jax.ffi.ffi_call("donate_test_no_such_target", jax.ShapeDtypeStruct((8,), jnp.float32))
      return jax.tree.map(lambda p: call(p), params), jnp.sum(x)
    return good_step(params, x)

  g = donate.jit(step, donate_argnums=0, static_argnums=2)
  params, x = make_args()
  before = snapshot((params, x))
  lowered = g.lower(params, x, True)  # lowering compiles nothing, as in jax.jit
  with pytest.raises(jax.errors.JaxRuntimeError, match="donate_test_no_such_target"):
    lowered.compile()  # a compile failure
  with pytest.raises(jax.errors.JaxRuntimeError, match="donate_test_no_such_target"):
    g(params, x, True)
  assert_alive_and_unchanged((params, x), before)
  assert_step_works(g, (params, x, False), expected(*make_args()))


def test_a_shape_error_found_by_the_plan_loses_nothing():
  def step(params, x):
    w = donate.alias(params["w"], x[:4])  # float32[8] into float32[4]: rejected
    return w, x

  g = donate.jit(step, donate_argnums=0)
  params, x = make_args()
  before = snapshot((params, x))
  with pytest.raises(donate.DonationError, match=r"alias\(src, dst\) needs src and dst of one "
                     r"shape and dtype.*float32\[8\].*float32\[4\]"):
    g(params, x)
  assert_alive_and_unchanged((params, x), before)
  with pytest.raises(donate.DonationError, match="one shape and dtype"):
    g.plan(params, x)
  assert_alive_and_unchanged((params, x), before)
  fixed = donate.jit(good_step, donate_argnums=0)
  assert_step_works(fixed, (params, x), expected(*make_args()))


def test_a_misuse_found_by_the_planner_loses_nothing():
  def step(params, x):
    w = donate.alias(params["w"], params["w"] + x)
    return w, w * 2.0, params["b"]  # one aliased source flowing into two outputs

  g = donate.jit(step, donate_argnums=0)
  params, x = make_args()
  before = snapshot((params, x))
  with pytest.raises(donate.DonationError, match=r"alias of one source into two outputs at "
                     r"params\['w'\]"):
    g(params, x)
  assert_alive_and_unchanged((params, x), before)


def test_a_strict_mode_failure_loses_nothing_and_the_next_call_works():
  def step(params, x, reuse_x):
    new = jax.tree.map(lambda p: p * 0.5 + x, params)
    return new, (x * 2.0 if reuse_x else jnp.sum(x))

  # x is donated too; without an output of its shape nothing can reuse it: strict mode raises.
  g = donate.jit(step, donate_argnums=(0, 1), static_argnums=2, strict=True)
  params, x = make_args()
  before = snapshot((params, x))
  for _ in range(2):
    with pytest.raises(donate.DonationError, match=r"step: 1 donated buffer\(s\) cannot be "
                       r"used and stay alive:\n  x: float32\[8\]"):
      g(params, x, False)
    assert_alive_and_unchanged((params, x), before)
  new, doubled = g(params, x, True)
  assert params["w"].is_deleted() and x.is_deleted()
  np.testing.assert_allclose(np.asarray(doubled), before[2] * 2.0)
  np.testing.assert_allclose(np.asarray(new["w"]), before[1] * 0.5 + before[2])


def test_a_duplicate_argument_loses_nothing_on_the_slow_and_the_fast_path():
  g = donate.jit(good_step, donate_argnums=0)
  params, x = make_args()
  for warm in (False, True):
    if warm:
      g(*make_args())
    dup = {"w": x, "b": params["b"]}
    before = snapshot((dup, x))
    with pytest.raises(donate.DonationError, match=r"once as params\['w'\] and once as x"):
      g(dup, x)
    assert_alive_and_unchanged((dup, x), before)
  assert_step_works(g, (params, x), expected(*make_args()))


def test_a_user_error_in_a_new_signature_keeps_the_fast_path_for_the_old_one():
  def step(params, x):
    if params["w"].shape != x.shape:
      raise ValueError("shapes differ")
    return good_step(params, x)

  g = donate.jit(step, donate_argnums=0)
  params, x = g(*make_args())[0], make_args()[1]
  bad = {"w": on_device(np.ones(4)), "b": on_device(np.ones(4))}
  before = snapshot((bad, x))
  with pytest.raises(ValueError, match="shapes differ"):
    g(bad, x)
  assert_alive_and_unchanged((bad, x), before)
  traced = g.trace_count
  assert_step_works(g, (params, x), expected(params, x))
  assert g.trace_count == traced


def test_an_input_read_only_by_dead_code_works():
  """Regression: the replayed program once kept dead code reading a pruned input (KeyError)."""
  def step(params, x):
    unused = x * 2.0  # computed, never returned: x is not an input of the computation
    del unused
    return jax.tree.map(lambda p: p * 0.5, params)

  g = donate.jit(step, donate_argnums=0)
  params, x = make_args()
  out = g(params, x)
  np.testing.assert_allclose(np.asarray(out["b"]), np.ones(8))


def test_donate_buffer_of_an_otherwise_unused_input_leaves_it_alive_and_says_so():
  def step(w, scratch):
    donate.donate_buffer(scratch)  # nothing reads scratch: jax.jit would not take it either
    return w + 1.0

  g = donate.jit(step)
  w, scratch = on_device(np.zeros(8)), on_device(np.zeros(8))
  np.testing.assert_array_equal(np.asarray(g(w, scratch)), np.ones(8))
  assert not scratch.is_deleted() and not w.is_deleted()
  d = g.plan(w, scratch).decisions[1]
  assert (d.action, d.consumed) == ("unused", False) and "keep_unused=True" in d.reason


def test_a_donor_xla_does_not_reuse_is_not_reported_as_consumed():
  g = donate.jit(lambda x: x.astype(jnp.bfloat16), donate_argnums=0)
  x = on_device(np.ones(4))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    decision = g.plan(x).decisions[0]
    g(x)
  assert decision.consumed == x.is_deleted(), decision


# ---- no leaks, no recompiles ------------------------------------------------------------------

def rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mlp_params(key):
  k1, k2 = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (16, 32)) * 0.1, "b1": jnp.zeros(32),
          "w2": jax.random.normal(k2, (32, 4)) * 0.1, "b2": jnp.zeros(4)}


def mlp_loss(params, x, y):
  h = jnp.tanh(x @ params["w1"] + params["b1"])
  return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def train_step(params, x, y):
  loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
  return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def test_five_thousand_donated_steps_leak_nothing_and_compile_once():
  step = donate.jit(train_step, donate_argnums=0)
  x = jax.random.normal(jax.random.key(1), (64, 16))
  y = jnp.sin(x[:, :4])
  params = mlp_params(jax.random.key(0))
  pointers = {k: v.unsafe_buffer_pointer() for k, v in params.items()}
  compiles0 = events(BACKEND_COMPILE)
  for _ in range(100):  # warm up: the one trace and compile, allocator pools, caches
    params, loss = step(params, x, y)
  first_loss = float(loss)
  del loss
  compiles_warm = events(BACKEND_COMPILE) - compiles0
  gc.collect()
  live, rss = len(jax.live_arrays()), rss_bytes()
  traces = events(JAXPR_TRACE)
  samples = []
  for i in range(4900):
    old = params
    params, loss = step(params, x, y)
    if i % 700 == 0:
      assert all(p.is_deleted() for p in old.values())
      del old
      samples.append(len(jax.live_arrays()))
  del old, loss
  gc.collect()
  growth = rss_bytes() - rss
  assert len(jax.live_arrays()) == live, samples
  assert set(samples) == {live + 1}, samples  # plus `loss`
  assert step.trace_count == 1
  assert compiles_warm <= 2  # plan compile ahead of time + the inner jit's own (same program)
  assert events(BACKEND_COMPILE) - compiles0 == compiles_warm  # none in 4,900 steps
  assert events(JAXPR_TRACE) == traces  # not even a re-trace of the replayed jaxpr
  assert growth < 50 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB"
  assert {k: v.unsafe_buffer_pointer() for k, v in params.items()} == pointers
  assert float(mlp_loss(params, x, y)) < first_loss


def test_alternating_signatures_compile_and_trace_each_once():
  """Regression: two signatures of one tree structure once evicted each other from the fast path."""
  f = donate.jit(lambda p, x: (p * 0.5 + x, jnp.sum(p)), donate_argnums=0)
  ps = {n: on_device(np.ones(n)) for n in (8, 16)}
  xs = {n: on_device(np.ones(n)) for n in (8, 16)}
  for _ in range(2):
    for n in (8, 16):
      ps[n], _ = f(ps[n], xs[n])
  compiles, traces = events(BACKEND_COMPILE), events(JAXPR_TRACE)
  for _ in range(10):
    for n in (8, 16):
      ps[n], _ = f(ps[n], xs[n])
  assert f.trace_count == 2
  assert events(BACKEND_COMPILE) == compiles
  assert events(JAXPR_TRACE) == traces  # not even a re-trace of the replayed jaxpr
