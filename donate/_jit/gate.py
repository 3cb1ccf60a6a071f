"""The gate between `jax.jit` and donate: the user's function traces only when donate plans it.

`donate.jit` hands `jax.jit` a `Gated` stand-in for the user's function. Its traces run only while
a donate slow path holds its `Gate` open; any other trace (a signature donate has not planned, a
cache eviction, a config change) raises `Replan` before the user's code runs, and the call falls
back to donate's slow path. One `Gated` per user function, held weakly, lets every `donate.jit`
of that function share `jax.jit`'s global caches. (A `donate.jit` that donates no argument traces
the function itself, as `jax.jit(fun)`; its `Gated` keys its dispatch and counts its traces.)
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from donate._base import compat as _compat


class Replan(Exception):
  """Raised inside a gated trace when the call must take the slow path (never escapes)."""


class Gate:
  """A per-function, per-thread switch: traces of the wrapped function run only while it is open."""

  def __init__(self):
    self._local = threading.local()

  @property
  def is_open(self) -> bool:
    return getattr(self._local, "depth", 0) > 0

  def __enter__(self):
    self._local.depth = getattr(self._local, "depth", 0) + 1

  def __exit__(self, *exc):
    self._local.depth -= 1


class Gated:
  """The user's function as `jax.jit` sees it: it traces only while a slow path opens its gate.

  One per user function, holding the function weakly (like `jax.jit`'s own caches), so every
  `donate.jit` of the same function shares `jax.jit`'s global trace, lowering and compile caches:
  `donate.jit(f)(x)` written inline in a loop compiles once, as `jax.jit(f)(x)` does.
  `__wrapped__` leads `inspect.signature` and JAX's source information to the user's function.
  """

  def __init__(self, fun):
    try:
      self._ref = weakref.ref(fun)
      self.strong = False
    except TypeError:  # cannot be referenced weakly: held, and run as jax.jit runs it
      self._ref = lambda: fun
      self.strong = True
    self.gate = Gate()
    self.trace_count = 0  # how many times the user function was traced (for tests)
    self._traced: weakref.WeakSet = weakref.WeakSet()  # jaxprs `count_trace` has seen
    self._stand_ins: dict[str, StandIn] = {}
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
      if hasattr(fun, name):
        setattr(self, name, getattr(fun, name))

  @property
  def __wrapped__(self):
    return self._ref()

  def __repr__(self) -> str:
    return repr(self._ref())

  def __call__(self, *args, **kwargs):
    if not self.gate.is_open:
      raise Replan()
    self.trace_count += 1
    return self._ref()(*args, **kwargs)

  def count_trace(self, closed_jaxpr) -> None:
    """Counts a trace of the function itself (`jax.jit(fun)`, not this stand-in): a jaxpr not
    seen before (JAX's trace cache gives the same object again)."""
    with _GATED_LOCK:
      if closed_jaxpr not in self._traced:
        self._traced.add(closed_jaxpr)
        self.trace_count += 1

  def stand_in(self, options_key: str) -> StandIn:
    """The function donate's dispatch of this function is keyed by, for options `options_key`."""
    with _GATED_LOCK:
      return self._stand_ins.setdefault(options_key, StandIn(self._ref))


class StandIn:
  """What donate's C++ dispatch is keyed by in JAX's dispatch caches: one per user function and
  donate's own options (`Gated.stand_in`), so every `donate.jit` of them shares the entries, as
  every `jax.jit` of a function shares `jax.jit`'s, and no `jax.jit` does. The dispatch calls it
  under `jax.disable_jit()`: it is the user's function then."""

  __slots__ = ("_ref", "consumes", "wrappers", "__weakref__")

  def __init__(self, ref):
    self._ref = ref
    self.consumes = False  # a program run through these entries consumes a buffer
    self.wrappers: weakref.WeakSet = weakref.WeakSet()  # the donate.jit functions sharing them

  def __call__(self, *args, **kwargs):
    return self._ref()(*args, **kwargs)


_GATED: weakref.WeakKeyDictionary[Any, Gated] = weakref.WeakKeyDictionary()
_GATED_LOCK = threading.Lock()


def gated_for(fun) -> Gated:
  with _GATED_LOCK:
    try:
      gated = _GATED.get(fun)
    except TypeError:  # not hashable or not weakly referenceable: one of its own
      return Gated(fun)
    if gated is None:
      gated = Gated(fun)
      try:
        _GATED[fun] = gated
      except TypeError:
        pass
    return gated


class Plans:
  """A `JitWrapped`'s plans as JAX's cache registry sees them: `jax.clear_caches()` forgets them."""

  def __init__(self, wrapped, name: str):
    self._ref = weakref.ref(wrapped)
    _compat.register_cache(self, f"donate.jit plans of {name}")

  def cache_clear(self):
    wrapped = self._ref()
    if wrapped is not None:
      wrapped._forget()

  def cache_info(self):
    wrapped = self._ref()
    return len(wrapped._prepared) if wrapped is not None else 0

  def cache_keys(self):
    wrapped = self._ref()
    return list(wrapped._prepared) if wrapped is not None else []
