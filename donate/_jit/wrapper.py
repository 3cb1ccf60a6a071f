"""`donate.jit`: `jax.jit` with a donation plan per leaf.

Every `donate.jit` holds a real `jax.jit` of the user's function with the user's own keywords (the
*gate*, `_gate`). JAX validates the keywords, binds and traces each call exactly as `jax.jit` does;
donate reads the traced jaxpr and plans every leaf (`signature.prepare`), then the gate itself,
its lowering with the plan's aliases, or a replay of a marked program runs the call (see
`signature` and `program`). A call is a call of a C++ dispatch of JAX's own kind, keyed as the
gate's (`_calling`): a call that matches an entry runs that entry's program; any other call (a
new signature, another default device or jit-keyed config) plans first (the dispatch's miss),
and the planned program's run makes the entry. The gate's traced functions raise `_gate.Replan`
unless donate opened them, and the gate's own dispatch runs nothing: a signature donate has not
planned never runs unplanned. A function that donates no argument traces as `jax.jit(fun)` itself
(`_gated_jit`), sharing JAX's trace cache with `jax.jit(fun)` and `jax.eval_shape(fun)`.
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

import jax

from donate._base import compat as _compat
from donate._base.primitives import donate_buffer_p, remember_donate_jit
from donate._jit import binding as _binding
from donate._jit import calling as _calling
from donate._jit import eval_shape as _eval_shape
from donate._jit import gate as _gate
from donate._jit import into as _into
from donate._jit import options as _options
from donate._jit import program as _program
from donate._jit import quick as _quick
from donate._jit import signature as _signature
from donate._jit import stages as _stages
from donate._plan import donation_plan as _donation_plan

_compat.hide_from_tracebacks(
  _compat.PACKAGE_DIR, shown=(os.path.join(_compat.PACKAGE_DIR, "_examples.py"),)
)  # the demo's programs


class _Signature:
  """`f.__signature__`: the function's signature, as `jax.jit`'s functions carry it. `inspect`
  reads it first; without it, it takes a callable with `__get__` for a built-in method descriptor
  and `inspect.signature(f, follow_wrapped=False)` (as `chex.fake_pmap` calls it) raises. The
  class itself has none (`inspect.signature(PjitFunction)` reads its `__init__`)."""

  def __get__(self, obj, objtype=None) -> inspect.Signature | None:
    return None if obj is None else inspect.signature(obj._fn.fun)


class JitWrapped:
  """The function returned by `donate.jit`: call it like the function, or `.plan`, `.lower`,
  `.trace`, `.eval_shape`, `.into(out)` for the same arguments.

  >>> import jax.numpy as jnp, donate
  >>> step = donate.jit(lambda w, g: w - 0.1 * g, donate_argnums=0)
  >>> [str(d.action) for d in step.plan(jnp.ones(4), jnp.ones(4)).decisions]
  ['aliased', 'kept']
  """

  def __init__(self, fun: Callable, options: _options.Options):
    if not callable(fun):
      raise TypeError(f"Expected a callable value, got {fun!r}")
    # Like jax.jit: the function's name, docs and attributes first (a function made by jax.grad
    # of a donate.jit function carries that one's attributes), then donate's own on top.
    functools.update_wrapper(self, fun)
    name = _fun_name(fun)
    # jax.jit validates the function and every keyword exactly as for jax.jit(fun); its error
    # keeps its type and sentence, and gains the function's name and its parameters.
    self._plain_jit: Any = None  # jax.jit(fun) with the same keywords, built where read (_plain)
    try:
      self._gated = _gate.gated_for(fun)
      jitted, self._traces_plain = _gated_jit(self, fun, options)
    except (ValueError, TypeError) as e:
      raise _options.keyword_error(name, fun, e, options.jit_kwargs) from e
    self._fn = _signature.Function(
      fun, name, jitted, self._gated.gate, _binding.Binding(fun, jitted), options
    )
    self._plain_only = self._gated.strong  # not weakly referenceable: exactly jax.jit's behaviour
    self._no_entry = _program.NoEntry()  # programs the dispatch has no entry for
    self._prepared: dict[Any, _program.Signature] = {}  # by its trace and its leaves' facts
    self._into: JitWrapped | None = None
    self._lock = threading.RLock()
    self._plans = _gate.Plans(self, name)  # cleared with JAX's caches (jax.clear_caches())
    self._dispatch: Any  # and what it is keyed by (none for jax.jit's own)
    self._stand_in: _gate.StandIn | None
    if self._plain_only:
      self._dispatch, self._stand_in = _plain(self), None
    else:
      self._dispatch, self._stand_in = _calling.dispatch_for(self, jitted)
    self._call = self._dispatch  # what a call calls (`__call__`; `_calling.checks`)
    _calling.follow(self, asks=not self._traces_plain)

  @property
  def trace_count(self) -> int:
    """How many times the user function was traced (for every donate.jit of it)."""
    return self._gated.trace_count

  # ---- calling ----------------------------------------------------------------------------------
  if TYPE_CHECKING:

    def __call__(self, *args, **kwargs) -> Any: ...

  else:  # the dispatch itself, or `_calling.checked` once the function consumes a buffer
    __call__ = property(operator.attrgetter("_call"))

  def _answered(self, args, kwargs) -> tuple | None:
    """A call the dispatch has no entry for, answered without tracing: inside another trace, or
    a planned program that runs without an entry (found again by its key). Under
    `jax.disable_jit()` the dispatch calls the function itself and never misses."""
    if not _compat.trace_state_clean():
      return _nested(self, args, kwargs), None
    found = self._no_entry.find(self._fn.binding, args, kwargs)
    if found is not None:
      program, call = found
      try:
        return program.miss(args, kwargs, call.leaves)
      except _gate.Replan:  # traced anew (JAX's trace evicted): planned again
        if program.prep.inner is not None:  # a replay's own dispatch: its C++ entry must go
          _compat.clear_cpp_cache(program.prep.inner.jitted)
    return None

  def _run_traced(self, traced, args, kwargs) -> tuple:
    """`(outputs, fastpath data or None, drop)` of a new call traced by the dispatch's miss, the
    data (JAX's own, for the program donate planned) being the entry of the call's signature."""
    try:
      signature, call = self._prepare(args, kwargs, traced)
    except _program.Unplanned:  # run as jax.jit runs it (JAX keeps no C++ entry for such a call)
      with self._fn.gate:
        return self._fn.jit_miss(*args, **kwargs)
    program = signature.runner(call)
    program.check_duplicates(call)
    if program.consumes:
      _calling.consumes(self)
    key, held = self._no_entry.key(call), _binding.held(call.leaves)  # before donation
    with self._fn.gate:
      out = program.miss(args, kwargs, call.leaves)
    if out[1] is None:  # no fastpath data (a replay, host callbacks): no C++ entry either
      self._no_entry.add(key, held, program)
    return out

  # ---- planning --------------------------------------------------------------------------------
  def _prepare(
    self, args, kwargs, traced=None, quick: bool = False
  ) -> tuple[_program.Signature, _binding.Call]:
    """Traces (through jax.jit, unless the miss has) and plans this call; lowers and compiles
    nothing yet. `quick` (`.trace()`, `.lower()`: no plan read yet): a plain call is routed
    before its plan is made (`_jit.quick`); a call or `.plan()`, which reads the plan when it
    compiles, plans at once."""
    traced = self._trace(args, kwargs) if traced is None else self._traced(traced)
    if _compat.is_high(traced.jaxpr):
      raise _program.Unplanned(traced)
    call = self._fn.binding.bind(args, kwargs)
    key = (id(traced.jaxpr), call.key, tuple(map(_binding.meta_key, call.leaves)))
    with self._lock:
      hit = self._prepared.get(key)
      if hit is not None and hit.prepared.traced.jaxpr is traced.jaxpr:
        return hit, call
      prepared = quick and _quick.prepare(self._fn, call, traced)
      prepared = prepared or _signature.prepare(self._fn, call, traced)
      signature = self._prepared[key] = _program.Signature(prepared)
      return signature, call

  def _trace(self, args, kwargs):
    if self._plain_only:  # raises, or answers, as jax.jit does
      return _plain(self).trace(*args, **kwargs)
    with self._fn.gate:  # tracing lowers nothing: JAX's unusable-donation warning is not due
      return self._traced(self._fn.jitted.trace(*args, **kwargs))

  def _traced(self, traced):
    if self._traces_plain:
      self._gated.count_trace(traced.jaxpr)
    else:
      remember_donate_jit(traced.jaxpr)
    return traced

  # ---- public ----------------------------------------------------------------------------------
  def plan(self, *args, **kwargs) -> _donation_plan.DonationPlan:
    """Traces, plans and compiles for these arguments; executes and consumes nothing.

    When an aliased leaf has at least `copy_threshold` bytes, `plan.profile` is the program's
    `donate.MemoryProfile`, with what the donations saved at the peak (one more compile, without
    them); a leaf whose donation left the peak high says so in its reason: a temporary of about
    its size live beside it, or a peak not lower than without the donations."""
    try:
      signature, call = self._prepare(args, kwargs)
    except _program.Unplanned as e:
      raise _program.unplanned_error(self._fn.name, e.traced) from None
    return signature.compile(call, with_profile=True).plan

  def trace(self, *args, **kwargs) -> _stages.Traced:
    """Traces for these arguments; a `jax.stages.Traced` with the plan (`.plan`)."""
    try:
      return _stages.Traced(*self._prepare(args, kwargs, quick=True))
    except _program.Unplanned as e:  # hijax types: JAX's own
      return e.traced

  def lower(self, *args, **kwargs) -> _stages.Lowered:
    """Lowers for these arguments (ahead of time), with the plan's aliases and donors; compiles
    nothing (`.compile()` does, and checks the aliases XLA made)."""
    return self.trace(*args, **kwargs).lower()

  def eval_shape(self, *args, **kwargs):
    with self._fn.gate:
      return self._fn.jitted.eval_shape(*args, **kwargs)

  def into(self, out) -> _into.Into:
    """Writes the results into preallocated buffers `out`; see `donate.jit`."""
    _into.check_buffers(out)
    with self._lock:
      if self._into is None:
        self._into = PjitFunction(
          _into.with_out(self._fn.fun, self._fn.name), self._fn.options.with_leading_argument()
        )
      return _into.Into(self._into, out)

  def clear_cache(self):
    """Forgets every planned signature and clears the underlying `jax.jit` caches."""
    self._forget()
    self._fn.jitted.clear_cache()

  def _forget(self):
    with self._lock:
      for signature in self._prepared.values():
        if signature.prepared.inner is not None:
          signature.prepared.inner.jitted.clear_cache()
      self._prepared.clear()
      self._no_entry.clear()
      if not self._plain_only:
        _compat.clear_cpp_cache(self._dispatch)

  def _cache_size(self) -> int:
    """How many compiled signatures this function holds (`jax.jit`'s `_cache_size()`)."""
    with self._lock:
      return len({id(s) for s in self._prepared.values() if s.compiled})

  def __get__(self, obj, objtype=None):
    if obj is None:
      return self
    return types.MethodType(self, obj)  # as jax.jit's functions bind to instances

  def __repr__(self) -> str:
    return repr(_plain(self))  # as jax.jit's own repr, which handles every odd function

  def __getstate__(self):
    return _plain(self).__getstate__()

  def __reduce__(self):
    return (_restore, (self._fn.fun, self._fn.options.keywords()))


class PjitFunction(JitWrapped):
  """The type of a `donate.jit` function, named as `jax.jit`'s (`jaxlib`'s `PjitFunction`): tools
  that recognise a jitted function by its type's name (chex's `assert_max_traces`, which must be
  applied inside the jit, and `fake_pmap` through `is_traceable`) recognise this one, which
  traces, caches and lowers as `jax.jit`'s does. Its members are `JitWrapped`'s."""

  __slots__ = ()
  __signature__ = _Signature()  # the function's, as `jax.jit`'s functions carry it


_eval_shape.install(JitWrapped)  # jax.eval_shape(f) of a donate.jit f: f's own out_info


def _nested(wrapped: JitWrapped, args, kwargs):
  """Called inside another trace: run as `jax.jit` would, and record the donation as
  `donate_buffer` markers so an enclosing `donate.jit` honours it. A function made under the
  global patch (`jax.jit = donate.jit`; `Options.patched`) may be a framework's `jax.jit`, whose
  donation `jax.jit` ignores inside another trace: it runs as that `jax.jit`, and an enclosing
  `donate.jit` lists its donation as an inner `jax.jit`'s (adopted with `adopt_inner_donation`)."""
  fn = wrapped._fn
  if fn.options.patched:
    return _plain(wrapped)(*args, **kwargs)
  binding = fn.binding
  call = binding.bind(args, kwargs)
  donated = binding.donated_leaves(call)
  if donated:
    leaves = [
      donate_buffer_p.bind(x) if i in donated and isinstance(x, jax.core.Tracer) else x
      for i, x in enumerate(call.leaves)
    ]
    args, kwargs = binding.rebuild(call, args, kwargs, leaves)
  with fn.gate:
    return fn.jitted(*args, **kwargs)


def _gated_jit(wrapped: JitWrapped, fun, options: _options.Options):
  """`(jitted, plain)`: the `jax.jit` donate traces, lowers and runs through, and whether it is
  `jax.jit(fun)` itself (`_plain`, for a function that donates no argument; else a `jax.jit` of
  the gated stand-in). The plain one shares JAX's trace cache with `jax.jit(fun)` and
  `jax.eval_shape(fun)`, as every `jax.jit` of a function does: there is no donation whose warning
  a shared lowering could lose, nor one a shared jaxpr could lend to the user's own
  `jax.jit(fun, donate_argnums=...)` (`remember_donate_jit`). donate's own dispatch still runs
  only what donate planned. Only the one needed is built (`_plain` is otherwise built where it
  is read); either validates the keywords as `jax.jit(fun)` does (the stand-in has the
  function's signature)."""
  asked = any(v is not None and v != () for v in (options.donate_argnums, options.donate_argnames))
  jitted = _jit_of(wrapped._gated if asked else fun, options)
  if asked and any(_compat.jit_argnums(jitted)[2:]):
    return jitted, False
  # (asked for names that resolve to no argument, as of a function of **kwargs: the plain one)
  wrapped._plain_jit = _jit_of(fun, options) if asked else jitted
  return wrapped._plain_jit, True


def _plain(wrapped: JitWrapped):
  """`jax.jit(fun)` with the user's keywords, built where it is first read (a function that
  donates nothing runs through it; `repr` and pickling read it)."""
  if wrapped._plain_jit is None:
    wrapped._plain_jit = _jit_of(wrapped._fn.fun, wrapped._fn.options)
  return wrapped._plain_jit


def _jit_of(fun, options: _options.Options):
  """`jax.jit` of `fun` with the user's keywords, donated arguments included."""
  argnums = {"donate_argnums": options.donate_argnums, "donate_argnames": options.donate_argnames}
  return _compat.jax_jit(fun, **argnums, **options.jit_kwargs)


def _restore(fun, kwargs):
  """Unpickles a `donate.jit` function: the same function with the same keywords."""
  return jit(fun, **kwargs)


def _patched() -> bool:
  """Whether `jax.jit` is `donate.jit` now (the global patch, also through a partial of it)."""
  return _through_partials(getattr(jax, "jit", None)) is jit


def _through_partials(fun):
  """The function a (nested) `functools.partial` calls."""
  while isinstance(fun, functools.partial):
    fun = fun.func
  return fun


def _fun_name(fun) -> str:
  """The function's name for messages, through partials; never fails (a repr may raise)."""
  fun = _through_partials(fun)
  name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None)
  return name if isinstance(name, str) else type(fun).__name__


@overload
def jit(
  fun: Callable,
  /,
  *,
  donate_argnums=None,
  donate_argnames=None,
  strict: bool | str | tuple[str, ...] = False,
  adopt_inner_donation: bool = False,
  copy_threshold: int = 65536,
  symmetric_placement: bool = True,
  **jax_jit_kwargs,
) -> JitWrapped: ...


@overload
def jit(
  fun: None = None,
  /,
  *,
  donate_argnums=None,
  donate_argnames=None,
  strict: bool | str | tuple[str, ...] = False,
  adopt_inner_donation: bool = False,
  copy_threshold: int = 65536,
  symmetric_placement: bool = True,
  **jax_jit_kwargs,
) -> Callable[[Callable], JitWrapped]: ...


def jit(
  fun: Callable | None = None,
  /,
  *,
  donate_argnums=None,
  donate_argnames=None,
  strict: bool | str | tuple[str, ...] = False,
  adopt_inner_donation: bool = False,
  copy_threshold: int = 65536,
  symmetric_placement: bool = True,
  **jax_jit_kwargs,
):
  """A drop-in for `jax.jit` that plans donation per leaf and explains itself.

  Usable as `@donate.jit`, `@donate.jit(...)` and `donate.jit(f, ...)`. Every `jax.jit` keyword
  passes through (static arguments, shardings, `keep_unused`, `compiler_options`, ...) and is
  validated by `jax.jit` itself; whatever `jax.jit` accepts, this accepts, with the same results,
  exception types and warning texts. `donate_argnums`/`donate_argnames` donate whole pytrees,
  whether the argument is passed by position or by keyword; leaves that are not device buffers
  (numpy arrays, Python scalars) are not consumed, and inputs the function never reads stay alive,
  as in `jax.jit`. `donate.donate_buffer` and `donate.alias` inside the function donate more.
  Outputs are paired with the donated input they are computed from in place, not first come,
  first served, where that changes a buffer of at least `copy_threshold` bytes (smaller ones
  pair as `jax.jit` pairs them). The program keeps the user's argument and result order (the
  pairs are set on the lowered module), so its staged objects and executables work wherever
  `jax.jit`'s do (`serialize_executable`, `jax.export`, the persistent cache). The returned
  function also has `.plan(...)` (plans and compiles, runs nothing), `.trace(...)`, `.lower(...)`,
  `.eval_shape(...)` and `.into(out)(...)`.

  Args:
    fun: the function to compile.
    donate_argnums: positions of arguments whose buffers the call may consume.
    donate_argnames: names of arguments whose buffers the call may consume.
    strict: `True` (or "unusable"): raise `DonationError` (before anything is consumed) when a
      requested donation cannot be used, or names a leaf that is not a device buffer, instead of
      warning `UnusableDonationWarning` once per compile. "copies": raise when XLA copies a
      donated buffer or a loop carry of at least `copy_threshold` bytes anyway (see
      `Compiled.copies()`), or when such an aliased leaf leaves the peak high (a temporary of
      about its size beside it, or a peak not lower than without the donations; see
      `plan()`). `("unusable", "copies")`: both.
    adopt_inner_donation: also donate outer inputs that a plain inner
      `jax.jit(..., donate_argnums=...)` (or `equinox.filter_jit(donate=...)`) donates. Off by
      default: like `jax.jit`, the outer call then consumes only what it was asked to; the plan
      lists the inner donation as ignored. (An inner `donate.jit` is honoured, but for one
      made while `jax.jit` is `donate.jit`: that one may be a framework's `jax.jit`, and counts
      as one.)
    copy_threshold: the smallest copy, in bytes, that the plan's "copies XLA added" section and
      `Compiled.copies()` report; a pairing that differs from `jax.jit`'s only in smaller
      buffers is not worth another program, and runs as `jax.jit` pairs it.
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
  >>> a, b = jnp.zeros(2**16), jnp.zeros(2**16)
  >>> pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  >>> x, y = step(a, b)
  >>> x.unsafe_buffer_pointer() == pb, y.unsafe_buffer_pointer() == pa, a.is_deleted()
  (True, True, True)
  """

  def wrap(f: Callable) -> JitWrapped:  # one Options per function, as jit(f, ...) makes
    options = (donate_argnums, donate_argnames, strict, adopt_inner_donation, copy_threshold)
    kwargs = dict(jax_jit_kwargs)
    return PjitFunction(f, _options.Options(*options, symmetric_placement, kwargs, _patched()))

  return wrap if fun is None else wrap(fun)
