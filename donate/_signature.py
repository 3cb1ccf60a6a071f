"""One planned call signature of a `donate.jit` function: trace -> plan -> lower -> compile -> run.

`prepare` plans a traced signature (`_pairing.make_plan`) and decides how it runs:

* the plan equals what `jax.jit` does by itself (the common case: the same pairs, no in-function
  annotations): the gate, a `jax.jit` of the user's function, lowers, compiles and runs it, so the
  call, its staged objects, its caches and its errors are `jax.jit`'s own (`Prepared.native`);
* donate does better (dataflow pairing where first come, first served would copy, `donate_buffer`
  and `alias` anywhere inside, preallocated outputs, symmetric-memory marks): an inner
  `jax.jit(replay, donate_argnums=plan.layout.donated)` over the flat leaves replays the traced
  jaxpr with its outputs reordered, so `jax.jit`'s first-come, first-served pairing makes exactly
  the planned `tf.aliasing_output` attributes (`Prepared.inner`).

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
from typing import Any, Callable

import jax
from jax import tree_util

from donate import _binding
from donate import _compiled
from donate import _copies
from donate import _dataflow
from donate import _errors
from donate import _gate
from donate import _options
from donate import _pairing
from donate import _donation_plan
from donate import _symm
from donate import _compat
from donate._primitives import remember_donate_jit


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
  fn: Function
  call: _binding.Call  # the call's structure (its leaves are not kept)
  traced: Any  # jax.stages.Traced of the gate
  plan: _donation_plan.DonationPlan
  native: bool  # True: the gate runs it (jax.jit's own plan); False: the inner jit does
  inner: Inner | None
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
      return frozenset(self.fn.binding.donated_leaves(self.call))
    return frozenset(self.plan.layout.donated)

  def run(self, args, kwargs, leaves):
    if self.native:
      return self.fn.jitted(*args, **kwargs)
    return self.inner(leaves)

  def lower(self, call: _binding.Call, **lower_kwargs):
    """The jax.stages.Lowered of this signature; warns (or raises) for unusable donations."""
    with self.lock:
      if self.lowered is not None and not lower_kwargs:
        return self.lowered

      def lower():
        if self.native:
          return self.traced.lower(**lower_kwargs)
        inner_traced = self.inner.jitted.trace(*call.leaves)
        remember_donate_jit(inner_traced.jaxpr)
        return inner_traced.lower(**lower_kwargs)

      lowered = self.checked_lowering(lower, warn=not lower_kwargs)
      if not lower_kwargs:
        self.lowered = lowered
      return lowered

  def checked_lowering(self, lower: Callable[[], Any], warn: bool = True):
    """`lower()` under the gate, JAX's own unusable-donation warning silenced; before it, an
    explicit alias that cannot hold (or, in strict mode, any unusable donation) raises, and after
    it the plan's per-leaf warning is given (`warn`)."""
    explicit = [d for d in self.plan.unusable if d.source.startswith("alias at ")]
    if explicit or (self.fn.options.strict_unusable and self.plan.unusable):
      raise _errors.DonationError("donate: " + self.plan.explain_unusable(explicit or None))
    with self.fn.gate, warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=_errors.JAX_UNUSABLE_PREFIX)
      lowered = lower()
    if warn and self.plan.unusable:
      warnings.warn(self.plan.explain_unusable(), _errors.UnusableDonationWarning,
                    stacklevel=_user_stacklevel())
    return lowered

  def compile(self, call: _binding.Call, compiler_options=None, device_assignment=None,
              with_copies: bool = True, with_profile: bool = False):
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
          self.plan = _compiled.with_profile(self, lowered, self.plan, call=call,
                                             compiled=self.compiled)
        return self.compiled, self.plan
      kwargs = {}
      if compiler_options is not None:
        kwargs["compiler_options"] = compiler_options
      if device_assignment is not None:
        kwargs["device_assignment"] = device_assignment
      compiled = lowered.compile(**kwargs)
      options = self.fn.options
      plan = _compiled.realize(self, lowered, compiled, options.copy_threshold,
                               with_copies or bool(kwargs))
      explicit = [d for d in plan.unusable if d.source.startswith("alias at ")]
      if explicit or (options.strict_unusable and len(plan.unusable) > len(self.plan.unusable)):
        raise _errors.DonationError("donate: " + plan.explain_unusable(explicit or None))
      late = [d for d, was in zip(plan.decisions, self.plan.decisions)
              if d.action == _donation_plan.UNUSABLE and was.action == _donation_plan.ALIASED]
      if late and self.compiled is None:
        # Planned aliases the compiled program does not have: said once per compile, as lower
        # says the unusable donations it foresaw (a donor XLA did not reuse is silent, as in
        # jax.jit).
        warnings.warn(plan.explain_unusable(late), _errors.UnusableDonationWarning,
                      stacklevel=_user_stacklevel())
      if with_profile:
        plan = _compiled.with_profile(self, lowered, plan, compiler_options, call, compiled)
      copied = (_copies.strict_problems(plan.copies, self.fn.name)
                + _compiled.peak_problems(plan, self.fn.name)) if options.strict_copies else []
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
          raise _errors.DonationRuntimeError(_errors.message(
              f"the same array is passed twice to {self.fn.name}, once as {d[j].path} and "
              f"once as {d[i].path}, and at least one is donated", expected="distinct buffers",
              got="one buffer in two places",
              fix="pass a copy (x.copy()) in one place or do not donate it"))


def prepare(fn: Function, call: _binding.Call, traced) -> Prepared:
  """Plans one traced signature and builds what runs it; lowers and compiles nothing."""
  with _collector_paused():
    return _prepare(fn, call, traced)


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
  xla_decides = _xla_decides(leaves, outputs)
  plan, comm = _make_plan(fn, leaves, outputs, requested, flow, marked, xla_decides)
  policy, gpu_options = None, {}
  if comm:  # values marked for symmetric memory: placed when the program compiles for GPUs
    platform = _symm.target_platform([l.sharding_obj for l in leaves]
                                     + [o.sharding_obj for o in outputs], jax.default_backend())
    policy = _symm.placement_policy(platform, comm, enabled=fn.options.symmetric_placement)
    gpu_options = dict(policy.options)
  if gpu_options:
    plan = dataclasses.replace(plan, notes=plan.notes + policy.placed_too)
  native = (marked is closed and not gpu_options
            and _is_native(fn.options, plan, leaves, outputs, requested, flow, xla_decides)
            and not (xla_decides and _refs_beside_donors(plan, leaves, closed)))
  if (has_layouts or n_consts) and not native:
    # Layouts and hoisted constants: only jax.jit's own lowering handles them, so the plan is
    # jax.jit's first-come, first-served pairing, and says so.
    why = "custom layouts" if has_layouts else "constants hoisted into arguments"
    plan, comm = _make_plan(fn, leaves, outputs, requested, flow, marked, xla_decides,
                            first_come=why)
    native = True
  if not native and any(leaves[i].kind == _donation_plan.REF for i in requested):
    # A ref in donate_argnums: what jax.jit makes of it (a warning, or XLA's own error).
    plan, comm = _make_plan(fn, leaves, outputs, requested, flow, marked, xla_decides,
                            first_come="jax.Refs in donate_argnums")
    native = True
  inner = None if native else _inner(fn, marked, plan, traced, leaves, in_sh, out_sh,
                                     gpu_options)
  structure = dataclasses.replace(call, leaves=[None] * len(call.leaves))
  return Prepared(fn, structure, traced, plan, native, inner, comm=tuple(comm),
                  placement=policy if gpu_options else None)


def _refs_beside_donors(plan, leaves, closed) -> bool:
  """Whether a program in which `jax.jit` offers donated buffers to XLA as donors (`_xla_decides`)
  writes refs back: XLA may pair a donor with a ref's write-back and then rejects its own aliases
  (an internal error on jax 0.10 and 0.12). The re-laid-out call states the shardings of the
  planned pairs instead (`_inner`)."""
  refs = (any(l.kind == _donation_plan.REF for l in leaves)
          or any(isinstance(c, jax.Ref) for c in closed.consts))
  return refs and any(d.consumed for d in plan.decisions)


def _arguments(fn: Function, call: _binding.Call, traced):
  """The argument leaves and outputs as the planner sees them, and the traced shardings."""
  paths = fn.binding.paths(call)
  leaves = _binding.leaf_infos(paths, call.leaves)
  in_sh, out_sh, has_layouts = _compat.traced_flat_shardings(traced)
  leaves = [dataclasses.replace(l, sharding_obj=s) if l.sharding_obj is None and s is not None
            else l for l, s in zip(leaves, in_sh)]
  out_paths = ["out" + "".join(map(str, kp)) for kp, _ in tree_util.tree_flatten_with_path(
      tree_util.tree_unflatten(traced.out_tree, [0] * traced.out_tree.num_leaves))[0]]
  facts: dict[tuple, tuple] = {}  # (shape, dtype) -> the output's facts, read once per call
  outputs = []
  for p, a, s in zip(out_paths, traced.jaxpr.out_avals, out_sh):
    if not hasattr(a, "shape"):
      outputs.append(_donation_plan.OutputInfo(p, (), type(a).__name__, 0))
      continue
    key = (a.shape, a.dtype)
    fact = facts.get(key)
    if fact is None:
      fact = facts[key] = (tuple(a.shape), _donation_plan.dtype_name(a.dtype),
                           _binding.aval_nbytes(a))
    outputs.append(_donation_plan.OutputInfo(p, *fact, s))
  return leaves, outputs, in_sh, out_sh, has_layouts


def _make_plan(fn: Function, leaves, outputs, requested, flow, marked, xla_decides: bool,
               first_come: str = ""):
  """The donation plan, with the symmetric-memory notes; `strict` rejects host leaves here.

  `first_come` (why only `jax.jit`'s own lowering can run this call): pair as `jax.jit` does.
  """
  options = fn.options
  plan = _pairing.make_plan(fn.name, leaves, outputs, requested, flow,
                            keep_unused=options.keep_unused, adopt_inner=options.adopt_inner,
                            xla_decides=xla_decides, first_come=first_come,
                            disabled=JAX_DISABLED if jax.config.jax_debug_nans else "")
  comm = _symm.comm_buffers(marked)
  if comm:
    plan = dataclasses.replace(
        plan, notes=plan.notes + tuple(_symm.comm_buffer_report(comm)),
        collective_memory_bytes=_symm.collective_memory_bytes(comm))
  if options.strict_unusable and any(d.reason.startswith(_donation_plan.NOT_A_DEVICE_BUFFER)
                                     for d in plan.decisions if d.requested):
    raise _errors.DonationError(plan.explain_host())
  disabled = options.strict_unusable and [d.path for d in plan.decisions
                                           if d.requested and d.reason == JAX_DISABLED]
  if disabled:
    raise _errors.DonationError(_errors.message(
        f"{fn.name}: strict mode, and JAX donates nothing while jax_debug_nans is on",
        expected="donation of " + ", ".join(disabled), got="jax_debug_nans=True",
        fix="turn jax_debug_nans off to donate, or drop strict=True while debugging NaNs"))
  return plan, comm


# JAX's jit donates nothing while `jax_debug_nans` is on (it may rerun the function de-optimized,
# which needs the inputs); `jax_debug_infs` does not turn donation off.
JAX_DISABLED = ("not donated: jax_debug_nans is on, and JAX donates nothing then (it may rerun "
                "the function de-optimized on the same inputs)")


def _is_native(options, plan, leaves, outputs, requested, flow, xla_decides: bool) -> bool:
  """Whether `jax.jit`'s own lowering makes the plan: same donated leaves, same pairs."""
  if any(a.kind != "inner_jit" or options.adopt_inner for a in flow.annotations):
    return False
  used = [options.keep_unused or u for u in flow.used]
  consumed = {i for i, d in enumerate(plan.decisions) if d.consumed}
  jax_donated = [] if jax.config.jax_debug_nans else [i for i in requested if used[i]]
  if not consumed <= set(jax_donated):
    return False
  fcfs = _pairing.fcfs_pairs(leaves, outputs, jax_donated)
  planned = plan.pairs()
  device = {i for i, l in enumerate(leaves) if l.kind != _donation_plan.HOST}
  if xla_decides:
    # jax.jit offers every donated input to XLA as a donor and XLA pairs them first come, first
    # served after partitioning: jax.jit's own path makes the plan when its pairs agree with that.
    return all(fcfs.get(i) == j for i, j in planned.items())
  return {i: j for i, j in fcfs.items() if i in device} == planned


def _inner(fn: Function, closed, plan, traced, leaves, in_sh, out_sh, gpu_options) -> Inner:
  layout = plan.layout
  order = layout.out_order
  out_sh = _pinned_out_shardings(plan, leaves, out_sh)
  gate, jaxpr, consts = fn.gate, closed.jaxpr, closed.consts

  def replay(*leaves):
    if not gate.is_open:
      raise _gate.Replan()
    outs = jax.core.eval_jaxpr(jaxpr, consts, *leaves)
    return [outs[j] for j in order] if order is not None else list(outs)

  replay.__name__ = replay.__qualname__ = getattr(fn.fun, "__name__", "fun")
  kwargs = {k: v for k, v in fn.options.jit_kwargs.items()
            if k in ("keep_unused", "compiler_options", "inline")}
  if gpu_options:
    kwargs["compiler_options"] = {**gpu_options, **(kwargs.get("compiler_options") or {})}
  if any(s is not None for s in in_sh):
    kwargs["in_shardings"] = tuple(in_sh)
  if any(s is not None for s in out_sh):
    kwargs["out_shardings"] = [out_sh[j] for j in order] if order is not None else list(out_sh)
  jitted = _compat.jax_jit(replay, donate_argnums=layout.donated, **kwargs)
  return Inner(jitted, order, traced.out_tree)


def _pinned_out_shardings(plan, leaves, out_sh) -> tuple:
  """The output shardings of the re-laid-out call: each planned output that reuses a donated
  buffer over several devices gets that buffer's sharding when none was given.

  `jax.jit` makes an input/output alias only for an output whose sharding is stated; an output
  left to sharding propagation gets its input as a mere donor, which XLA pairs first come, first
  served after partitioning (the full copy dataflow pairing avoids). An output planned into a
  buffer is computed from it in place, so it takes the buffer's sharding.
  """
  out_sh = list(out_sh)
  for i, j in plan.pairs().items():
    s = leaves[i].sharding_obj
    if out_sh[j] is None and s is not None and _num_devices(s) > 1:
      out_sh[j] = s
  return tuple(out_sh)


def _xla_decides(leaves, outputs) -> bool:
  """Whether `jax.jit` offers every donated input to XLA as a donor, to pair after partitioning:
  the program spans several devices and not every output sharding is stated."""
  return any(o.sharding_obj is None for o in outputs) and _multi_device(leaves, outputs)


def _multi_device(leaves, outputs) -> bool:
  shardings = {}  # each sharding object once: a wide pytree's leaves share one or two
  for x in (*leaves, *outputs):
    s = x.sharding_obj
    if s is not None:
      shardings.setdefault(id(s), s)
  return any(_num_devices(s) > 1 for s in shardings.values())


def _num_devices(sharding) -> int:
  """Devices a sharding spans; abstract meshes (no devices) count by their size."""
  try:
    return len(sharding.device_set)
  except Exception:  # an AbstractMesh has no devices
    mesh = getattr(sharding, "mesh", None)
    return int(getattr(mesh, "size", 1) or 1)


def _user_stacklevel() -> int:
  """The `warnings.warn` stacklevel of the first caller outside this package and JAX."""
  hidden = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
            os.path.dirname(os.path.abspath(jax.__file__)) + os.sep)
  frame, level = sys._getframe(1), 1
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(hidden):
    frame, level = frame.f_back, level + 1
  return level
