"""Everything that depends on JAX's internals, in one place.

This is the only module, with ``compat_aliases`` (the aliases set on a lowered module), that
imports ``jax._src`` (each import says why no public API serves);
``loops`` decodes the one layout of public params that differs between the supported JAX versions
(the operands of ``scan`` and ``while`` equations). Everything else in the package uses public JAX
only. To support a new JAX version, start here (see CONTRIBUTING.md).
"""

from __future__ import annotations

import copy
import inspect
import os
from typing import Any

import jax
import jax.extend as jex

# `jax.jit` as it was when donate was imported. Users try donate on code they did not write with
# `jax.jit = donate.jit` before importing a framework; every `jax.jit` donate itself builds (the
# gate, the re-laid-out inner call, the symmetric-memory check) must stay JAX's own, or the patch
# would recurse. The rest of the package calls `_compat.jax_jit`, never `jax.jit`.
jax_jit = jax.jit

# Source lines of equations: `jax.extend` exposes `source_info` on equations but no public way to
# turn it into "file:line (function)" text; JAX's own errors use `summarize`.
from jax._src import source_info_util as _source_info_util

# The package's own folder (donate/, one above this layer's): frames there are not the user's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_HIDDEN = (os.path.dirname(jax.__file__), PACKAGE_DIR)


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


def user_frames(source_info) -> tuple[tuple[str, str, int], ...]:
  """`(file, function, line)` of every frame of `source_info`'s traceback outside JAX and this
  package, outermost first: where in the user's code (and the libraries it calls) an equation
  was traced."""
  frames = getattr(getattr(source_info, "traceback", None), "frames", None) or ()
  return tuple(
    (f.file_name, f.function_name, f.line_num)
    for f in reversed(frames)
    if not f.file_name.startswith(_HIDDEN)
  )


# Which inputs a computation really reads, exactly as `jax.jit` decides it when `keep_unused=False`
# (it prunes inputs with partial_eval's dead-code elimination; no public API exposes that pass).
from jax._src.interpreters import partial_eval as _pe


def used_inputs(jaxpr) -> list[bool]:
  """For each input of an open jaxpr, whether any output depends on it after dead-code removal."""
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


# Whether a call happens inside another trace (jit, grad, vmap, ...). `donate.jit` must record its
# donation as markers for an enclosing `donate.jit` in that case; JAX has no public predicate.
from jax._src import core as _core


def trace_state_clean() -> bool:
  """True at the top level (no trace active), as `jax.jit`'s own dispatch decides it."""
  return _core.trace_state_clean()


# What `jax.jit`'s dispatch keys calls on beside the arguments (jaxlib's `JitConfigs`, not exposed).
from jax._src import config as _config

_NAMES = (
  "jax_optimization_level",
  "jax_memory_fitting_level",
  "jax_pallas_auto_assign_collective_ids",
  "jax_pallas_auto_assign_collective_ids_limit",
  "device_context",
)
_STATES = {**_config.config_states, "device_context": getattr(_config, "device_context", None)}
_JIT_ONLY = [_STATES[n] for n in _NAMES if _STATES.get(n) is not None]


def jit_context() -> tuple:
  """The jit-keyed configuration where a call is made (a call's key, beside its arguments)."""
  return (_config.trace_context(), *(s.value for s in _JIT_ONLY))


def jit_argnums(
  jitted,
) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
  """`(static_argnums, static_argnames, donate_argnums, donate_argnames)` as `jax.jit` has them.

  `jax.jit` resolves numbers and names through the signature (a name implies its position and the
  reverse) when it is constructed; reading its result keeps donate's binding identical to jax's.
  No public API returns the resolved tuples.
  """
  names = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames")
  return tuple(tuple(getattr(jitted._jit_info, k)) for k in names)  # type: ignore[return-value]


def traced_flat_shardings(traced) -> tuple[tuple, tuple, bool]:
  """The flat `(in_shardings, out_shardings, has_layouts)` a `jax.stages.Traced` resolved.

  `jax.jit` turns prefix trees, `PartitionSpec`s under a mesh context, `device=`/`backend=` into one
  sharding per leaf while tracing; the re-laid-out computation must use exactly those. Unspecified
  entries come back as None. Only the traced parameters hold them.
  """
  params = traced._params
  n_consts = len(traced._consts)
  unspecified = _UNSPECIFIED
  ins = tuple([None if type(s) is unspecified else s for s in params["in_shardings"][n_consts:]])
  outs = tuple([None if type(s) is unspecified else s for s in params["out_shardings"]])
  layouts = any(x is not None for x in params["in_layouts"][n_consts:]) or any(
    x is not None for x in params["out_layouts"]
  )
  return ins, outs, layouts


# The type of an entry of the traced `in_shardings`/`out_shardings` left to the program (its
# `UnspecifiedValue`, `jax.jit`'s default; no public API names it): compared by identity, read
# per leaf of every signature.
from jax._src.named_sharding import UnspecifiedValue as _UNSPECIFIED  # noqa: E402


def layout_key(x) -> Any:
  """A hashable stand-in for a concrete array's layout, for donate's cache keys: the PJRT layout
  `x.format` is built from (`ArrayImpl._pjrt_layout`, private), which is read 7x faster than
  `x.format` (which builds a `Layout` each time: 20 ms for 10,000 leaves). A deleted array is
  asked first, as `x.format` asks (reading a deleted array's PJRT layout crashes the process);
  anything else, or an array whose layout cannot be read, falls back to `x.format`."""
  try:
    if x.is_deleted():  # the call then raises JAX's own "Array has been deleted"
      return None
    return x._pjrt_layout
  except Exception:  # not an ArrayImpl, or a backend without layouts
    return getattr(x, "format", None)


def traced_num_consts(traced) -> int:
  """How many leading inputs of `traced.jaxpr` are hoisted constants rather than arguments."""
  return len(traced._consts)


def traced_program(traced) -> tuple[Any, list, tuple[bool, ...]]:
  """`(closed jaxpr, hoisted constants, donated flags of the arguments)` of a
  `jax.stages.Traced`: the jaxpr takes the constants, then the flat arguments. Only the traced
  parameters hold the donations and the constants."""
  n = len(traced._consts)
  return traced.jaxpr, list(traced._consts), tuple(traced._params["donated_invars"][n:])


def traced_without_donation(traced):
  """A copy of a `jax.stages.Traced` that donates nothing, or None when it donates nothing.

  Lowered, the copy is the same program (the same jaxpr, shardings, layouts, `keep_unused` and
  jit-level `compiler_options`) without `tf.aliasing_output` or `jax.buffer_donor`: what a memory
  profile compiles to measure what the donations saved at the peak. Only the traced parameters
  hold the donations, and no public API lowers a Traced with other ones.
  """
  donated = traced._params["donated_invars"]
  return _donating(traced, (False,) * len(donated)) if any(donated) else None


def traced_with_donation(traced, leaves: set[int]):
  """A copy of a `jax.stages.Traced` that donates also the argument leaves `leaves` (indices
  into its flat arguments): what a memory profile's advice compiles to measure a donation."""
  first = len(traced._consts)
  donated = [d or i - first in leaves for i, d in enumerate(traced._params["donated_invars"])]
  return _donating(traced, tuple(donated))


def _donating(traced, donated: tuple):
  """A copy of a `jax.stages.Traced` whose flat inputs are donated as `donated` says."""
  twin = copy.copy(traced)
  twin._params = {**traced._params, "donated_invars": donated}
  for cached in ("_lojax", "_closure_converted"):  # lowerings derived from the old parameters
    if cached in type(traced).__slots__:
      setattr(twin, cached, None)
  return twin


def is_high(x) -> bool:
  """Whether a jaxpr or an aval has hijax types (`jax.experimental.hijax`): no public API says."""
  return getattr(x, "is_high", False) is True


def lowered_kept_leaves(jax_lowered) -> tuple[tuple[int, ...], int]:
  """`(kept, n_const_args)`: the argument leaves the module's `main` takes (after dead-code
  elimination), and how many hoisted constants precede them. Only the lowering knows either.

  With constants hoisted as arguments (`jax_use_simplified_jaxpr_constants`, the default from jax
  0.12.1), `kept_var_idx` counts the constants first and the argument leaves after them."""
  lowering = jax_lowered._lowering
  n_consts = len(getattr(lowering, "const_args", ()) or ())
  kept = sorted(lowering.compile_args["kept_var_idx"])
  return tuple(k - n_consts for k in kept if k >= n_consts), n_consts


def compiled_num_const_args(jax_compiled) -> int:
  """How many closed-over constants JAX passes a `jax.stages.Compiled`'s program as its leading
  parameters (hoisted with `jax_use_simplified_jaxpr_constants`, the default from jax 0.12.1; its
  `args_info` leaves them out). Only the call parameters hold them."""
  params = getattr(jax_compiled, "_params", None)
  return len(getattr(params, "const_args", None) or ())


def lowered_closed_over_refs(jax_lowered) -> int:
  """How many `jax.Ref`s the function closes over: `jax.jit` passes each as a parameter after the
  argument leaves, written back through a result aliased to it (after the results, with the
  argument refs' own). Only the lowering's mutation data records them."""
  mut = jax_lowered._lowering.compile_args.get("mut")
  return len(mut.in_mut) if mut is not None else 0


# A `donate.jit` function dispatches through a C++ object of `jax.jit`'s kind (no public API).
from jax._src.lib import _jax


def dispatch_like(jitted, fun, cache_miss) -> Any:
  """A C++ dispatch keyed as the `jax.jit` function `jitted` keys its own (static arguments,
  keywords; per call the arguments' structure, avals, shardings, layouts, commitment and JAX's
  jit-keyed configs, such as the default device), in the same cache under `fun` (which runs
  under disable_jit): a call no entry of `fun` matches runs `cache_miss(*args, **kwargs)`, which
  returns `(outputs, fastpath data or None, drop)` as JAX's own misses do."""
  s, keys = jitted.__getstate__(), ("static_argnums", "static_argnames", "global_cache_key")
  rest = (s["pytree_registry"], s["shard_arg_fallback"], s["cache"])  # `jitted`'s cache, by `fun`
  dispatch = _jax.pjit(s["function_name"], fun, cache_miss, *map(s.get, keys), *rest)
  dispatch._fun = fun  # what JAX's NaN check (jax_debug_nans) runs de-optimized, as for jax.jit
  return dispatch


def jit_cache_miss(jitted) -> Any:
  """What a `jax.jit` function's C++ dispatch calls on a miss: runs the call through JAX."""
  return jitted.__getstate__()["cache_miss"]


def compiled_cache_miss(jax_compiled) -> Any:
  """The same for a `jax.stages.Compiled`; None when its executable has no C++ dispatch (host
  callbacks, unordered effects)."""
  call = jax_compiled._executable.create_cpp_call(jax_compiled._params)
  return None if call is None else call.__getstate__()["cache_miss"]


def compiled_output_shardings(jax_compiled, n_outputs: int) -> list:
  """The flat shardings of a `jax.stages.Compiled`'s first `n_outputs` results (the user's):
  `Compiled.output_shardings` fails for a program that writes refs back (it unflattens the
  write-backs' shardings too, into the user's output tree); the flat list holds them last."""
  return list(jax_compiled._executable._out_shardings)[:n_outputs]


# `jax.clear_caches()` clears every cache registered here; donate's plans (which hold traced
# jaxprs) must go with them, or a cleared JAX cache would still be kept alive by donate.
from jax._src import util as _util


def register_cache(cache, for_what: str) -> None:
  """Registers an object with `cache_clear()`, `cache_info()`, `cache_keys()` with JAX's caches."""
  _util.register_cache(cache, for_what)


# Whether JAX has started a backend, i.e. whether XLA has read XLA_FLAGS already: no public API
# answers without starting one (`jax.extend.backend.backends()` initialises them).
from jax._src import xla_bridge as _xla_bridge


def backends_are_initialized() -> bool:
  """True once JAX has started a backend (XLA_FLAGS changes are then ignored)."""
  return bool(_xla_bridge.backends_are_initialized())


# Tracebacks: JAX hides its own frames from the tracebacks users see and from the source locations
# it gives equations and HLO; donate's frames between the user's call and JAX's are hidden the
# same way (in JAX's mode: "off", "tracebackhide" or removing them). No public API does either.
from jax._src import traceback_util as _traceback_util

api_boundary = _traceback_util.api_boundary  # where a filtered traceback starts (jax.jit's calls)
traceback_filtering_mode = _traceback_util._filtering_mode


def _raise(e: BaseException):
  raise e


_raise_at_boundary = api_boundary(_raise)


def filter_at_boundary(e: Exception) -> None:
  """Does to `e`, caught in the caller's frame, what `api_boundary` does to an exception raised
  below it (filters its traceback in JAX's mode, or marks the hidden frames, unless an enclosing
  boundary will), with no boundary frame between the user's call and the function: a bare
  `raise` after this raises `e` as a boundary around the caller would have.

  A boundary below (a jitted function the trace called, such as a `jax.numpy` one) sees no
  boundary above it, so it has filtered `e` already: what it added (JAX's note, or the
  `UnfilteredStackTrace` cause, which holds the whole stack) is kept and not added twice."""
  tb = e.__traceback__
  unfiltered = _traceback_util.UnfilteredStackTrace
  inner = e.__cause__ if type(e.__cause__) is unfiltered else None
  notes = list(getattr(e, "__notes__", ()))
  try:
    _raise_at_boundary(e)
  except BaseException as raised:  # e itself: here, then the boundary's frame or the filtered tb
    below = raised.__traceback__.tb_next if raised.__traceback__ is not None else None
    boundary = below is not None and below.tb_frame.f_code is _raise_at_boundary.__code__
    e.__traceback__ = tb if boundary else below  # (the marks of "tracebackhide" stay on frames)
  added = getattr(e, "__notes__", [])[len(notes) :]
  if added and all(note in notes for note in added):
    e.__notes__ = notes
  if inner is not None and type(e.__cause__) is unfiltered and e.__cause__.__cause__ is inner:
    e.__cause__ = inner


# The first call of a `donate.jit` function traces in its C++ dispatch's miss as `jax.jit`'s own
# miss does, with JAX's `_infer_params` called from the miss itself: the user's function then
# runs as many frames below the user's call as under `jax.jit` (JAX's tests count them), which
# `jax.jit(...).trace` (a boundary and a function more) cannot give.
from jax._src import pjit as _pjit
from jax._src import stages as _jax_stages

# (jax 0.12's Traced also takes the function's source info)
_TRACED_TAKES_SOURCE_INFO = "fun_sourceinfo" in inspect.signature(_jax_stages.Traced).parameters
infer_params = _pjit._infer_params  # called as infer_params(*trace_target(jitted), args, kwargs)


def trace_target(jitted) -> tuple:
  """What `infer_params` traces for the `jax.jit` function `jitted`: its function and options."""
  return jitted._fun, jitted._jit_info


def traced_of(jitted, params, args_flat) -> jax.stages.Traced:
  """The `jax.stages.Traced` that `jitted.trace(...)` makes of `infer_params`'s results."""
  types = list(map(_pjit.convert_to_metaty, args_flat))
  rest: tuple = (params.params, params.in_tree, params.out_tree, params.consts)
  if _TRACED_TAKES_SOURCE_INFO:
    rest = (*rest, jitted._jit_info.fun_sourceinfo)
  return _jax_stages.Traced(types, *rest)


# An executable's rejection of an argument's type, and JAX's test of each argument that
# `_run_python_pjit` runs to name the argument it rejected (no public API runs it).
from jax._src import dtypes as _dtypes
from jax._src.interpreters import pxla as _pxla

InvalidInputException = _dtypes.InvalidInputException


# jax 0.12.1 deprecates the name `jax.sharding.SingleDeviceSharding` (reading it warns) and adds
# `is_single_device_sharding`; earlier versions have only the class. Public either way.
_IS_SINGLE_DEVICE = getattr(jax.sharding, "is_single_device_sharding", None)


def is_single_device_sharding(sharding) -> bool:
  """Whether `sharding` is JAX's one-device sharding, without the deprecation warning of 0.12.1."""
  if _IS_SINGLE_DEVICE is not None:
    return _IS_SINGLE_DEVICE(sharding)
  return isinstance(sharding, jax.sharding.SingleDeviceSharding)


def is_valid_jax_value(x) -> bool:
  try:
    return type(_dtypes.canonicalize_value(x)) in _pxla.shard_arg_handlers
  except InvalidInputException:
    return False


def hide_from_tracebacks(path: str, shown: tuple[str, ...] = ()) -> None:
  """Hides frames from files under `path` as JAX's own are: in JAX's filtered tracebacks and in
  its user frames (error messages, and the locations a lowered module carries, which are then
  those `jax.jit` gives the same program); the files `shown` (under `path`) stay user code.

  >>> _source_info_util.is_user_filename(__file__)
  False
  """
  _traceback_util.register_exclusion(path)
  _source_info_util.register_exclusion(path)
  for file in shown:
    _source_info_util.register_inclusion(file)


def clear_cpp_cache(jitted) -> None:
  """Drops the C++ dispatch entries of one `jax.jit` function (or `dispatch_like` object),
  keeping its traces and executables: an entry whose first call raised (donate's gate raises on
  purpose) falls back to Python for good. Only the C++ object's own method drops just those."""
  jitted._clear_cache()


def bound_axis_names() -> tuple:
  """The named axes bound where the caller is being traced (``shard_map``, ``vmap``, ...).

  Uses ``jax.extend.core.unsafe_get_axis_names_DO_NOT_USE``, the one public query of JAX's axis
  environment on both supported JAX versions.

  >>> bound_axis_names()
  ()
  """
  return tuple(jex.core.unsafe_get_axis_names_DO_NOT_USE())
