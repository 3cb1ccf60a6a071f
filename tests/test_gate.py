"""Unit tests of donate._jit.gate: the stand-in jax.jit traces, which runs only while the gate is open."""

import gc
import threading

import jax
import jax.numpy as jnp
import pytest

from donate._jit import gate as _gate


def test_a_closed_gate_raises_replan_and_an_open_one_traces():
  def f(x):
    return x + 1
  gated = _gate.gated_for(f)
  jitted = jax.jit(gated)
  with pytest.raises(_gate.Replan):
    jitted(jnp.ones(2))
  with gated.gate:
    assert jitted(jnp.ones(2)).tolist() == [2.0, 2.0]
  assert gated.trace_count == 1
  assert jitted(jnp.ones(2)).tolist() == [2.0, 2.0]  # cached: no trace, the gate is not asked


def test_the_gate_is_per_thread_and_nests():
  gate, seen = _gate.Gate(), []
  with gate:
    with gate:
      pass
    assert gate.is_open
    thread = threading.Thread(target=lambda: seen.append(gate.is_open))
    thread.start()
    thread.join()
  assert seen == [False] and not gate.is_open


def test_one_stand_in_per_function_held_weakly():
  def f(x):
    return x
  assert _gate.gated_for(f) is _gate.gated_for(f)
  assert _gate.gated_for(f).__wrapped__ is f and _gate.gated_for(f).__name__ == "f"
  ref = _gate.gated_for(f)._ref
  del f
  gc.collect()
  assert ref() is None


def test_functions_that_cannot_be_weakly_referenced_are_held():
  class Unhashable:
    __hash__ = None
    def __call__(self, x):
      return x
  gated = _gate.gated_for(Unhashable())
  assert gated.strong is False  # weakly referenceable though unhashable: its own stand-in
  class Slotted:
    __slots__ = ()
    def __call__(self, x):
      return x
  slotted = _gate.gated_for(Slotted())
  assert slotted.strong is True and slotted.gate.is_open is False
