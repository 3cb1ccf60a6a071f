"""For `python -m donate.profile --advice`: the jitted functions a script calls and the shapes it
calls them with, so that each program the run profiled can be compiled again with a remedy.

XLA's dump of a run has the programs, not the functions that made them; to measure a remedy
(donating an argument, a compiler option) the profile needs the traced function. `install()`
makes `jax.jit` (as the script, flax's `nnx.jit` and equinox's `filter_jit` call it) return the
same jitted function behind a thin wrapper that notes the abstract arguments (shapes, dtypes,
shardings) of the first calls; after the run, `profile_like(p)` profiles the noted call whose
program peaks as `p` does, with `donate.memory_profile`, which keeps the program for `advice()`.
Without `--advice` nothing is installed.
"""

from __future__ import annotations

import functools

_MOST = 4  # calls noted per jitted function
_noted: list[tuple[object, tuple, dict]] = []  # (jitted, abstract args, abstract kwargs)


class _Traced(Exception):
  """A call made while tracing an outer function (its arguments are tracers): not noted."""


def _abstract(x):
  import jax

  if isinstance(x, jax.core.Tracer):
    raise _Traced
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)
  return x


class _Noted:
  """A jitted function that notes its first calls' abstract arguments."""

  def __init__(self, jitted):
    self._jitted, self._calls = jitted, 0
    functools.update_wrapper(self, jitted)

  def __call__(self, *args, **kwargs):
    if self._calls < _MOST:
      import jax

      try:
        spec = jax.tree.map(_abstract, (args, kwargs))
      except _Traced:
        spec = None
      if spec is not None:
        self._calls += 1
        _noted.append((self._jitted, *spec))
    return self._jitted(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._jitted, name)

  def __get__(self, obj, objtype=None):
    return self if obj is None else functools.partial(self, obj)


def install() -> None:
  """Makes `jax.jit` note the calls of what it returns (see the module docstring)."""
  import jax

  real = jax.jit

  @functools.wraps(real)
  def jit(fun=None, *args, **kwargs):
    if fun is None:
      return lambda f: jit(f, *args, **kwargs)
    return _Noted(real(fun, *args, **kwargs))

  jax.jit = jit


def profile_like(p):
  """The profile, with its program for `advice()`, of a noted call whose function has `p`'s name
  and whose program peaks as `p` does; None when no noted call does (one compile per candidate
  with that name, each read once)."""
  from donate._profile.api import memory_profile

  for jitted, args, kwargs in _noted:
    name = getattr(jitted, "__name__", None)
    if name != p.function:
      continue
    try:
      found = memory_profile(jitted, *args, **kwargs)
    except Exception:  # noqa: BLE001 - a call the script made that no longer traces alone
      continue
    if found.peak_bytes == p.peak_bytes:
      return found
  return None
