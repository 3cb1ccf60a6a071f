"""Every private JAX import the library needs, in one place.

Each item says why no public API serves. Everything else in the package uses public JAX only.
"""

from __future__ import annotations

# Source lines of equations: `jax.extend` exposes `source_info` on equations but no public way to
# turn it into "file:line (function)" text; JAX's own errors use `summarize`.
from jax._src import source_info_util as _source_info_util


import os

import jax

_HIDDEN = (os.path.dirname(jax.__file__), os.path.dirname(os.path.dirname(__file__)) + os.sep + "donate")


def source_line(source_info=None) -> str:
  """Returns "file:line (function)" of the user's frame in `source_info` (default: here and now).

  Frames inside JAX and inside this package are skipped, so the line is the user's own.
  """
  if source_info is None:
    source_info = _source_info_util.current()
  traceback = getattr(source_info, "traceback", None)
  frames = getattr(traceback, "frames", None) or ()
  for frame in frames:
    if not frame.file_name.startswith(_HIDDEN) or frame.file_name.endswith("examples.py"):
      return f"{frame.file_name}:{frame.line_num} ({frame.function_name})"
  return "<unknown>"


# Which inputs a computation really reads, exactly as `jax.jit` decides it when `keep_unused=False`
# (it prunes inputs with partial_eval's dead-code elimination; no public API exposes that pass).
from jax._src.interpreters import partial_eval as _pe


def used_inputs(jaxpr) -> list[bool]:
  """For each input of an open jaxpr, whether any output depends on it after dead-code elimination."""
  _, used = _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
  return list(used)


def dce_to_inputs(jaxpr, keep: list[int]):
  """The jaxpr with only the inputs `keep` (which must include every used one) and no dead code."""
  if len(keep) == len(jaxpr.invars):
    return jaxpr
  pruned, used = _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=False)
  kept = [i for i, u in enumerate(used) if u]
  assert set(kept) <= set(keep), (kept, keep)
  if kept == list(keep):
    return pruned
  # Some kept inputs are unread (keep_unused): rebuild the invars list in `keep` order.
  full, _ = _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)
  return full.replace(invars=[full.invars[i] for i in keep])


# Whether JAX has started a backend, i.e. whether XLA has read XLA_FLAGS already: no public API
# answers without starting one (`jax.extend.backend.backends()` initialises them).
from jax._src import xla_bridge as _xla_bridge


def backends_are_initialized() -> bool:
  """True once JAX has started a backend (XLA_FLAGS changes are then ignored)."""
  return bool(_xla_bridge.backends_are_initialized())
