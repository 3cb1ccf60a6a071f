"""`donate.jit`: `jax.jit` with a donation plan per leaf.

Mechanism (public JAX, plus the few reads isolated in `_compat`). Every `donate.jit` holds a
real `jax.jit` of the user's function with the user's own keywords (the *gate*). JAX validates the
keywords, binds and traces each call exactly as `jax.jit` does; donate reads the traced jaxpr and
plans every leaf (`_plan.make_plan`). Then one of two things runs the call:

* the plan equals what `jax.jit` does by itself (the common case: the same pairs, no in-function
  annotations): the gate itself lowers, compiles and runs, so the call, its staged objects, its
  caches and its errors are `jax.jit`'s own;
* donate does better (dataflow pairing where first come, first served would copy, `donate_buffer`
  and `alias` anywhere inside, preallocated outputs, symmetric-memory marks): an inner
  `jax.jit(replay, donate_argnums=plan.layout.donated)` over the flat leaves replays the traced
  jaxpr with its outputs reordered, so `jax.jit`'s first-come, first-served pairing makes exactly
  the planned `tf.aliasing_output` attributes.

Either way, compiling reads the compiled module's `input_output_alias` and the memory figures into
the plan before anything runs. The gate's and the inner jit's traced functions raise `_gate.Replan`
unless donate's slow path opened them, so a signature donate has not planned never runs unplanned:
cached calls go straight to `jax.jit`'s C++ dispatch, and a new signature falls back here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import threading
import types
import warnings
from typing import Any, Callable

import jax
from jax import tree_util

from donate import _binding
from donate import _compiled
from donate import _copies
from donate import _dataflow
from donate import _errors
from donate import _gate
from donate import _compat
from donate import _plan
from donate import _stages
from donate import _symm
from donate._primitives import donate_buffer_p
from donate._primitives import remember_donate_jit


_trace_state_clean = _compat.trace_state_clean
_compat.hide_from_tracebacks(os.path.dirname(os.path.abspath(__file__)) + os.sep)


@dataclasses.dataclass(eq=False)
class _Inner:
  """The re-laid-out computation of one signature: a `jax.jit` over the flat leaves."""
  jitted: Callable
  out_order: tuple[int, ...] | None
  out_tree: Any

  def outputs(self, flat) -> Any:
    if self.out_order is not None:
      user = [None] * len(flat)
      for k, j in enumerate(self.out_order):
        user[j] = flat[k]
      flat = user
    return tree_util.tree_unflatten(self.out_tree, flat)

  def __call__(self, leaves):
    return self.outputs(self.jitted(*leaves))


@dataclasses.dataclass(eq=False)
class Prepared:
  """One planned signature: its trace, plan, how it runs, and its staged objects once made.

  It holds no reference back to its `JitWrapped` (no cycle), so dropping the function frees
  everything at once, as dropping a `jax.jit` function does.
  """
  jitted: Callable  # the gate: jax.jit of the user's function
  binding: _binding.Binding
  name: str
  call: _binding.Call  # the call's structure (its leaves are not kept)
  traced: Any  # jax.stages.Traced of the gate
  plan: _plan.DonationPlan
  native: bool  # True: the gate runs it (jax.jit's own plan); False: the inner jit does
  inner: _Inner | None
  lowered: Any = None  # jax.stages.Lowered
  compiled: Any = None  # jax.stages.Compiled
  comm: tuple = ()  # the values marked for symmetric memory (`_symm.comm_buffers`)
  placement: Any = None  # the `_symm` placement policy, on GPU targets with marked values
  in_paths: list | None = None  # the compiled module's parameters as the user's leaf paths
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

  @property
  def donated(self) -> frozenset[int]:
    """The leaves the program donates (as `jax.jit`'s `args_info[...].donated` reports them)."""
    if self.native:
      return frozenset(self.binding.donated_leaves(self.call))
    return frozenset(self.plan.layout.donated)

  def run(self, args, kwargs, leaves):
    if self.native:
      return self.jitted(*args, **kwargs)
    return self.inner(leaves)


class JitWrapped:
  """The function returned by `donate.jit`: call it like the function, or `.plan`, `.lower`,
  `.trace`, `.eval_shape`, `.into(out)` for the same arguments.

  >>> import jax.numpy as jnp, donate
  >>> step = donate.jit(lambda w, g: w - 0.1 * g, donate_argnums=0)
  >>> [d.action for d in step.plan(jnp.ones(4), jnp.ones(4)).decisions]
  ['aliased', 'kept']
  """

  def __init__(self, fun: Callable, donate_argnums=None, donate_argnames=None, strict=False,
               adopt_inner_donation: bool = False, jit_kwargs: dict | None = None,
               copy_threshold: int = 65536, symmetric_placement: bool = True):
    if not callable(fun):
      raise TypeError(f"Expected a callable value, got {fun!r}")
    # Like jax.jit: the function's name, docs and attributes first (a function made by jax.grad
    # of a donate.jit function carries that one's attributes), then donate's own on top.
    functools.update_wrapper(self, fun)
    jit_kwargs = dict(jit_kwargs or {})
    self._fun = fun
    self._name = _fun_name(fun)
    # jax.jit validates the function and every keyword exactly as for jax.jit(fun); its error
    # keeps its type and sentence, and gains the function's name and its parameters.
    try:
      self._plain = jax.jit(fun, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                            **jit_kwargs)
      gated = self._gated = _gate.gated_for(fun)
      self._jitted = jax.jit(gated, donate_argnums=donate_argnums,
                             donate_argnames=donate_argnames, **jit_kwargs)
    except (ValueError, TypeError) as e:
      raise _keyword_error(self._name, fun, e) from e
    self._gate = gated.gate
    # A function JAX cannot reference weakly gets exactly jax.jit's behaviour, whatever it is.
    self._plain_only = gated.strong
    self._strict_arg = strict
    self._strict, self._strict_copies = _strict_modes(strict)
    self._copy_threshold = int(copy_threshold)
    self._symmetric_placement = bool(symmetric_placement)
    self._adopt_inner = bool(adopt_inner_donation)
    self._jit_kwargs = jit_kwargs
    self._keep_unused = bool(jit_kwargs.get("keep_unused", False))
    self._binding = _binding.Binding(fun, self._jitted)
    self._user_argnums = (donate_argnums, donate_argnames)
    self._native_only = False  # every signature so far runs on the gate: skip flattening
    self._fast: dict[Any, Prepared] = {}
    self._prepared: dict[Any, Prepared] = {}
    self._lock = threading.RLock()
    self._plans = _gate.Plans(self)  # cleared with JAX's caches (jax.clear_caches())

  @property
  def trace_count(self) -> int:
    """How many times the user function was traced (for every donate.jit of it)."""
    return self._gated.trace_count

  # ---- calling ---------------------------------------------------------------------------------
  def __call__(self, *args, **kwargs):
    prep = None
    try:  # inside another trace too: a cache hit there carries the donation (see _primitives)
      if self._native_only:  # jax.jit's own C++ dispatch, nothing in between
        return self._jitted(*args, **kwargs) if kwargs else self._jitted(*args)
      if self._fast:
        call = self._binding.bind(args, kwargs)
        prep = self._fast.get(call.key)
        if prep is not None:
          return prep.run(args, kwargs, call.leaves)
    except _gate.Replan:  # the C++ entry of this signature is now "fall back to Python": drop it
      _compat.clear_cpp_cache(prep.inner.jitted if prep is not None and prep.inner
                                   else self._jitted)
    except (jax.errors.JaxRuntimeError, ValueError) as e:
      if "donate" in str(e) and _trace_state_clean():  # a buffer given twice: name both leaves
        prep, call = self._prepare(args, kwargs)
        _check_duplicates(prep, call)
      raise
    return self._call_slow(args, kwargs)

  def _call_slow(self, args, kwargs):
    if self._plain_only:
      return self._plain(*args, **kwargs)
    if jax.config.jax_disable_jit:
      return self._fun(*args, **kwargs)
    if not _compat.trace_state_clean():
      return self._nested(args, kwargs)
    prep, call = self._prepare(args, kwargs)
    self._compile(prep, call)
    _check_duplicates(prep, call)
    with self._gate:
      out = prep.run(args, kwargs, call.leaves)
    with self._lock:
      self._fast[prep.call.key] = prep
      self._native_only = all(p.native for p in self._fast.values())
    return out

  def _nested(self, args, kwargs):
    """Called inside another trace: run as `jax.jit` would, and record the donation as
    `donate_buffer` markers so an enclosing `donate.jit` honours it."""
    call = self._binding.bind(args, kwargs)
    donated = self._binding.donated_leaves(call)
    if donated:
      leaves = [donate_buffer_p.bind(x)
                if i in donated and isinstance(x, jax.core.Tracer) else x
                for i, x in enumerate(call.leaves)]
      args, kwargs = self._binding.rebuild(call, args, kwargs, leaves)
    with self._gate:
      return self._jitted(*args, **kwargs)

  # ---- planning --------------------------------------------------------------------------------
  def _trace(self, args, kwargs):
    if self._plain_only:  # raises, or answers, as jax.jit does
      return self._plain.trace(*args, **kwargs)
    with self._gate, warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=_errors.JAX_UNUSABLE_PREFIX)
      traced = self._jitted.trace(*args, **kwargs)
    remember_donate_jit(traced.jaxpr)
    return traced

  def _prepare(self, args, kwargs) -> tuple[Prepared, _binding.Call]:
    """Traces (through jax.jit) and plans this call; lowers and compiles nothing yet."""
    traced = self._trace(args, kwargs)
    call = self._binding.bind(args, kwargs)
    key = (id(traced.jaxpr), call.key, tuple(map(_binding.meta_key, call.leaves)))
    with self._lock:
      hit = self._prepared.get(key)
      if hit is not None and hit.traced.jaxpr is traced.jaxpr:
        return hit, call
      prep = self._plan(call, traced)
      self._prepared[key] = prep
      return prep, call

  def _plan(self, call: _binding.Call, traced) -> Prepared:
    n_consts = _compat.traced_num_consts(traced)
    closed = traced.jaxpr
    marked = _symm.mark_required(closed)
    flow = _dataflow.analyze(marked, skip=n_consts)
    paths = self._binding.paths(call)
    leaves = [_binding.leaf_info(p, x) for p, x in zip(paths, call.leaves)]
    in_sh, out_sh, has_layouts = _compat.traced_flat_shardings(traced)
    leaves = [dataclasses.replace(l, sharding_obj=s) if l.sharding_obj is None and s is not None
              else l for l, s in zip(leaves, in_sh)]
    out_paths = ["out" + tree_util.keystr(tuple(kp)) for kp, _ in tree_util.tree_flatten_with_path(
        tree_util.tree_unflatten(traced.out_tree, [0] * traced.out_tree.num_leaves))[0]]
    outputs = [_plan.OutputInfo(p, tuple(a.shape), str(a.dtype), _nbytes(a), s)
               if hasattr(a, "shape") else _plan.OutputInfo(p, (), type(a).__name__, 0)
               for p, a, s in zip(out_paths, closed.out_avals, out_sh)]
    requested = self._binding.donated_leaves(call)
    xla_decides = _multi_device(leaves, outputs) and any(o.sharding_obj is None for o in outputs)
    plan = _plan.make_plan(self._name, leaves, outputs, requested, flow,
                           keep_unused=self._keep_unused, adopt_inner=self._adopt_inner,
                           xla_decides=xla_decides)
    comm = _symm.comm_buffers(marked)
    if comm:
      plan = dataclasses.replace(
          plan, notes=plan.notes + tuple(_symm.comm_buffer_report(comm)),
          collective_memory_bytes=_symm.collective_memory_bytes(comm))
    if self._strict and any(d.reason.startswith(_plan.NOT_A_DEVICE_BUFFER) for d in plan.decisions
                            if d.requested):
      raise _errors.DonationError(plan.explain_host())
    platform = _symm.target_platform([l.sharding_obj for l in leaves]
                                     + [o.sharding_obj for o in outputs], jax.default_backend())
    policy = _symm.placement_policy(platform, comm, enabled=self._symmetric_placement)
    gpu_options = dict(policy.options)
    if gpu_options:
      plan = dataclasses.replace(plan, notes=plan.notes + policy.placed_too)
    native = (marked is closed and not gpu_options
              and self._is_native(plan, leaves, outputs, requested, flow))
    if has_layouts or n_consts:
      native = True  # layouts and hoisted consts: only jax.jit's own path handles them
    inner = None if native else self._inner(marked, plan, traced, in_sh, out_sh, gpu_options)
    structure = dataclasses.replace(call, leaves=[None] * len(call.leaves))
    return Prepared(self._jitted, self._binding, self._name, structure, traced, plan, native,
                    inner, comm=tuple(comm), placement=policy if gpu_options else None)

  def _is_native(self, plan, leaves, outputs, requested, flow) -> bool:
    """Whether `jax.jit`'s own lowering makes the plan: same donated leaves, same pairs."""
    if any(a.kind != "inner_jit" or self._adopt_inner for a in flow.annotations):
      return False
    used = [self._keep_unused or u for u in flow.used]
    consumed = {i for i, d in enumerate(plan.decisions) if d.consumed}
    jax_donated = [i for i in requested if used[i]]
    if not consumed <= set(jax_donated):
      return False
    if _multi_device(leaves, outputs):
      return True  # jax.jit hands every donation to XLA as a donor; XLA pairs them either way
    fcfs = _plan.fcfs_pairs(leaves, outputs, jax_donated)
    planned = plan.pairs()
    device = {i for i, l in enumerate(leaves) if l.kind != _plan.HOST}
    return {i: j for i, j in fcfs.items() if i in device} == planned

  def _inner(self, closed, plan, traced, in_sh, out_sh, gpu_options) -> _Inner:
    layout = plan.layout
    order = layout.out_order
    gate, jaxpr, consts = self._gate, closed.jaxpr, closed.consts

    def replay(*leaves):
      if not gate.is_open:
        raise _gate.Replan()
      outs = jax.core.eval_jaxpr(jaxpr, consts, *leaves)
      return [outs[j] for j in order] if order is not None else list(outs)

    replay.__name__ = replay.__qualname__ = getattr(self._fun, "__name__", "fun")
    kwargs = {k: v for k, v in self._jit_kwargs.items()
              if k in ("keep_unused", "compiler_options", "inline")}
    if gpu_options:
      kwargs["compiler_options"] = {**gpu_options, **(kwargs.get("compiler_options") or {})}
    if any(s is not None for s in in_sh):
      kwargs["in_shardings"] = tuple(in_sh)
    if any(s is not None for s in out_sh):
      kwargs["out_shardings"] = [out_sh[j] for j in order] if order is not None else list(out_sh)
    jitted = jax.jit(replay, donate_argnums=layout.donated, **kwargs)
    return _Inner(jitted, order, traced.out_tree)

  # ---- staging ---------------------------------------------------------------------------------
  def _lower(self, prep: Prepared, call: _binding.Call, **lower_kwargs):
    """The jax.stages.Lowered of a planned signature; warns (or raises) for unusable donations."""
    with prep.lock:
      if prep.lowered is not None and not lower_kwargs:
        return prep.lowered
      explicit = [d for d in prep.plan.unusable if d.source.startswith("alias at ")]
      if explicit or (self._strict and prep.plan.unusable):
        raise _errors.DonationError("donate: " + prep.plan.explain_unusable(explicit or None))
      with self._gate, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_errors.JAX_UNUSABLE_PREFIX)
        if prep.native:
          lowered = prep.traced.lower(**lower_kwargs)
        else:
          inner_traced = prep.inner.jitted.trace(*call.leaves)
          remember_donate_jit(inner_traced.jaxpr)
          lowered = inner_traced.lower(**lower_kwargs)
      if lower_kwargs:
        return lowered
      if prep.plan.unusable:
        warnings.warn(prep.plan.explain_unusable(), _errors.UnusableDonationWarning,
                      stacklevel=_user_stacklevel())
      prep.lowered = lowered
      return lowered

  def _compile(self, prep: Prepared, call: _binding.Call, compiler_options=None,
               device_assignment=None):
    """Compiles a planned signature and folds the compiled aliases into its plan."""
    lowered = self._lower(prep, call)
    with prep.lock:
      if prep.compiled is not None and compiler_options is None and device_assignment is None:
        return prep.compiled, prep.plan
      kwargs = {}
      if compiler_options is not None:
        kwargs["compiler_options"] = compiler_options
      if device_assignment is not None:
        kwargs["device_assignment"] = device_assignment
      compiled = lowered.compile(**kwargs)
      plan = _compiled.realize(prep, lowered, compiled, self._copy_threshold)
      explicit = [d for d in plan.unusable if d.source.startswith("alias at ")]
      if explicit or (self._strict and len(plan.unusable) > len(prep.plan.unusable)):
        raise _errors.DonationError("donate: " + plan.explain_unusable(explicit or None))
      copied = _copies.strict_problems(plan.copies, self._name) if self._strict_copies else []
      if copied:
        raise _errors.DonationError("\n".join(copied))
      if plan.placements is not None:
        plan.placements.check(strict=self._strict)
      if not kwargs:
        prep.compiled, prep.plan = compiled, plan
      return compiled, plan

  # ---- public ----------------------------------------------------------------------------------
  def plan(self, *args, **kwargs) -> _plan.DonationPlan:
    """Traces, plans and compiles for these arguments; executes and consumes nothing."""
    return self._compile(*self._prepare(args, kwargs))[1]

  def trace(self, *args, **kwargs) -> "_stages.Traced":
    """Traces for these arguments; a `jax.stages.Traced` with the plan (`.plan`)."""
    return _stages.Traced(self, *self._prepare(args, kwargs))

  def lower(self, *args, **kwargs) -> "_stages.Lowered":
    """Lowers for these arguments (ahead of time), with the plan's aliases and donors; compiles
    nothing (`.compile()` does, and checks the aliases XLA made)."""
    return self.trace(*args, **kwargs).lower()

  def eval_shape(self, *args, **kwargs):
    with self._gate:
      return self._jitted.eval_shape(*args, **kwargs)

  def into(self, out):
    """Writes the results into preallocated buffers `out`; see `donate.jit`."""
    from donate import _into  # noqa: PLC0415 - _into builds a JitWrapped
    return _into.Into(self, out)

  def clear_cache(self):
    """Forgets every planned signature and clears the underlying `jax.jit` caches."""
    self._forget()
    self._jitted.clear_cache()

  def _forget(self):
    with self._lock:
      for prep in self._prepared.values():
        if prep.inner is not None:
          prep.inner.jitted.clear_cache()
      self._prepared.clear()
      self._fast.clear()
      self._native_only = False

  def _cache_size(self) -> int:
    """How many compiled signatures this function holds (`jax.jit`'s `_cache_size()`)."""
    with self._lock:
      return len({id(p) for p in self._prepared.values() if p.compiled is not None})

  def __get__(self, obj, objtype=None):
    if obj is None:
      return self
    return types.MethodType(self, obj)  # as jax.jit's functions bind to instances

  def __repr__(self) -> str:
    return repr(self._plain)  # as jax.jit's own repr, which handles every odd function

  def __getstate__(self):
    return self._plain.__getstate__()

  def __reduce__(self):
    donate_argnums, donate_argnames = self._user_argnums
    return (_restore, (self._fun, dict(self._jit_kwargs, donate_argnums=donate_argnums,
                                       donate_argnames=donate_argnames, strict=self._strict_arg,
                                       adopt_inner_donation=self._adopt_inner,
                                       copy_threshold=self._copy_threshold,
                                       symmetric_placement=self._symmetric_placement)))


def _restore(fun, kwargs):
  """Unpickles a `donate.jit` function: the same function with the same keywords."""
  return jit(fun, **kwargs)


def _keyword_error(name: str, fun, error: Exception) -> Exception:
  """`jax.jit`'s error for a bad keyword, as a DonationError of the same type naming the function."""
  if "unexpected keyword argument" in str(error):
    return error  # a keyword jax.jit does not have: its own TypeError says it best
  try:
    params = ", ".join(inspect.signature(fun).parameters)
  except (TypeError, ValueError):
    params = "unknown"
  cls = _errors.DonationTypeError if isinstance(error, TypeError) else _errors.DonationError
  return cls(_errors.message(
      f"donate.jit of {name}: {str(error).rstrip('.')}", expected=f"arguments of {name}({params})",
      fix="name parameters that exist in donate_argnums/donate_argnames and static_argnums/"
          "static_argnames, and never the same one in both"))


def _strict_modes(strict) -> tuple[bool, bool]:
  """`strict` as (unusable donations raise, copies of donated buffers raise)."""
  modes = {strict} if isinstance(strict, (bool, str)) else set(strict)
  unknown = modes - {True, False, "unusable", "copies"}
  if unknown:
    raise _errors.DonationError(_errors.message(
        "donate.jit: unknown strict mode", expected="True, False, \"unusable\", \"copies\" or a "
        "tuple of the last two", got=repr(strict), fix="pass strict=True or strict=\"copies\""))
  return bool(modes & {True, "unusable"}), "copies" in modes


def _fun_name(fun) -> str:
  """The function's name for messages, through partials; never fails (a repr may raise)."""
  while isinstance(fun, functools.partial):
    fun = fun.func
  name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None)
  return name if isinstance(name, str) else type(fun).__name__


def _nbytes(aval) -> int:
  size = 1
  for d in aval.shape:
    size *= int(d)
  return size * aval.dtype.itemsize


def _multi_device(leaves, outputs) -> bool:
  shardings = [l.sharding_obj for l in leaves] + [o.sharding_obj for o in outputs]
  return any(_num_devices(s) > 1 for s in shardings if s is not None)


def _num_devices(sharding) -> int:
  """Devices a sharding spans; abstract meshes (no devices) count by their size."""
  try:
    return len(sharding.device_set)
  except Exception:  # an AbstractMesh has no devices
    mesh = getattr(sharding, "mesh", None)
    return int(getattr(mesh, "size", 1) or 1)


def _check_duplicates(prep: Prepared, call: _binding.Call, plan: _plan.DonationPlan | None = None):
  """The same buffer twice where one is donated: raise before dispatch, naming both leaves."""
  plan = plan or prep.plan
  consumed = {i for i, d in enumerate(plan.decisions) if d.consumed}
  if not consumed:
    return
  seen: dict[int, int] = {}
  for i, x in enumerate(call.leaves):
    if isinstance(x, jax.Array):
      j = seen.setdefault(id(x), i)
      if j != i and (i in consumed or j in consumed):
        d = plan.decisions
        raise _errors.DonationRuntimeError(_errors.message(
            f"the same array is passed twice to {prep.name}, once as {d[j].path} and "
            f"once as {d[i].path}, and at least one is donated", expected="distinct buffers",
            got="one buffer in two places",
            fix="pass a copy (x.copy()) in one place or do not donate it"))


def _user_stacklevel() -> int:
  """The `warnings.warn` stacklevel of the first caller outside this package and JAX."""
  hidden = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
            os.path.dirname(os.path.abspath(jax.__file__)) + os.sep)
  frame, level = sys._getframe(1), 1
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(hidden):
    frame, level = frame.f_back, level + 1
  return level


def jit(fun: Callable | None = None, /, *, donate_argnums=None, donate_argnames=None,
        strict: bool | str | tuple[str, ...] = False, adopt_inner_donation: bool = False,
        copy_threshold: int = 65536, symmetric_placement: bool = True, **jax_jit_kwargs):
  """A drop-in for `jax.jit` that plans donation per leaf and explains itself.

  Usable as `@donate.jit`, `@donate.jit(...)` and `donate.jit(f, ...)`. Every `jax.jit` keyword
  passes through (static arguments, shardings, `keep_unused`, `compiler_options`, ...) and is
  validated by `jax.jit` itself; whatever `jax.jit` accepts, this accepts, with the same results,
  exception types and warning texts. `donate_argnums`/`donate_argnames` donate whole pytrees,
  whether the argument is passed by position or by keyword; leaves that are not device buffers
  (numpy arrays, Python scalars) are not consumed, and inputs the function never reads stay alive,
  as in `jax.jit`. `donate.donate_buffer` and `donate.alias` inside the function donate more.
  Outputs are paired with the donated input they are computed from in place, not first come,
  first served. The returned function also has `.plan(...)` (plans and compiles, runs nothing),
  `.trace(...)`, `.lower(...)`, `.eval_shape(...)` and `.into(out)(...)`.

  Args:
    fun: the function to compile.
    donate_argnums: positions of arguments whose buffers the call may consume.
    donate_argnames: names of arguments whose buffers the call may consume.
    strict: `True` (or "unusable"): raise `DonationError` (before anything is consumed) when a
      requested donation cannot be used, or names a leaf that is not a device buffer, instead of
      warning `UnusableDonationWarning` once per compile. "copies": raise when XLA copies a
      donated buffer or a loop carry of at least `copy_threshold` bytes anyway (see
      `Compiled.copies()`). `("unusable", "copies")`: both.
    adopt_inner_donation: also donate outer inputs that a plain inner
      `jax.jit(..., donate_argnums=...)` (or `equinox.filter_jit(donate=...)`) donates. Off by
      default: like `jax.jit`, the outer call then consumes only what it was asked to; the plan
      lists the inner donation as ignored. (An inner `donate.jit` is always honoured.)
    copy_threshold: the smallest copy, in bytes, that the plan's "copies XLA added" section and
      `Compiled.copies()` report.
    symmetric_placement: on a GPU target (concrete GPU arrays, or abstract arguments and
      shardings on a GPU mesh such as `donate.targets.gpu_mesh("h100", 8)`), compile with the
      options that put the values marked by `with_symmetric` / `requires_symmetric` /
      `symmetric_memory` in collective memory, and report where each landed
      (`plan.placements`); False compiles as `jax.jit` would.
    **jax_jit_kwargs: any other `jax.jit` keyword.

  Returns:
    The compiled function.

  >>> import jax.numpy as jnp, donate
  >>> @donate.jit(donate_argnums=(0, 1))
  ... def step(a, b):
  ...   return b.at[0].set(1.0), a + 1.0
  >>> a, b = jnp.zeros(3), jnp.zeros(3)
  >>> pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  >>> x, y = step(a, b)
  >>> x.unsafe_buffer_pointer() == pb, y.unsafe_buffer_pointer() == pa, a.is_deleted()
  (True, True, True)
  """
  if fun is None:
    return lambda f: jit(f, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                         strict=strict, adopt_inner_donation=adopt_inner_donation,
                         copy_threshold=copy_threshold, symmetric_placement=symmetric_placement,
                         **jax_jit_kwargs)
  return JitWrapped(fun, donate_argnums, donate_argnames, strict, adopt_inner_donation,
                    jax_jit_kwargs, copy_threshold, symmetric_placement)
