"""Reading a compiled program back into the plan: the aliases XLA made, its memory figures, the
copies it added, and where marked values landed on a GPU target."""

from __future__ import annotations

import dataclasses

from jax import tree_util

from donate import _profile, _symm
from donate._base import compat as _compat
from donate._base.text import format_bytes, sharding_str
from donate._plan import donation_plan as _donation_plan
from donate._plan.decision_types import Action
from donate._xla import copies as _copies
from donate._xla import hlo as _hlo


@dataclasses.dataclass(frozen=True, slots=True)
class Parameters:
  """How a lowered module's `main` parameters line up with the call's leaves.

  Effect tokens and hoisted constants come first (`offset` of them), then the kept inputs (the
  traced constants, closed-over tracers, ahead of the argument leaves), then the refs the
  function closes over; effect tokens also come first among the results (`out_tokens`)."""

  leaf: tuple[int | None, ...]  # per kept input: its argument leaf, None for a traced constant
  offset: int
  out_tokens: int
  paths: tuple[str, ...]  # every parameter, named by the user's leaf path or what it is

  def leaf_of(self, param: int) -> int | None:
    """The argument leaf of parameter `param`, None for any other parameter."""
    k = param - self.offset
    return self.leaf[k] if 0 <= k < len(self.leaf) else None


def parameters(prep, lowered) -> Parameters:
  """The `Parameters` of `lowered`, the lowering of signature `prep`."""
  kept, n_consts = _compat.lowered_kept_leaves(lowered)
  n_refs = _compat.lowered_closed_over_refs(lowered)  # parameters after the argument leaves
  offset = _main_param_count(lowered) - len(kept) - n_refs
  n_traced = _compat.traced_num_consts(prep.traced)
  leaf = tuple(k - n_traced if k >= n_traced else None for k in kept)
  names = [d.path for d in prep.plan.decisions]
  paths = (
    ("<effect token>",) * (offset - n_consts)
    + ("<constant>",) * n_consts
    + tuple(names[i] if i is not None else "<constant>" for i in leaf)
    + ("<closed-over ref>",) * n_refs
  )
  return Parameters(leaf, offset, offset - n_consts, paths)


def realize(
  prep, params: Parameters, compiled, copy_threshold: int, with_copies: bool = True
) -> _donation_plan.DonationPlan:
  """The plan with the aliases the compiled program really has, its memory figures and the
  copies XLA added (`with_copies=False`: neither the copies nor the memory figures are read yet,
  `copies` is None; a plain call that neither prints the plan nor is strict about copies does not
  pay for reading them: `details` reads them later)."""
  text = compiled.as_text()
  realized = _realized_pairs(params, text, len(prep.plan.outputs))
  shardings = _sharding_differences(prep, compiled, realized)
  memory = _donation_plan.MemoryStats.from_compiled(compiled) if with_copies else None
  plan = prep.plan.realize(realized, memory, shardings, _reused_shardings(prep, compiled, realized))
  placements = None
  if prep.placement is not None:  # a GPU target with marked values: where did they land?
    placements = _symm.placement_report(text, prep.comm)
  n_refs = params.paths.count("<closed-over ref>")
  notes = plan.notes + (
    (f"{n_refs} jax.Ref(s) the function closes over: written back in place",) if n_refs else ()
  )
  copies = copies_of(params.paths, prep.traced.jaxpr, text, copy_threshold) if with_copies else None
  return dataclasses.replace(
    plan, copies=copies, copy_threshold=copy_threshold, placements=placements, notes=notes
  )


def _realized_pairs(params: Parameters, text: str, n_outputs: int) -> dict[int, int]:
  """{argument leaf: user output} of the compiled module's `input_output_alias` (a ref written
  back into its own buffer, or a constant's alias, is not the plan's)."""
  realized = {}
  for param, out in _hlo.input_output_aliases(text).items():
    leaf, k = params.leaf_of(param), (out[0] if out else 0) - params.out_tokens
    if leaf is not None and 0 <= k < n_outputs:
      realized[leaf] = k
  return realized


def details(in_paths, jaxpr, compiled, plan) -> _donation_plan.DonationPlan:
  """The plan with the copies XLA added and the memory figures, read now (see `realize`)."""
  return dataclasses.replace(
    plan,
    copies=copies_of(in_paths, jaxpr, compiled, plan.copy_threshold),
    memory=_donation_plan.MemoryStats.from_compiled(compiled),
  )


def source_of(program, plan=None, call=None, compiler_options=None) -> _profile.Source:
  """What the memory profile reads of `program` (a `program.Program`), named by `plan`
  (default: its own), its saving measured for the leaves of `call` when given."""
  prep = program.prep
  return _profile.Source(
    prep.fn.name,
    _profile.signature_of(prep.fn),
    plan if plan is not None else program.plan,
    program.in_paths,
    program.lowered,
    program.compiled,
    compiler_options,
    prep.lower_without_donation(call),
    prep.traced if prep.jax_own else None,
    None if prep.jax_own else lower_donating(prep, call),
    _donated_argnums(prep, call),
  )


def _argument_leaves(call) -> dict[int, list[int]]:
  """Positional argument -> the indices of its leaves among the call's dynamic leaves."""
  dyn_args, _ = tree_util.tree_unflatten(call.treedef, list(range(len(call.leaves))))
  return {n: tree_util.tree_leaves(dyn_args[k]) for k, n in enumerate(call.positions)}


def _donated_argnums(prep, call) -> tuple[int, ...]:
  if call is None:
    return ()
  donated = prep.donated
  return tuple(n for n, ks in _argument_leaves(call).items() if ks and set(ks) <= donated)


def lower_donating(prep, call):
  """For the memory profile's advice on a program `jax.jit` does not run as its own (re-paired
  or replayed): a function of positional argnums lowering the same trace (the gate's, or the
  replay's) with those arguments' leaves donated too, as `jax.jit` donates them; None when the
  call's leaves are not at hand."""
  if not prep.can_trace(call):
    return None

  def lower(argnums: tuple[int, ...]):
    of = _argument_leaves(call)
    leaves = {k for n in argnums for k in of.get(n, ())}
    return _compat.traced_with_donation(prep.traced_for(call), leaves).lower()

  return lower


def with_profile(program, plan, compiler_options=None, call=None) -> _donation_plan.DonationPlan:
  """`plan` (of `program`) with the compiled program's memory profile (`plan.profile`) and, next
  to each aliased leaf of at least `copy_threshold` bytes, why its donation left the peak high: a
  temporary of about its size live beside it (`_profile.shadow`), else, when the peak is not
  lower than the same program's compiled without its donations (for the leaves of `call`), that.
  Only when some aliased leaf is that large: otherwise nothing is compiled and `plan.profile`
  stays None."""
  if not any(
    d.action == Action.ALIASED and isinstance(d.nbytes, int) and d.nbytes >= plan.copy_threshold
    for d in plan.decisions
  ):
    return plan
  profile = _profile.profile_of_source(source_of(program, plan, call, compiler_options))
  found = {s.path: str(s) for s in profile.shadowed if s.nbytes >= plan.copy_threshold}
  without = profile.peak_without_donation_bytes  # measured whenever `not_lowered` lists any
  if profile.not_lowered and without is not None:
    same = _profile.not_lowered_reason(profile.peak_bytes, without)
    found = {
      **{e.path: same for e in profile.not_lowered if e.nbytes >= plan.copy_threshold},
      **found,
    }
  decisions = tuple(
    dataclasses.replace(d, reason=f"{d.reason}; {found[d.path]}")
    if d.action == Action.ALIASED and d.path in found
    else d
    for d in plan.decisions
  )
  note = (
    f"memory profile: peak {format_bytes(profile.peak_bytes)} per device, "
    f"{_profile.saving(profile)} (plan.profile lists every buffer at the peak)"
  )
  return dataclasses.replace(plan, decisions=decisions, profile=profile, notes=plan.notes + (note,))


def peak_problems(plan, function: str) -> list[str]:
  """For `strict="copies"`: one message per aliased leaf whose donation left the peak high."""
  if plan.profile is None:
    return []
  return _profile.peak_problems(plan.profile, function, plan.copy_threshold)


def copies_of(in_paths, jaxpr, compiled_or_text, threshold: int) -> tuple:
  """The copies XLA added to a compiled signature, its parameters named by `in_paths` (the
  user's leaf paths), read against the traced `jaxpr`."""
  text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
  return _copies.find_copies(text, in_paths=list(in_paths), threshold=threshold, jaxpr=jaxpr)


def _sharding_differences(prep, compiled, realized) -> dict[int, tuple[str, str]]:
  """For planned aliases XLA did not make: compiled input and output shardings, if they differ."""
  missing = [
    i for i, d in enumerate(prep.plan.decisions) if d.action == Action.ALIASED and i not in realized
  ]
  if not missing:
    return {}
  ins = tree_util.tree_leaves(compiled.input_shardings)
  outs = _compat.compiled_output_shardings(compiled, len(prep.plan.outputs))
  pairs = prep.plan.pairs()
  result = {}
  for i in missing:
    a, b = (ins[i] if i < len(ins) else None), outs[pairs[i]]
    if (
      a is not None
      and b is not None
      and not a.is_equivalent_to(b, len(prep.plan.decisions[i].shape))
    ):
      result[i] = (sharding_str(a), sharding_str(b))
  return result


def _reused_shardings(prep, compiled, realized) -> dict[str, str]:
  """The compiled sharding of each output XLA put into a donor's buffer, by output path."""
  donors = [
    i for i, d in enumerate(prep.plan.decisions) if d.action == Action.DONOR and i in realized
  ]
  if not donors:
    return {}
  outs = _compat.compiled_output_shardings(compiled, len(prep.plan.outputs))
  return {
    prep.plan.outputs[realized[i]].path: sharding_str(outs[realized[i]])
    for i in donors
    if realized[i] < len(outs) and outs[realized[i]] is not None
  }


def _main_param_count(lowered) -> int:
  for op in lowered.compiler_ir("stablehlo").body.operations:
    if getattr(op, "sym_name", None) is not None and op.sym_name.value == "main":
      return len(op.regions[0].blocks[0].arguments)
  return 0
