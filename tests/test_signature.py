"""Unit tests of donate._jit.signature (one signature: plan, how it runs, lower, compile) and
donate._jit.compiled (the compiled program read back into the plan)."""

import jax
import jax.numpy as jnp
import pytest

from donate._base.errors import DonationRuntimeError
from donate._jit import binding as _binding
from donate._jit import gate as _gate
from donate._jit import options as _options
from donate._jit import program as _program
from donate._jit import signature as _signature
from donate._xla import hlo as _hlo


def function(fun, **kwargs):
  options = _options.Options(**kwargs)
  gated = _gate.gated_for(fun)
  argnums = dict(donate_argnums=options.donate_argnums, donate_argnames=options.donate_argnames)
  jitted = jax.jit(gated, **argnums, **options.jit_kwargs)
  return _signature.Function(fun, fun.__name__, jitted, gated.gate,
                             _binding.Binding(fun, jitted), options)


def prepare(fn, *args):
  with fn.gate:
    traced = fn.jitted.trace(*args)
  call = fn.binding.bind(args, {})
  return _signature.prepare(fn, call, traced), call


def swapped(a, b):
  return b.at[0].set(1.0), a + 1.0


def same_order(a, b):
  return a + 1.0, b * 2.0


N = 2**14  # 64 KiB of float32: a pair that matters (copy_threshold)


def test_jax_jits_own_pairing_runs_natively_and_a_better_one_realiases_its_lowering():
  native, _ = prepare(function(same_order, donate_argnums=(0, 1)), jnp.ones(N), jnp.ones(N))
  assert native.native and not native.realiased and native.donated == {0, 1}
  better, _ = prepare(function(swapped, donate_argnums=(0, 1)), jnp.ones(N), jnp.ones(N))
  assert better.realiased and better.inner is None
  assert better.plan.pairs() == {1: 0, 0: 1}


def test_a_better_pairing_of_small_buffers_runs_as_jax_jit_does():
  prep, _ = prepare(function(swapped, donate_argnums=(0, 1)), jnp.ones(4), jnp.ones(4))
  assert prep.native and not prep.realiased and prep.plan.pairs() == {0: 0, 1: 1}
  assert any("differs from jax.jit's only in buffers under copy_threshold" in n
             for n in prep.plan.notes)
  prep, _ = prepare(function(swapped, donate_argnums=(0, 1), copy_threshold=0), jnp.ones(4),
                    jnp.ones(4))
  assert prep.realiased and prep.plan.pairs() == {1: 0, 0: 1}


def test_small_placeholders_paired_otherwise_do_not_re_lay_out_a_step():
  """A state with a large leaf updated in order and two (1,) placeholders that dataflow pairs
  the other way round (as optax.adafactor's unfactored slots): jax.jit's own program runs."""
  def step(state):
    return {"big": state["big"] * 0.9, "p1": state["p2"] + 1.0, "p2": state["p1"] * 2.0}

  state = {"big": jnp.ones(N), "p1": jnp.ones(1), "p2": jnp.ones(1)}
  prep, _ = prepare(function(step, donate_argnums=0), state)
  assert prep.native and not prep.realiased
  assert prep.plan.pairs() == {0: 0, 1: 1, 2: 2}
  every_byte, _ = prepare(function(step, donate_argnums=0, copy_threshold=0), state)
  assert every_byte.realiased and every_byte.plan.pairs() == {0: 0, 1: 2, 2: 1}


def test_compile_reads_the_aliases_xla_made_into_the_plan():
  prep, call = prepare(function(swapped, donate_argnums=(0, 1)), jnp.ones(N), jnp.ones(N))
  program = _program.compile_program(prep, prep.lower(call), call)
  plan = program.plan
  assert [d.action for d in plan.decisions] == ["aliased", "aliased"]
  assert program.in_paths == ("a", "b") and program.prep is prep
  # The program keeps the user's results in order: parameter b aliases out[0], a out[1].
  assert _hlo.input_output_aliases(program.compiled.as_text()) == {1: (0,), 0: (1,)}
  assert [d.output for d in plan.decisions] == ["out[1]", "out[0]"]
  assert plan.memory.temp == 0
  # A value: compiling made a new plan, the prepared one is as it was planned.
  assert prep.plan is not plan and prep.plan.memory is None


def test_the_signature_cache_compiles_once_and_keeps_its_stages():
  prep, call = prepare(function(swapped, donate_argnums=(0, 1)), jnp.ones(N), jnp.ones(N))
  signature = _program.Signature(prep)
  assert signature.program is None and signature.lowered is None
  program = signature.compile(call, with_copies=False)
  assert program.plan.copies is None and signature.program is program
  detailed = signature.compile(call)  # the copies read now, the same executable
  assert detailed.compiled is program.compiled and detailed.plan.copies == ()
  assert signature.program is detailed and program.plan.copies is None
  other = signature.compile(call, compiler_options={"xla_cpu_enable_fast_math": False})
  assert other.compiled is not program.compiled and signature.program is detailed


def test_run_gives_the_users_output_order_and_consumes_the_donated_leaves():
  fn = function(swapped, donate_argnums=(0, 1))
  a, b = jnp.zeros(N), jnp.zeros(N)
  prep, call = prepare(fn, a, b)
  program = _program.compile_program(prep, prep.lower(call), call)
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  with fn.gate:
    x, y = program.run((a, b), {}, call.leaves)
  assert x[:2].tolist() == [1.0, 0.0] and y.tolist() == [1.0] * N
  assert (x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()) == (pb, pa)
  assert a.is_deleted() and b.is_deleted()


def test_the_same_array_twice_is_refused_before_anything_runs():
  fn = function(same_order, donate_argnums=0)
  a = jnp.ones(4)
  prep, call = prepare(fn, a, a)
  with pytest.raises(DonationRuntimeError, match="passed twice to same_order, once as a and once as b"):
    prep.check_duplicates(call)
  assert not a.is_deleted()


def test_planning_pauses_the_collector_and_leaves_it_as_it_found_it(monkeypatch):
  import gc

  import numpy as np

  import donate
  from donate._plan import pairing as _pairing
  seen = []
  make_plan = _pairing.make_plan

  def recording(*args, **kwargs):
    seen.append(gc.isenabled())
    return make_plan(*args, **kwargs)

  monkeypatch.setattr(_pairing, "make_plan", recording)
  assert gc.isenabled()
  donate.jit(lambda x: x * 2, donate_argnums=0).lower(jnp.ones(4)).plan  # (a plan made when read)
  assert seen and not any(seen) and gc.isenabled()
  with pytest.raises(donate.DonationError):  # strict: a host value in donate_argnums
    donate.jit(lambda x: x * 2, donate_argnums=0, strict=True)(np.ones(4))
  assert gc.isenabled()
  gc.disable()
  try:
    donate.jit(lambda x: x + 1, donate_argnums=0).lower(jnp.ones(4)).plan
    assert not gc.isenabled()
  finally:
    gc.enable()
