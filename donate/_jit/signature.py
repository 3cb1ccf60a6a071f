"""One planned call signature of a `donate.jit` function: trace -> plan -> lower -> compile -> run.

`prepare` plans a traced signature (`_pairing.make_plan`) and decides how it runs:

* the plan equals what `jax.jit` does by itself (the common case: the same pairs, no in-function
  annotations): the gate, a `jax.jit` of the user's function, lowers, compiles and runs it, so the
  call, its staged objects, its caches and its errors are `jax.jit`'s own (`Prepared.native`);
* donate does better (dataflow pairing where first come, first served would copy, `donate_buffer`
  and `alias` anywhere inside, preallocated outputs): the gate's own lowering, with `main`'s
  `tf.aliasing_output` and `jax.buffer_donor` attributes set to the plan's
  (`Prepared.realiased`; `_compat.lowered_with_aliases`), is compiled and run. Arguments and
  results keep the user's order and pytrees, so the staged objects and the executable are
  `jax.jit`'s own in every other respect (serialization, `out_info`, shardings, export, caches);
* values marked for symmetric memory (a rewritten jaxpr) or a GPU target's placement options: an
  inner `jax.jit(replay, donate_argnums=plan.layout.donated)` over the flat leaves replays the
  marked jaxpr, its results in the user's order, with the plan's aliases set the same way
  (`Prepared.inner`).

`Prepared.compile` reads the compiled module's `input_output_alias`, memory figures, copies and
placements into the plan (`_compiled.realize`) before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import jax
from jax import tree_util

from donate import _symm
from donate._base import compat as _compat
from donate._base import errors as _errors
from donate._base import text as _text
from donate._base.primitives import remember_donate_jit
from donate._base.text import format_bytes
from donate._jit import binding as _binding
from donate._jit import compiled as _compiled
from donate._jit import gate as _gate
from donate._jit import options as _options
from donate._jit import route as _route
from donate._plan import dataflow as _dataflow
from donate._plan import donation_plan as _donation_plan
from donate._plan import pairing as _pairing
from donate._plan.decision_types import Action, Cause, Request
from donate._xla import copies as _copies


@dataclasses.dataclass(frozen=True, eq=False)
class Function:
  """What every signature of one `donate.jit` function shares (no reference back to it)."""

  fun: Callable  # the user's function
  name: str  # its name in messages
  jitted: Callable  # the gate: jax.jit of the gated stand-in, with the user's keywords
  gate: _gate.Gate
  binding: _binding.Binding
  options: _options.Options


@dataclasses.dataclass(eq=False)
class Inner:
  """The replay of one signature's marked program: a `jax.jit` over the flat leaves."""

  jitted: Callable
  out_tree: Any  # results come in the user's order

  def outputs(self, flat) -> Any:
    return tree_util.tree_unflatten(self.out_tree, flat)

  def __call__(self, leaves):
    return self.outputs(self.jitted(*leaves))


@dataclasses.dataclass(eq=False)
class Prepared:
  """One planned signature: its trace, plan, how it runs, and its staged objects once made.

  It holds no reference back to its `JitWrapped` (no cycle), so dropping the function frees
  everything at once, as dropping a `jax.jit` function does.
  """

  fn: Function
  call: _binding.Call  # the call's structure (its leaves are not kept)
  traced: Any  # jax.stages.Traced of the gate
  plan: _donation_plan.DonationPlan
  native: bool  # True: jax.jit's lowering of the gate's trace (its own plan, or `realiased`)
  inner: Inner | None  # the replay over the flat leaves, when `native` is False
  realiased: bool = False  # the gate's lowering with the plan's aliases, run as compiled
  first_come: Callable[[str], Any] | None = None  # the first-come plan, given why it is used
  lowered: Any = None  # jax.stages.Lowered
  compiled: Any = None  # jax.stages.Compiled
  in_shardings: tuple = ()  # the traced input shardings, per leaf (None where not known)
  comm: tuple = ()  # the values marked for symmetric memory (`_symm.comm_buffers`)
  placement: Any = None  # the `_symm` placement policy, on GPU targets with marked values
  in_paths: list | None = None  # the compiled module's parameters as the user's leaf paths
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

  @property
  def donated(self) -> frozenset[int]:
    """The leaves the program donates (as `jax.jit`'s `args_info[...].donated` reports them)."""
    if self.native and not self.realiased:
      return frozenset(self.fn.binding.donated_leaves(self.call))
    return frozenset(self.plan.layout.donated)

  def run(self, args, kwargs, leaves, cached: bool = False):
    """Runs the call (`cached`: found by its pytree structure alone, so arguments of other
    shapes, dtypes or shardings raise `_gate.Replan` and take the slow path)."""
    if self.realiased:  # the compiled program with the plan's aliases, called as jax.jit's AOT
      args, kwargs = self.fn.binding.dynamic(args, kwargs)
      if not cached:
        return self.compiled(*args, **kwargs)
      try:
        return self.compiled(*args, **kwargs)
      except (TypeError, ValueError):  # another signature: JAX checks before running anything
        raise _gate.Replan() from None
    if self.native or self.inner is None:  # inner is None exactly when native
      return self.fn.jitted(*args, **kwargs)
    return self.inner(leaves)

  def lower(self, call: _binding.Call, **lower_kwargs):
    """The jax.stages.Lowered of this signature; warns (or raises) for unusable donations."""
    with self.lock:
      if self.lowered is not None and not lower_kwargs:
        return self.lowered

      def lower():
        if self.native:
          traced = self.traced
        else:
          traced = self.inner.jitted.trace(*call.leaves)
          remember_donate_jit(traced.jaxpr)
        lowered = traced.lower(**lower_kwargs)
        if self.native and not self.realiased:
          return lowered
        return self.with_plan_aliases(lowered, _compat.traced_num_consts(traced))

      lowered = self.checked_lowering(lower, warn=not lower_kwargs)
      if not lower_kwargs:
        self.lowered = lowered
      return lowered

  def with_plan_aliases(self, jax_lowered, n_traced: int):
    """`jax_lowered` (the gate's lowering, the inner replay's, or one for `jax.export`) whose
    `main` aliases and donates exactly what the plan says, results in the user's order.

    The leaves the plan decides are set; others (host values, refs) keep what `jax.jit`'s
    lowering gave them. An output that reuses a buffer over several devices is given that
    buffer's sharding when the lowering left it to propagation (`jax.jit` makes an alias only
    for an output whose sharding is stated)."""
    plan = self.plan
    managed = {i for i, d in enumerate(plan.decisions) if d.requested and d.action in _PLANNED}
    donors = {i for i, d in enumerate(plan.decisions) if d.action == Action.DONOR}
    pairs = plan.pairs()
    sh = self.in_shardings
    pinned = {i for i in pairs if sh[i] is not None and _route.num_devices(sh[i]) > 1}
    return _compat.lowered_with_aliases(jax_lowered, n_traced, managed, pairs, donors, pinned)

  def checked_lowering(self, lower: Callable[[], Any], warn: bool = True):
    """`lower()` under the gate, JAX's own unusable-donation warning silenced; before it, an
    explicit alias that cannot hold (or, in strict mode, any unusable donation) raises, and after
    it the plan's per-leaf warning is given (`warn`)."""
    explicit = [d for d in self.plan.unusable if d.request == Request.ALIAS]
    if explicit or (self.fn.options.strict_unusable and self.plan.unusable):
      raise _errors.DonationError("donate: " + self.plan.explain_unusable(explicit or None))
    with self.fn.gate, warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=_errors.JAX_UNUSABLE_PREFIX)
      lowered = lower()
    if warn and self.plan.unusable:
      _warn_unusable(self.plan.explain_unusable())
    return lowered

  def compile(
    self,
    call: _binding.Call,
    compiler_options=None,
    device_assignment=None,
    with_copies: bool = True,
    with_profile: bool = False,
  ):
    """`(compiled, plan)`: compiles and folds the compiled aliases into the plan (the copies XLA
    added too, unless `with_copies=False` and the function is not strict about them; the memory
    profile, which names the donations that left the peak high, with `with_profile` or
    `strict="copies"`: `_compiled.with_profile` reads the compiled program and compiles it once
    more without its donations to measure what they saved)."""
    lowered = self.lower(call)
    with_copies = with_copies or self.fn.options.strict_copies
    with_profile = with_profile or self.fn.options.strict_copies
    with self.lock:
      if self.compiled is not None and compiler_options is None and device_assignment is None:
        if with_copies and self.plan.copies is None:
          self.plan = _compiled.details(self, self.compiled, self.plan)
        if with_profile and self.plan.profile is None:
          self.plan = _compiled.with_profile(
            self, lowered, self.plan, call=call, compiled=self.compiled
          )
        return self.compiled, self.plan
      given = {"compiler_options": compiler_options, "device_assignment": device_assignment}
      kwargs = {k: v for k, v in given.items() if v is not None}
      compiled = lowered.compile(**kwargs)
      options = self.fn.options
      copies = with_copies or bool(kwargs)
      plan = _compiled.realize(self, lowered, compiled, options.copy_threshold, copies)
      if self.realiased and not kwargs and self.compiled is None:
        lowered, compiled, plan = _lower_peak_of_two(self, lowered, compiled, plan, with_copies)
      explicit = [d for d in plan.unusable if d.request == Request.ALIAS]
      if explicit or (options.strict_unusable and len(plan.unusable) > len(self.plan.unusable)):
        raise _errors.DonationError("donate: " + plan.explain_unusable(explicit or None))
      pairs = zip(plan.decisions, self.plan.decisions)
      late = [d for d, was in pairs if d.action == Action.UNUSABLE and was.action == Action.ALIASED]
      if late and self.compiled is None:
        # Planned aliases the compiled program does not have: said once per compile, as lower
        # says the unusable donations it foresaw (a donor XLA did not reuse is silent, as in
        # jax.jit).
        _warn_unusable(plan.explain_unusable(late))
      if with_profile:
        plan = _compiled.with_profile(self, lowered, plan, compiler_options, call, compiled)
      copied: list[str] = []
      if options.strict_copies:
        name = self.fn.name
        copied = _copies.strict_problems(plan.copies, name) + _compiled.peak_problems(plan, name)
      if copied:
        raise _errors.DonationError("\n".join(copied))
      if plan.placements is not None:
        plan.placements.check(strict=options.strict_unusable)
      if not kwargs:
        self.compiled, self.plan = compiled, plan
      return compiled, plan

  def check_duplicates(self, call: _binding.Call, plan: _donation_plan.DonationPlan | None = None):
    """The same buffer twice where one is donated: raise before dispatch, naming both leaves."""
    plan = plan or self.plan
    consumed = {i for i, d in enumerate(plan.decisions) if d.consumed}
    if not consumed:
      return
    seen: dict[int, int] = {}
    for i, x in enumerate(call.leaves):
      if isinstance(x, jax.Array):
        j = seen.setdefault(id(x), i)
        if j != i and (i in consumed or j in consumed):
          d = plan.decisions
          problem = _errors.message(
            f"the same array is passed twice to {self.fn.name}, once as {d[j].path} and "
            f"once as {d[i].path}, and at least one is donated",
            expected="distinct buffers",
            got="one buffer in two places",
            fix="pass a copy (x.copy()) in one place or do not donate it",
          )
          raise _errors.DonationRuntimeError(problem)


def _lower_peak_of_two(prep: Prepared, lowered, compiled, plan, with_copies: bool):
  """Where XLA copies a donated buffer of the re-paired program anyway, `jax.jit`'s own
  first-come program is compiled too and the one with the lower peak kept (once per
  signature); the plan says which, and why."""
  threshold = prep.fn.options.copy_threshold
  copies = (
    plan.copies if plan.copies is not None else _compiled.copies_of(prep, compiled, threshold)
  )
  consumed = {d.path for d in plan.decisions if d.consumed}
  copied = sorted({c.input_path for c in copies if c.input_path in consumed})
  if not copied or prep.first_come is None:
    return lowered, compiled, plan
  with prep.fn.gate, warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=_errors.JAX_UNUSABLE_PREFIX)
    theirs_lowered = prep.traced.lower()
  theirs = theirs_lowered.compile()
  ours_peak = _donation_plan.MemoryStats.from_compiled(compiled)
  theirs_peak = _donation_plan.MemoryStats.from_compiled(theirs)
  if ours_peak is None or theirs_peak is None:
    return lowered, compiled, plan
  mine, fcfs = format_bytes(ours_peak.peak), format_bytes(theirs_peak.peak)
  why = f"XLA copies {', '.join(copied)} in the re-paired program: peak {mine}, first come, "
  why += f"first served {fcfs}"
  if ours_peak.peak < theirs_peak.peak:
    note = why + "; the re-paired program is kept"
    return lowered, compiled, dataclasses.replace(plan, notes=plan.notes + (note,))
  prep.plan = prep.first_come(why + "; jax.jit's own is kept")
  prep.realiased, prep.lowered = False, theirs_lowered
  realized = _compiled.realize(prep, theirs_lowered, theirs, threshold, with_copies)
  return theirs_lowered, theirs, realized


def prepare(fn: Function, call: _binding.Call, traced) -> Prepared:
  """Plans one traced signature and builds what runs it; lowers and compiles nothing."""
  with _collector_paused():
    return _prepare(fn, call, traced)


def _warn_unusable(text: str) -> None:
  warnings.warn(text, _errors.UnusableDonationWarning, stacklevel=_user_stacklevel())


@contextlib.contextmanager
def _collector_paused():
  """Python's cyclic garbage collector paused while a signature is planned.

  Planning makes a few objects per leaf that live until it ends (a wide pytree's thousands): the
  collections they would trigger scan JAX's whole heap (full collections take a third of
  `jax.jit`'s own `lower()` at 10,000 leaves) and move them to older generations, due for more.
  Planning makes no cyclic garbage; reference counting frees it as before. A collector already
  off is left off.
  """
  if not gc.isenabled():
    yield
    return
  gc.disable()
  try:
    yield
  finally:
    gc.enable()


def _prepare(fn: Function, call: _binding.Call, traced) -> Prepared:
  n_consts = _compat.traced_num_consts(traced)
  closed = traced.jaxpr
  marked = _symm.mark_required(closed)
  flow = _dataflow.analyze(marked, skip=n_consts)
  leaves, outputs, in_sh, out_sh, has_layouts = _arguments(fn, call, traced)
  requested = fn.binding.donated_leaves(call)
  xla_decides = _route.xla_decides(leaves, outputs)
  plan, comm = _make_plan(fn, leaves, outputs, requested, flow, marked, xla_decides)
  policy, gpu_options = None, {}
  if comm:  # values marked for symmetric memory: placed when the program compiles for GPUs
    platform = _symm.target_platform(
      [leaf.sharding_obj for leaf in leaves] + [o.sharding_obj for o in outputs],
      jax.default_backend(),
    )
    policy = _symm.placement_policy(platform, comm, enabled=fn.options.symmetric_placement)
    gpu_options = dict(policy.options)
  if gpu_options and policy is not None:  # gpu_options come from the policy
    plan = dataclasses.replace(plan, notes=plan.notes + policy.placed_too)
  replay = marked is not closed or bool(gpu_options)
  replay = replay or (xla_decides and _route.refs_beside_donors(plan, leaves, closed))
  native = not replay and _route.is_native(
    fn.options, plan, leaves, outputs, requested, flow, xla_decides
  )
  why = _route.first_come_only(
    fn.options, plan, leaves, requested, flow, has_layouts, n_consts, replay, native
  )
  if why == _route.SAME_PAIRS:
    native = True
  elif why:
    plan, comm = _make_plan(
      fn, leaves, outputs, requested, flow, marked, xla_decides, first_come=why
    )
    native, replay = True, False
  inner = _inner(fn, marked, plan, traced, leaves, in_sh, out_sh, gpu_options) if replay else None
  structure = dataclasses.replace(call, leaves=[None] * len(call.leaves))
  realiased = not (native or replay)

  def first_come(why: str):
    return _make_plan(fn, leaves, outputs, requested, flow, marked, xla_decides, first_come=why)[0]

  return Prepared(
    fn,
    structure,
    traced,
    plan,
    not replay,
    inner,
    realiased=realiased,
    first_come=first_come if realiased else None,
    in_shardings=tuple(in_sh),
    comm=tuple(comm),
    placement=policy if gpu_options else None,
  )


def _arguments(fn: Function, call: _binding.Call, traced):
  """The argument leaves and outputs as the planner sees them, and the traced shardings."""
  paths = fn.binding.paths(call)
  leaves = _binding.leaf_infos(paths, call.leaves)
  in_sh, out_sh, has_layouts = _compat.traced_flat_shardings(traced)
  leaves = [
    dataclasses.replace(leaf, sharding_obj=s)
    if leaf.sharding_obj is None and s is not None
    else leaf
    for leaf, s in zip(leaves, in_sh)
  ]
  # The output tree rebuilt from the traced avals (as JAX rebuilds it from tracers): a pytree
  # class that checks its children when built sees arrays, never stand-ins.
  out_tree = tree_util.tree_unflatten(traced.out_tree, list(traced.jaxpr.out_avals))
  flat = tree_util.tree_flatten_with_path(out_tree)[0]
  out_paths = ["out" + "".join(map(str, kp)) for kp, _ in flat]
  # (shape, dtype) -> the output's facts, read once per call
  facts: dict[tuple, tuple[tuple[int, ...], str, int]] = {}
  outputs = []
  for p, a, s in zip(out_paths, traced.jaxpr.out_avals, out_sh):
    if not hasattr(a, "shape"):
      outputs.append(_donation_plan.OutputInfo(p, (), type(a).__name__, 0))
      continue
    key = (a.shape, a.dtype)
    fact = facts.get(key)
    if fact is None:
      fact = facts[key] = (tuple(a.shape), _text.dtype_name(a.dtype), _binding.aval_nbytes(a))
    outputs.append(_donation_plan.OutputInfo(p, *fact, s))
  return leaves, outputs, in_sh, out_sh, has_layouts


def _make_plan(
  fn: Function, leaves, outputs, requested, flow, marked, xla_decides: bool, first_come: str = ""
):
  """The donation plan, with the symmetric-memory notes; `strict` rejects host leaves here.

  `first_come` (why only `jax.jit`'s own lowering can run this call): pair as `jax.jit` does.
  """
  options = fn.options
  plan = _pairing.make_plan(
    fn.name,
    leaves,
    outputs,
    requested,
    flow,
    keep_unused=options.keep_unused,
    adopt_inner=options.adopt_inner,
    xla_decides=xla_decides,
    first_come=first_come,
    disabled=bool(jax.config.jax_debug_nans),  # type: ignore[attr-defined]  # set at run time
  )
  comm = _symm.comm_buffers(marked)
  if comm:
    plan = dataclasses.replace(
      plan,
      notes=plan.notes + tuple(_symm.comm_buffer_report(comm)),
      collective_memory_bytes=_symm.collective_memory_bytes(comm),
    )
  if options.strict_unusable and any(
    d.cause == Cause.NOT_A_DEVICE_BUFFER for d in plan.decisions if d.requested
  ):
    raise _errors.DonationError(plan.explain_host())
  disabled = options.strict_unusable and [
    d.path for d in plan.decisions if d.requested and d.cause == Cause.JAX_DEBUG_NANS
  ]
  if disabled:
    raise _errors.DonationError(
      _errors.message(
        f"{fn.name}: strict mode, and JAX donates nothing while jax_debug_nans is on",
        expected="donation of " + ", ".join(disabled),
        got="jax_debug_nans=True",
        fix="turn jax_debug_nans off to donate, or drop strict=True while debugging NaNs",
      )
    )
  return plan, comm


# The actions of the leaves whose parameter attributes the plan sets (`with_plan_aliases`).
_PLANNED = (Action.ALIASED, Action.DONOR, Action.UNUSABLE, Action.UNUSED)


def _inner(fn: Function, closed, plan, traced, leaves, in_sh, out_sh, gpu_options) -> Inner:
  """The replay of the (marked) traced jaxpr over the flat leaves, results in the user's order;
  its lowering gets the plan's aliases (`Prepared.with_plan_aliases`)."""
  out_sh = _route.pinned_out_shardings(plan, leaves, out_sh)
  gate, jaxpr, consts = fn.gate, closed.jaxpr, closed.consts

  def replay(*leaves):
    if not gate.is_open:
      raise _gate.Replan()
    return list(jax.core.eval_jaxpr(jaxpr, consts, *leaves))

  replay.__name__ = replay.__qualname__ = getattr(fn.fun, "__name__", "fun")
  passed = ("keep_unused", "compiler_options", "inline")
  kwargs = {k: v for k, v in fn.options.jit_kwargs.items() if k in passed}
  if gpu_options:
    kwargs["compiler_options"] = {**gpu_options, **(kwargs.get("compiler_options") or {})}
  if any(s is not None for s in in_sh):
    kwargs["in_shardings"] = tuple(in_sh)
  if any(s is not None for s in out_sh):
    kwargs["out_shardings"] = list(out_sh)
  jitted = _compat.jax_jit(replay, donate_argnums=plan.layout.donated, **kwargs)
  return Inner(jitted, traced.out_tree)


def _user_stacklevel() -> int:
  """The `warnings.warn` stacklevel of the first caller outside this package and JAX."""
  hidden = (_compat.PACKAGE_DIR, os.path.dirname(os.path.abspath(jax.__file__)) + os.sep)
  frame: Any = sys._getframe(1)  # a FrameType, then None beyond the outermost
  level = 1
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(hidden):
    frame, level = frame.f_back, level + 1
  return level
