"""How a call of a `donate.jit` function runs.

A call is a call of JAX's C++ dispatch itself (`dispatch_for`), as a call of a `jax.jit`
function is: `JitWrapped.__call__` is a property that returns the function's `_call`, the
dispatch, so no Python frame of donate's stands between the call and the dispatch (JAX records
the Python stack of each call it runs: one more frame costs a cached call more than the dispatch
itself does). Once a program that consumes a buffer is planned for the function, or for any
`donate.jit` sharing its dispatch's entries (`gate.StandIn`), its `_call` becomes `checked`: the
dispatch in a frame that names both leaves of an array passed twice, one of them donated, which
JAX rejects inside the dispatch with words that name neither.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable

import jax

from donate._base import compat as _compat
from donate._jit import binding as _binding
from donate._jit import program as _program

_LOCK = threading.Lock()  # a dispatch's `consumes` and the functions sharing it


def follow(wrapped, asks: bool) -> None:
  """Sets up a new function's calls: checked from the start if it donates through `jax.jit`'s
  own dispatch (`asks`, a function not weakly referenceable) or shares its dispatch's entries
  with a function that consumes; else checked once it consumes (`consumes`)."""
  stand_in = wrapped._stand_in
  if stand_in is None:
    if asks:
      checks(wrapped)
    return
  with _LOCK:
    stand_in.wrappers.add(wrapped)
    consuming = stand_in.consumes
  if consuming:
    checks(wrapped)


def consumes(wrapped) -> None:
  """A program of `wrapped` consumes a buffer: every call of a function sharing its dispatch's
  entries is checked from now on."""
  stand_in = wrapped._stand_in
  with _LOCK:
    stand_in.consumes = True
    sharing = list(stand_in.wrappers)
  for other in sharing:
    checks(other)


def checks(wrapped) -> None:
  """From now on a call of `wrapped` is `checked`."""
  if wrapped._call is wrapped._dispatch:
    wrapped._call = checked(wrapped)


def checked(wrapped) -> Callable:
  """The call of a function that consumes buffers: its dispatch, and after an error
  `_failed`. Holds the function weakly (no cycle)."""
  dispatch, ref = wrapped._dispatch, weakref.ref(wrapped)

  def call(*args, **kwargs):
    try:
      return dispatch(*args, **kwargs)
    except BaseException as e:
      _failed(ref(), e, args, kwargs)
      raise

  return call


def _failed(wrapped, e: BaseException, args, kwargs) -> None:
  """After a checked call raised `e`: names both leaves of one array passed in two places (JAX
  rejects it when one is donated), and, as `jax.jit`'s filtered tracebacks start at the user's
  call, takes `checked`'s frame off `e`'s traceback, or marks it hidden where JAX marks its
  own (JAX filtered the rest: `dispatch_for`)."""
  if (
    wrapped is not None
    and isinstance(e, (jax.errors.JaxRuntimeError, ValueError))
    and _compat.trace_state_clean()
    and _binding.repeats_an_array(wrapped._fn.binding, args, kwargs)
  ):
    with contextlib.suppress(_program.Unplanned):  # (hijax types: JAX's own error stands)
      signature, call = wrapped._prepare(args, kwargs)
      signature.prepared.check_duplicates(call)
  tb, mode = e.__traceback__, _compat.traceback_filtering_mode()
  if tb is not None and mode == "tracebackhide":  # kept, and marked hidden as JAX marks its own
    tb.tb_frame.f_locals["__tracebackhide__"] = True
  elif tb is not None and mode != "off":
    e.__traceback__ = tb.tb_next


def dispatch_for(wrapped, jitted) -> tuple:
  """`(dispatch, stand-in)`: the C++ dispatch of a `donate.jit` function and the `gate.StandIn`
  it is keyed by. The dispatch is keyed as `jax.jit`'s own: every call whose
  arguments and JAX configuration match an entry runs that entry's program, with no Python; any
  other call plans first (the miss, holding a weak reference: no cycle). Its
  entries are shared by every `donate.jit` of the same function and options (`Gated.stand_in`),
  as `jax.jit`'s are: `donate.jit(f)(x)` written inline in a loop runs from C++."""
  ref = weakref.ref(wrapped)

  def miss(*args, **kwargs):
    self = ref()  # the dispatch dies with its function
    clean = _compat.trace_state_clean()
    try:  # the miss and `_missed` stand where jax.jit's boundary and its miss stand
      return _missed(self, args, kwargs)
    except BaseException as e:
      if clean:  # a top-level miss raised: its entry would fall back to Python for good
        _compat.clear_cpp_cache(self._dispatch)
      if isinstance(e, Exception):  # JAX's traceback boundary, as around jax.jit's own miss
        _compat.filter_at_boundary(e)
      raise

  miss.__name__ = miss.__qualname__ = wrapped._fn.name
  o = wrapped._fn.options
  own = ("keep_unused", "inline", "static_argnums", "static_argnames")
  ours = (
    o.strict_unusable,
    o.strict_copies,
    o.adopt_inner,
    o.copy_threshold,
    o.symmetric_placement,
  )
  key = repr((*ours, *(o.jit_kwargs.get(k) for k in own)))
  stand_in = wrapped._gated.stand_in(key)
  return _compat.dispatch_like(jitted, stand_in, miss), stand_in


def _missed(self, args, kwargs):
  """The dispatch's miss: answered without tracing, or traced in this frame (as jax.jit's miss
  traces in its own: see `_compat.traced_of`), planned and run."""
  answered = self._answered(args, kwargs)
  if answered is not None:
    return answered
  jitted = self._fn.jitted
  with self._fn.gate:
    params, flat = _compat.infer_params(*_compat.trace_target(jitted), args, kwargs)
  return self._run_traced(_compat.traced_of(jitted, params, flat), args, kwargs)
