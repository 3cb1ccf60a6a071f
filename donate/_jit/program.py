"""A signature's compiled program, and the cache cell that keeps each signature's stages.

A call flows trace -> plan (`signature.prepare`: a frozen `Prepared`) -> lower (`Prepared.lower`:
JAX's `Lowered`) -> compile and realize (`compile_program`: a frozen `Program`, whose plan has the
aliases XLA made) -> run (`Program.miss`). Each step returns a new value and writes into none of
the earlier ones. `Signature` is the cache of one signature: it keeps the newest value of each
stage (as `jax.jit`'s caches keep its lowering and executable) and is the only thing on the path
that changes.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from typing import Any

from donate._base import compat as _compat
from donate._base import errors as _errors
from donate._base.text import format_bytes
from donate._jit import binding as _binding
from donate._jit import compiled as _compiled
from donate._jit.signature import Prepared, warn_unusable
from donate._plan import donation_plan as _donation_plan
from donate._plan.decision_types import Action, Cause, Request
from donate._xla import copies as _copies


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
  """One signature compiled: the program that runs it and the plan with what XLA made of it."""

  prep: Prepared  # the signature as it runs (`jax.jit`'s own pairs when the peak check kept them)
  lowered: Any  # jax.stages.Lowered
  compiled: Any  # jax.stages.Compiled
  plan: _donation_plan.DonationPlan
  in_paths: tuple[str, ...]  # the compiled module's parameters as the user's leaf paths

  def run(self, args, kwargs, leaves):
    """Runs the call; returns its outputs."""
    return self.miss(args, kwargs, leaves)[0]

  def miss(self, args, kwargs, leaves) -> tuple:
    """Runs the call as the function's C++ dispatch runs a miss: `(outputs, fastpath data or
    None, drop)`, the data being the dispatch's entry for the call's signature (None: there is
    none; a replay, or a program with host callbacks, is found again in Python)."""
    prep = self.prep
    if prep.realiased:  # the compiled program with the plan's aliases, as jax.jit's AOT runs it
      dyn_args, dyn_kwargs = prep.fn.binding.dynamic(args, kwargs)
      miss = self._compiled_miss
      try:
        if miss is not None:
          return miss(*dyn_args, **dyn_kwargs)
        return self.compiled(*dyn_args, **dyn_kwargs), None
      except _compat.InvalidInputException as e:
        raise _invalid_input(prep, args, kwargs, e) from e
    if prep.inner is None:  # native: jax.jit's own program, through JAX's own miss
      return prep.fn.jit_miss(*args, **kwargs)
    return prep.inner(leaves), None

  @functools.cached_property
  def _compiled_miss(self):
    return _compat.compiled_cache_miss(self.compiled)

  def check_duplicates(self, call: _binding.Call) -> None:
    self.prep.check_duplicates(call, self.plan)

  @property
  def consumes(self) -> bool:
    """Whether a call consumes a buffer (donated or a donor)."""
    return any(d.consumed for d in self.plan.decisions)

  def copies(self, threshold: int) -> tuple:
    """The copies XLA added of at least `threshold` bytes (`CopyRecord`s)."""
    if threshold == self.plan.copy_threshold and self.plan.copies is not None:
      return self.plan.copies
    return _compiled.copies_of(self.in_paths, self.prep.traced.jaxpr, self.compiled, threshold)

  def with_details(self) -> Program:
    """This program with the copies XLA added and the memory figures read (once)."""
    if self.plan.copies is not None:
      return self
    jaxpr = self.prep.traced.jaxpr
    plan = _compiled.details(self.in_paths, jaxpr, self.compiled, self.plan)
    return dataclasses.replace(self, plan=plan)

  def with_profile(self, call=None, compiler_options=None) -> Program:
    """This program with its memory profile in the plan (`_compiled.with_profile`)."""
    if self.plan.profile is not None and compiler_options is None:
      return self
    plan = _compiled.with_profile(self, self.plan, compiler_options, call)
    return dataclasses.replace(self, plan=plan)


def _invalid_input(prep: Prepared, args, kwargs, e: Exception) -> TypeError:
  """The error `jax.jit` raises for an argument its executable cannot take (a
  `jax.ShapeDtypeStruct`, say): it names the first such argument and its type."""
  jaxpr = prep.traced.jaxpr
  if jaxpr.consts:
    return TypeError(e.args[0])
  call = prep.fn.binding.bind(args, kwargs)
  avals = jaxpr.in_avals[_compat.traced_num_consts(prep.traced) :]
  for x, path, aval in zip(call.leaves, prep.fn.binding.paths(call), avals):
    if not _compat.is_valid_jax_value(x):
      return TypeError(
        f"Argument '{path}' of shape {aval.str_short()} of type {type(x)} is not a valid JAX type."
      )
  return TypeError(e.args[0])


def compile_program(
  prep: Prepared,
  lowered,
  call: _binding.Call,
  compiler_options: dict | None = None,
  device_assignment=None,
  with_copies: bool = True,
  with_profile: bool = False,
  first: bool = True,
) -> Program:
  """Compiles `lowered` (a lowering of `prep`) and reads the program back into the plan (the
  copies XLA added too, unless `with_copies=False` and the function is not strict about them;
  the memory profile with `with_profile` or `strict="copies"`). `first`: the signature's first
  compile with its own options, which says late unusable donations and, for a re-paired program
  that may need more memory, compares its peak with `jax.jit`'s own (`_lower_peak_of_two`). A
  re-paired program XLA rejects runs as `jax.jit`'s own (`_compiled_or_first_come`)."""
  options = prep.fn.options
  given = {"compiler_options": compiler_options, "device_assignment": device_assignment}
  kwargs = {k: v for k, v in given.items() if v is not None}
  with_copies = with_copies or options.strict_copies or bool(kwargs)
  prep, lowered, compiled = _compiled_or_first_come(prep, lowered, kwargs)
  program = _realized(prep, lowered, compiled, with_copies)
  if prep.realiased and first and not kwargs:
    program = _lower_peak_of_two(program, with_copies)
  _check_unusable(program, prep.plan, warn_late=first)
  if with_profile or options.strict_copies:
    program = program.with_profile(call, compiler_options)
  if options.strict_copies:
    name = prep.fn.name
    found = _copies.strict_problems(program.plan.copies, name)
    found += _compiled.peak_problems(program.plan, name)
    if found:
      raise _errors.DonationError("\n".join(found))
  if program.plan.placements is not None:
    program.plan.placements.check(strict=options.strict_unusable)
  return program


def _compiled_or_first_come(prep: Prepared, lowered, kwargs: dict) -> tuple:
  """`(prep, lowered, compiled)`: `lowered` compiled, or, where XLA rejects the aliases of a
  re-paired program (an output its sharding propagation lays out otherwise than the input whose
  buffer it takes, over several devices), `jax.jit`'s own first-come program, whose error, if it
  has one too, is `jax.jit`'s own."""
  try:
    return prep, lowered, lowered.compile(**kwargs)
  except Exception as e:  # any rejection of the re-paired program: said in the plan
    if not _first_come_can_run(prep):
      raise
    rejected = f"XLA rejects the re-paired program ({_first_line(e)})"
  first_come = prep.as_first_come(rejected + "; jax.jit's own is kept")
  theirs = _first_come_lowering(first_come)
  return first_come, theirs, theirs.compile(**kwargs)


def _first_line(e: BaseException) -> str:
  said = str(e).strip().splitlines()
  return f"{type(e).__name__}: {said[0] if said else ''}"


def _first_come_can_run(prep: Prepared) -> bool:
  """Whether `jax.jit`'s own first-come program can stand in for the re-paired one: only
  `donate_argnums`/`donate_argnames` ask for donation (it would drop donate's own markers)."""
  by_argument = (None, Request.DONATE_ARGNUMS, Request.DONATE_ARGNAMES)
  return (
    prep.realiased
    and prep.first_come is not None
    and all(d.request in by_argument for d in prep.plan.decisions)
  )


def _first_come_lowering(prep: Prepared):
  """`jax.jit`'s own lowering of the signature's trace (its unusable-donation warning silenced:
  the plan says the unusable donations)."""
  with prep.fn.gate, warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=_errors.JAX_UNUSABLE_PREFIX)
    return prep.traced.lower()


def _realized(prep: Prepared, lowered, compiled, with_copies: bool) -> Program:
  params = _compiled.parameters(prep, lowered)
  threshold = prep.fn.options.copy_threshold
  plan = _compiled.realize(prep, params, compiled, threshold, with_copies)
  return Program(prep, lowered, compiled, plan, params.paths)


def _check_unusable(program: Program, planned: _donation_plan.DonationPlan, warn_late: bool):
  """Raises for an explicit alias XLA did not make (or, in strict mode, any donation unusable
  after compiling that was not before); says planned aliases the program does not have, once per
  signature (`warn_late`), as lowering says the unusable donations it foresaw (a donor XLA did
  not reuse is silent, as in jax.jit, and so is `jax.jit`'s own program, whose first-come pairs
  over several devices with an output sharding not given are donors only)."""
  plan = program.plan
  explicit = [d for d in plan.unusable if d.request == Request.ALIAS]
  strict = program.prep.fn.options.strict_unusable
  if explicit or (strict and len(plan.unusable) > len(planned.unusable)):
    raise _errors.DonationError("donate: " + plan.explain_unusable(explicit or None))
  if program.prep.jax_own:  # jax.jit's own lowering: it warned, or not, at lowering (as JAX does)
    return
  pairs = zip(plan.decisions, planned.decisions)
  late = [d for d, was in pairs if d.action == Action.UNUSABLE and was.action == Action.ALIASED]
  if late and warn_late:
    warn_unusable(plan.explain_unusable(late))


def _lower_peak_of_two(ours: Program, with_copies: bool) -> Program:
  """Unless the re-paired program's peak can be above no other pairing's (`_most_above_least`
  is 0: the least peak possible), `jax.jit`'s own first-come program is compiled too and
  the one with the lower peak kept (once per signature; the re-paired one on a tie, unless XLA
  copies a donated buffer of it); the plan says which, and why: XLA copies a donated buffer of
  it anyway, or an input returned unchanged keeps its buffer as that output where first come,
  first served gives the buffer to another output, or it needs temporaries (XLA lays the values
  of two pairings out otherwise, not always in less memory for the one that copies less). Where
  `jax.jit`'s own program does not compile (XLA rejects its aliases), the re-paired one is kept
  and the plan says so."""
  prep = ours.prep
  if not _first_come_can_run(prep):
    return ours
  stats = ours.plan.memory or _donation_plan.MemoryStats.from_compiled(ours.compiled)
  if stats is None or _most_above_least(ours.plan, stats) == 0:
    return ours
  copied = _copied_why(ours)
  why = copied or _passthrough_why(prep) or _temporaries_why(stats)
  theirs_lowered = _first_come_lowering(prep)
  try:
    theirs_compiled = theirs_lowered.compile()
  except Exception as e:  # XLA rejects jax.jit's own program (its aliases): where jax.jit fails
    return _with_note(ours, f"{why}; jax.jit's own does not compile ({_first_line(e)})")
  theirs_peak = _donation_plan.MemoryStats.from_compiled(theirs_compiled)
  if theirs_peak is None:
    return ours
  mine, fcfs = stats.peak_bytes, theirs_peak.peak_bytes
  why += f": peak {format_bytes(mine)}, first come, first served {format_bytes(fcfs)}"
  if mine < fcfs or (mine == fcfs and not copied):
    return _with_note(ours, why)
  first_come = prep.as_first_come(why + "; jax.jit's own is kept")
  return _realized(first_come, theirs_lowered, theirs_compiled, with_copies)


def _with_note(ours: Program, why: str) -> Program:
  """The re-paired program kept after the peak check, its plan saying why it was checked."""
  plan = ours.plan
  note = why + "; the re-paired program is kept"
  return dataclasses.replace(ours, plan=dataclasses.replace(plan, notes=plan.notes + (note,)))


def _most_above_least(
  plan: _donation_plan.DonationPlan, stats: _donation_plan.MemoryStats
) -> int | None:
  """The most a compiled program's peak (`stats`, its realized `plan`) can be above that of any
  pairing of the same step, in bytes (None with symbolic sizes): its temporaries and the
  donated buffers it keeps and does not reuse (arguments and outputs are those of every
  pairing; no pairing needs fewer than no temporaries or reuses more than every donated
  buffer)."""
  kept = [d for d in plan.decisions if d.requested and d.action != Action.UNUSED]
  unreused = [d.info.nbytes for d in kept if d.action != Action.ALIASED]
  if not all(isinstance(n, int) for n in unreused):
    return None
  return stats.temp_bytes + sum(unreused)


def _temporaries_why(stats: _donation_plan.MemoryStats) -> str:
  """What keeps the re-paired program's peak possibly above another pairing's."""
  if stats.temp_bytes:
    return f"the re-paired program needs {format_bytes(stats.temp_bytes)} of temporaries"
  return "the re-paired program does not reuse every donated buffer"


def _copied_why(ours: Program) -> str:
  """What XLA copies of the donated buffers of the re-paired program ("" when nothing)."""
  plan = ours.plan
  copies = ours.copies(ours.prep.fn.options.copy_threshold)  # the plan's own, when read already
  consumed = {d.path for d in plan.decisions if d.consumed}
  copied = sorted({c.input_path for c in copies if c.input_path in consumed})
  return f"XLA copies {', '.join(copied)} in the re-paired program" if copied else ""


def _passthrough_why(prep: Prepared) -> str:
  """The inputs the re-paired plan leaves in place as their own unchanged outputs where first
  come, first served gives their buffers to other outputs ("" when none)."""
  plan = prep.plan
  kept = [i for i, d in enumerate(plan.decisions) if d.cause == Cause.RETURNED_UNCHANGED]
  if not kept:
    return ""
  assert prep.first_come is not None  # `_first_come_can_run`
  ours, theirs = plan.pairs(), prep.first_come("the peak check").pairs()
  moved = [i for i in kept if theirs.get(i) != ours.get(i)]
  if not moved:
    return ""
  outputs, decisions = plan.outputs, plan.decisions
  said = [
    f"{decisions[i].path} returned unchanged as {decisions[i].output}"
    + (f" (first come, first served: {outputs[theirs[i]].path})" if i in theirs else "")
    for i in moved
  ]
  return f"{', '.join(said)} in the re-paired program"


@dataclasses.dataclass(frozen=True, eq=False)
class AsJaxJit:
  """A signature `jax.jit`'s own program runs with nothing donated or marked
  (`Prepared.as_jax_jit`): run through JAX's own miss, which lowers and compiles it once, as
  for `jax.jit`."""

  prep: Prepared

  def miss(self, args, kwargs, leaves) -> tuple:
    return self.prep.fn.jit_miss(*args, **kwargs)

  def check_duplicates(self, call: _binding.Call) -> None:
    self.prep.check_duplicates(call)

  consumes = False  # nothing donated


class Signature:
  """The cache of one planned signature: its `Prepared`, its lowering and its `Program`, each
  the newest value (the compile check may replace the `Prepared` by its first-come twin)."""

  __slots__ = ("prepared", "lowered", "program", "lock", "ran")

  def __init__(self, prepared: Prepared):
    self.prepared = prepared
    self.lowered: Any = None  # jax.stages.Lowered of `prepared`, once lowered
    self.program: Program | None = None
    self.lock = threading.Lock()
    self.ran = False  # run as `jax.jit` runs it (`AsJaxJit`), compiled by JAX's own miss

  @property
  def compiled(self) -> bool:
    """Whether a program of this signature was compiled (by donate, or by JAX's own miss)."""
    return self.ran or self.program is not None

  def runner(self, call: _binding.Call):
    """What runs the signature's calls (`.miss(args, kwargs, leaves)`): `AsJaxJit` where there
    is nothing for donate to check, else its `Program` (compiled once; copies read only when a
    plan is asked for)."""
    if self.prepared.as_jax_jit:
      self.ran = True
      return AsJaxJit(self.prepared)
    return self.compile(call, with_copies=False)

  def lower(self, call: _binding.Call):
    """The signature's jax.stages.Lowered (lowered once; warns for unusable donations then)."""
    with self.lock:
      if self.lowered is None:
        self.lowered = self.prepared.lower(call)
      return self.lowered

  def compile(
    self, call, compiler_options=None, device_assignment=None, with_copies=True, with_profile=False
  ) -> Program:
    """The signature's `Program`: compiled once with its own options (then kept), or afresh with
    `compiler_options` / `device_assignment` (not kept)."""
    lowered = self.lower(call)
    strict = self.prepared.fn.options.strict_copies
    with self.lock:
      kept = self.program
      if kept is not None and compiler_options is None and device_assignment is None:
        if with_copies or strict:
          kept = kept.with_details()
        if with_profile or strict:
          kept = kept.with_profile(call)
        self.program = kept
        return kept
      program = compile_program(
        self.prepared, lowered, call, compiler_options, device_assignment,
        with_copies, with_profile, first=kept is None,
      )  # fmt: skip
      if compiler_options is None and device_assignment is None:
        self.program, self.prepared, self.lowered = program, program.prep, program.lowered
      return program


class NoEntry:
  """The programs a function ran without a C++ entry (a replay; host callbacks, which no entry
  runs), found again by the call's key as `jax.jit`'s dispatch makes it: structure, static
  arguments, each leaf's aval, sharding, commitment and layout, and the jit-keyed configuration.
  Bounded, as `jax.jit`'s dispatch caches are."""

  LIMIT = 4096

  def __init__(self):
    self._programs: dict[Any, tuple] = {}  # key -> (program, what the key holds by identity)
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._programs)

  @staticmethod
  def key(call: _binding.Call) -> tuple:
    return (call.key, *map(_binding.signature_key, call.leaves), _compat.jit_context())

  def find(self, binding: _binding.Binding, args, kwargs):
    """`(program, call)` of a call planned before and run without an entry, else None."""
    if not self._programs:
      return None
    try:
      call = binding.bind(args, kwargs)
    except (TypeError, ValueError):  # tracing raises jax.jit's own error
      return None
    found = self._programs.get(self.key(call))
    return (found[0], call) if found is not None else None

  def add(self, key: tuple, held: tuple, program) -> None:
    """`held`: what `key` names by identity (`binding.held`), kept alive beside it."""
    with self._lock:
      if len(self._programs) >= self.LIMIT:
        self._programs.clear()
      self._programs[key] = (program, held)

  def clear(self) -> None:
    self._programs.clear()


class Unplanned(Exception):
  """Raised by `JitWrapped._prepare` for a call donate does not plan: its jaxpr has hijax types
  (JAX's experimental high-level types: one value lowers to any number of buffers, which the plan's
  leaves cannot name). It runs, traces and lowers as `jax.jit`'s own (`traced`, JAX's `Traced`)."""

  def __init__(self, traced):
    super().__init__()
    self.traced = traced


def unplanned_error(name: str, traced) -> Exception:
  """The error of `plan()` for a call whose jaxpr has hijax types (`Unplanned`)."""
  avals = [*traced.jaxpr.in_avals, *traced.jaxpr.out_avals]
  high = sorted({type(a).__name__ for a in avals if _compat.is_high(a)})
  return _errors.DonationTypeError(
    _errors.message(
      f"donate.jit of {name}: no plan for a call with hijax types ({', '.join(high) or 'boxes'})",
      expected="arrays, jax.Refs and pytrees of them",
      got="JAX's experimental high-level types (jax.experimental.hijax); the call, .trace() and "
      ".lower() run as jax.jit runs them",
      fix="call the function, or its .trace() or .lower(), without .plan()",
    )
  )
