"""One planned call signature of a `donate.jit` function: the trace -> plan steps of its pipeline.

`prepare` plans a traced signature (`pairing.make_plan`) into a frozen `Prepared`, and decides how
it runs:

* the plan equals what `jax.jit` does by itself (the common case: the same pairs, no in-function
  annotations): the gate, a `jax.jit` of the user's function, lowers, compiles and runs it, so the
  call, its staged objects, its caches and its errors are `jax.jit`'s own (`Prepared.native`);
* donate does better (dataflow pairing where first come, first served would copy, `donate_buffer`
  and `alias` anywhere inside, preallocated outputs): the gate's own lowering, with `main`'s
  `tf.aliasing_output` and `jax.buffer_donor` attributes set to the plan's
  (`Prepared.realiased`; `_compat_aliases.lowered_with_aliases`), is compiled and run. Arguments and
  results keep the user's order and pytrees, so the staged objects and the executable are
  `jax.jit`'s own in every other respect (serialization, `out_info`, shardings, export, caches);
* values marked for symmetric memory (a rewritten jaxpr) or a GPU target's placement options: an
  inner `jax.jit(replay, donate_argnums=plan.layout.donated)` over the flat leaves replays the
  marked jaxpr, its results in the user's order, with the plan's aliases set the same way
  (`Prepared.inner`).

`Prepared.lower` gives a new `jax.stages.Lowered`; `program.compile_program` compiles it into a
`program.Program`, whose plan has what XLA made of this one (`compiled.realize`), before anything
runs. A plain signature is routed by `_jit.quick` instead, with the facts a lowering reads
(`Quick`) and the same plan made when first read (`LazyPlan`).
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
from donate._base import compat_aliases as _compat_aliases
from donate._base import errors as _errors
from donate._base.primitives import remember_donate_jit
from donate._jit import binding as _binding
from donate._jit import facts as _facts
from donate._jit import gate as _gate
from donate._jit import route as _route
from donate._jit.facts import Function
from donate._plan import donation_plan as _donation_plan
from donate._plan.decision_types import Action, Kind, Request


@dataclasses.dataclass(eq=False)
class Inner:
  """The replay of one signature's marked program: a `jax.jit` over the flat leaves."""

  jitted: Any  # a jax.jit function (called, traced, its cache cleared)
  out_tree: Any  # results come in the user's order

  def outputs(self, flat) -> Any:
    return tree_util.tree_unflatten(self.out_tree, flat)

  def __call__(self, leaves):
    return self.outputs(self.jitted(*leaves))


@dataclasses.dataclass(frozen=True, eq=False)
class Quick:
  """What lowering reads of a signature `_jit.quick` routed, known before its plan is made:
  every requested leaf on one device is paired, a buffer donor or unread."""

  requested: frozenset[int]  # the leaves donate_argnums/donate_argnames ask for
  pairs: dict[int, int]  # {leaf: output} of the planned aliases
  donors: frozenset[int]  # the leaves offered to XLA as buffer donors


class LazyPlan:
  """A signature's plan, made when first read (once, under a lock: threads share signatures)."""

  __slots__ = ("_make", "_plan", "_lock")

  def __init__(self, make: Callable[[], _donation_plan.DonationPlan]):
    self._make: Callable[[], _donation_plan.DonationPlan] | None = make
    self._plan: _donation_plan.DonationPlan | None = None
    self._lock = threading.Lock()

  def get(self) -> _donation_plan.DonationPlan:
    plan = self._plan
    if plan is None:
      with self._lock:
        if self._plan is None:
          assert self._make is not None
          with collector_paused():
            self._plan = self._make()
          self._make = None  # what it read goes with it
        plan = self._plan
    return plan

  def anew(self) -> _donation_plan.DonationPlan:
    """The plan made again and not kept (to check it without reading it), or the one kept."""
    make = self._make
    if make is None:
      assert self._plan is not None
      return self._plan
    with collector_paused():
      return make()


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
  """One planned signature: its trace, its plan and how it runs (a value: lowering and compiling
  make new ones, `program.Program`, and never write into it).

  It holds no reference back to its `JitWrapped` (no cycle), so dropping the function frees
  everything at once, as dropping a `jax.jit` function does.
  """

  fn: Function
  call: _binding.Call  # the call's structure (its leaves are not kept)
  traced: Any  # jax.stages.Traced of the gate
  planned: _donation_plan.DonationPlan | LazyPlan  # read through `plan`
  inner: Inner | None  # the replay over the flat leaves, when not `native`
  realiased: bool = False  # the gate's lowering with the plan's aliases, run as compiled
  first_come: Callable[[str], Any] | None = None  # the first-come plan, given why it is used
  in_shardings: tuple = ()  # the traced input shardings, per leaf (None where not known)
  comm: tuple = ()  # the values marked for symmetric memory (`_symm.comm_buffers`)
  placement: Any = None  # the `_symm` placement policy, on GPU targets with marked values
  dropped: frozenset = frozenset()  # leaves the program does not take (unread, not kept)
  quick: Quick | None = None  # what lowering reads, known before the plan (`_jit.quick`)

  @property
  def plan(self) -> _donation_plan.DonationPlan:
    """The donation plan (made when first read, for a signature `_jit.quick` routed)."""
    planned = self.planned
    return planned.get() if isinstance(planned, LazyPlan) else planned

  @property
  def native(self) -> bool:
    """Whether the program is jax.jit's lowering of the gate's trace (its own plan, or
    `realiased`), not a replay."""
    return self.inner is None

  @property
  def jax_own(self) -> bool:
    """Whether `jax.jit`'s own program runs this signature (its pairs, its lowering)."""
    return self.native and not self.realiased

  @property
  def as_jax_jit(self) -> bool:
    """Whether `jax.jit`'s own program runs this signature with nothing donated or marked, so
    donate has nothing to check in it: JAX's own miss lowers and compiles it (donate compiles it
    only when a plan or stage is asked for)."""
    return (
      self.jax_own
      and not self.comm
      and not self.fn.options.strict_copies
      and (
        not self.quick.requested
        if self.quick is not None
        else all(d.request is None for d in self.plan.decisions)
      )
    )

  @property
  def donated(self) -> frozenset[int]:
    """The leaves the program donates (as `jax.jit`'s `args_info[...].donated` reports them)."""
    if self.jax_own:
      return frozenset(self.fn.binding.donated_leaves(self.call))
    if self.quick is not None:
      return frozenset(self.quick.pairs) | self.quick.donors
    return frozenset(self.plan.layout.donated)

  def as_first_come(self, why: str) -> Prepared:
    """This signature planned and run as `jax.jit` pairs it (`why`: the plan's note)."""
    assert self.first_come is not None, "only a re-paired signature has a first-come twin"
    plan = self.first_come(why)
    return dataclasses.replace(self, planned=plan, realiased=False, first_come=None, quick=None)

  def can_trace(self, call: _binding.Call | None) -> bool:
    """Whether `call` lets this signature be traced again: a replay needs the call's leaves, not
    only its structure (`Prepared.call` keeps none)."""
    return call is not None and (self.native or all(x is not None for x in call.leaves))

  def traced_for(self, call: _binding.Call):
    """The jax.stages.Traced this signature lowers: the gate's, or the replay's for the call's
    leaves (traced under the gate; see `can_trace`)."""
    if self.native:
      return self.traced
    assert self.inner is not None  # not native: replayed
    with self.fn.gate:
      traced = self.inner.jitted.trace(*call.leaves)
    remember_donate_jit(traced.jaxpr)
    return traced

  def lower(self, call: _binding.Call, lower_kwargs: dict | None = None, warn: bool = True):
    """A new jax.stages.Lowered of this signature (`lower_kwargs`: JAX's lowering keywords, as
    `jax.export` passes them); warns (`warn`; or raises) for unusable donations."""

    def lower():
      traced = self.traced_for(call)
      if self.jax_own:
        return traced.lower(**(lower_kwargs or {}))
      # Lowered under parameters of this plan's own: the module is changed in place, never the
      # one JAX's caches give jax.jit's first-come lowering of the same trace.
      aliases = self._alias_plan()
      kwargs = dict(lower_kwargs or {})
      given = kwargs.get("_private_parameters")
      kwargs["_private_parameters"] = _compat_aliases.lowering_parameters_for(given, *aliases)
      lowered = traced.lower(**kwargs)
      n_traced = _compat.traced_num_consts(traced)
      return _compat_aliases.lowered_with_aliases(lowered, n_traced, *aliases)

    return self.checked_lowering(lower, warn=warn)

  def lower_without_donation(self, call: _binding.Call | None):
    """For the memory profile's saving: a thunk lowering this signature with no donated input
    (None when it donates nothing), or None when the call's leaves are not at hand."""
    if not self.can_trace(call):
      return None

    def lower():
      twin = _compat.traced_without_donation(self.traced_for(call))
      return None if twin is None else twin.lower()

    return lower

  def _alias_plan(self) -> tuple[set[int], dict[int, int], set[int], set[int]]:
    """`(managed, pairs, donors, pinned)`: what the lowering's `main` must say, argument leaf by
    leaf (`_compat_aliases.lowered_with_aliases`).

    The leaves the plan decides are set, and donated host values; others (refs) keep what
    `jax.jit`'s lowering gave them. An output that reuses a buffer over several devices is given
    that buffer's sharding when the lowering left it to propagation (`jax.jit` makes an alias
    only for an output whose sharding is stated)."""
    quick = self.quick
    if quick is not None:  # every requested leaf is paired, a donor or unread; on one device
      return set(quick.requested), dict(quick.pairs), set(quick.donors), set()
    plan = self.plan
    managed = {i for i, d in enumerate(plan.decisions) if d.requested and d.action in _PLANNED}
    donors = {i for i, d in enumerate(plan.decisions) if d.action == Action.DONOR}
    # A donated host value is copied to the device for the call and that copy donated, as
    # `jax.jit` does; it takes no pair (JAX's first-come alias may be an output the plan gives
    # another leaf), and XLA may reuse it for an output still free.
    host = {i for i, d in enumerate(plan.decisions) if d.requested and d.info.kind == Kind.HOST}
    managed |= host
    donors |= host
    pairs = plan.pairs()
    sh = self.in_shardings
    pinned = {i for i in pairs if sh[i] is not None and _route.num_devices(sh[i]) > 1}
    return managed, pairs, donors, pinned

  def checked_lowering(self, lower: Callable[[], Any], warn: bool = True):
    """`lower()` under the gate, JAX's own unusable-donation warning silenced; before it, an
    explicit alias that cannot hold (or, in strict mode, any unusable donation) raises, and after
    it the plan's per-leaf warning is given (`warn`). A signature `_jit.quick` routed has no
    unusable donation (neither for `jax.jit`'s first-come pairs, so JAX warns of none): its plan
    is not read."""
    if self.quick is not None:
      with self.fn.gate:
        return lower()
    explicit = [d for d in self.plan.unusable if d.request == Request.ALIAS]
    if explicit or (self.fn.options.strict_unusable and self.plan.unusable):
      raise _errors.DonationError("donate: " + self.plan.explain_unusable(explicit or None))
    with self.fn.gate, warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=_errors.JAX_UNUSABLE_PREFIX)
      lowered = lower()
    if warn and self.plan.unusable:
      warn_unusable(self.plan.explain_unusable())
    return lowered

  def check_duplicates(self, call: _binding.Call, plan: _donation_plan.DonationPlan | None = None):
    """The same buffer twice where one is donated: raise before dispatch, naming both leaves.
    A leaf the program does not take is not passed (`jax.jit` prunes it): it repeats nothing."""
    plan = plan or self.plan
    consumed = {i for i, d in enumerate(plan.decisions) if d.consumed}
    if not consumed:
      return
    seen: dict[int, int] = {}
    for i, x in enumerate(call.leaves):
      if isinstance(x, jax.Array) and i not in self.dropped:
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


def prepare(fn: Function, call: _binding.Call, traced) -> Prepared:
  """Plans one traced signature and builds what runs it; lowers and compiles nothing."""
  with collector_paused():
    return _prepare(fn, call, traced)


def warn_unusable(text: str) -> None:
  """The plan's unusable-donation warning, pointing at the user's line."""
  warnings.warn(text, _errors.UnusableDonationWarning, stacklevel=_user_stacklevel())


@contextlib.contextmanager
def collector_paused():
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


def _placement(facts: _facts.Facts, comm):
  """The symmetric-memory placement policy when marked values compile for GPUs with placement
  options, else None."""
  if not comm:
    return None
  every = [leaf.sharding_obj for leaf in facts.leaves] + [o.sharding_obj for o in facts.outputs]
  platform = _symm.target_platform(every, jax.default_backend())
  policy = _symm.placement_policy(platform, comm, enabled=facts.fn.options.symmetric_placement)
  return policy if policy.options else None


def _prepare(fn: Function, call: _binding.Call, traced) -> Prepared:
  """Plans, then routes: jax.jit's own program, the gate's lowering re-aliased, or a replay."""
  facts = _facts.read_facts(fn, call, traced)
  plan, comm = facts.plan()
  policy = _placement(facts, comm)
  if policy is not None:
    plan = dataclasses.replace(plan, notes=plan.notes + policy.placed_too)
  replay = facts.marked is not traced.jaxpr or policy is not None
  replay = replay or (
    facts.xla_decides and _route.refs_beside_donors(plan, facts.leaves, traced.jaxpr)
  )
  native, why = _route_of(facts, plan, replay)
  if why and why != _route.SAME_PAIRS:
    plan, comm = facts.plan(first_come=why)
  native, replay = native or bool(why), replay and not why
  inner = None
  if replay:
    options = dict(policy.options) if policy is not None else {}
    inner = _inner(fn, facts.marked, plan, traced, facts.leaves, facts.in_sh, facts.out_sh, options)
  structure = call.without_leaves()
  realiased = not (native or replay)
  first_come = (lambda why: facts.plan(first_come=why)[0]) if realiased else None
  unread = [i for i, u in enumerate(facts.flow.used) if not u]
  dropped = frozenset() if fn.options.keep_unused else frozenset(unread)
  return Prepared(
    fn, structure, traced, plan, inner, realiased, first_come, tuple(facts.in_sh), tuple(comm),
    policy, dropped,
  )  # fmt: skip


def _route_of(facts: _facts.Facts, plan, replay: bool) -> tuple[bool, str]:
  """`(native, why)`: whether the plan is jax.jit's own, and why only jax.jit's own lowering
  should run it (`route.first_come_only`; "" when the re-paired program is worth its bytes)."""
  first = _route.FirstCome(facts.fn.options, plan, facts.requested, facts.flow)
  native = not replay and _route.is_native(first, facts.xla_decides)
  n_consts = _compat.traced_num_consts(facts.traced)
  why = _route.first_come_only(first, facts.requested, facts.has_layouts, n_consts, replay, native)
  return native, why


# The actions of the leaves whose parameter attributes the plan sets (`Prepared._alias_plan`).
_PLANNED = (Action.ALIASED, Action.DONOR, Action.UNUSABLE, Action.UNUSED)


def _inner(fn: Function, closed, plan, traced, leaves, in_sh, out_sh, gpu_options) -> Inner:
  """The replay of the (marked) traced jaxpr over the flat leaves, results in the user's order;
  its lowering gets the plan's aliases (`Prepared.lower`)."""
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
