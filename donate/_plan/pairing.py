"""Donation planning: one decision per input leaf, pure data in, pure data out.

`make_plan` reads the facts of one traced call (leaves, outputs, the dataflow of `dataflow`) and
decides, for every input leaf, whether it is donated and which output reuses its buffer:

1. collect what was requested (`donate_argnums`/`donate_argnames` as `jax.jit` resolved them,
   in-function annotations, inner `jax.jit` donation when adopted) and check the annotations
   (inputs aliased to each other, one source aliased into two outputs);
2. set aside what cannot be donated, as `jax.jit` does: host values (numpy arrays, Python scalars)
   are not device buffers (the program donates their copies on the device, as `jax.jit` does, and
   one no output can reuse is warned about), and inputs the computation never reads are left
   alone;
3. pair outputs with donated inputs as `jax.jit` keys them (shape, dtype, sharding, memory kind),
   strongest dataflow first (explicit `alias`, an input returned as is, an in-place update, a loop
   carry, an elementwise update, then any free output): `(b.at[0].set(1), a + 1)` pairs b, a;
4. predict what `jax.jit` does with the rest: a donor when an unpaired output has as many elements,
   otherwise unusable;
5. list the leaves the program donates (`Layout`); the lowering sets exactly these pairs and
   donors on the module (`signature.Prepared.lower`), arguments and results in the
   user's order.

After compiling, `DonationPlan.realize` folds in the aliases XLA really made and the compiled
program's memory figures.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

from donate._base import errors
from donate._base.text import is_symbolic, notebook_cell, shape_text, sharding_text
from donate._plan import dataflow
from donate._plan.decision_types import Action, Cause, Kind, Request
from donate._plan.donation_plan import (
  NOT_A_DEVICE_BUFFER,
  WRITTEN_BACK,
  DonationPlan,
  Layout,
  LeafDecision,
  LeafInfo,
  OutputInfo,
)
from donate._plan.keys import (
  compatible,
  donor_key,
  fcfs_pairs,
  grouped,
  key,
  per_device,
  shard_size,
)

# Why a paired leaf is aliased, by the strength of its dataflow link to the output.
_STRENGTH = {
  dataflow.EXPLICIT: (Cause.EXPLICIT_ALIAS, "explicit alias"),
  dataflow.IDENTITY: (Cause.RETURNED_UNCHANGED, "returned unchanged"),
  dataflow.UPDATE: (
    Cause.UPDATED_IN_PLACE,
    "updated in place (.at[].set / dynamic_update_slice / scatter)",
  ),
  dataflow.CARRY: (Cause.LOOP_CARRY, "loop carry updated in place"),
  dataflow.ELEMENTWISE: (Cause.ELEMENTWISE_UPDATE, "elementwise update of this input"),
  dataflow.KEY: (Cause.DERIVED_KEY, "a PRNG key made from this key (split / fold_in)"),
  0: (Cause.SAME_SHAPE_AND_DTYPE, "same shape and dtype (no dataflow link)"),
}

# JAX's jit donates nothing while `jax_debug_nans` is on (it may rerun the function de-optimized,
# which needs the inputs); `jax_debug_infs` does not turn donation off.
JAX_DISABLED = (
  "not donated: jax_debug_nans is on, and JAX donates nothing then (it may rerun "
  "the function de-optimized on the same inputs)"
)


def _check(
  leaves: Sequence[LeafInfo], flow: dataflow.Dataflow, outputs: Sequence[OutputInfo]
) -> list[str]:
  problems = []
  for a in flow.annotations:
    if a.kind == Request.ALIAS and a.origin is not None and a.dst_origin is not None:
      problems.append(
        errors.message(
          f"alias at {a.where} aliases two inputs to each other: {leaves[a.origin].path} "
          f"and {leaves[a.dst_origin].path}",
          fix="alias an input to a value computed from it",
        )
      )
  into: dict[int, list[int]] = collections.defaultdict(list)
  for j, explicit in enumerate(flow.out_explicit):
    for i in explicit:
      into[i].append(j)
  for i, outs in into.items():
    if len(outs) > 1:
      problems.append(
        errors.message(
          "alias of one source into two outputs",
          path=leaves[i].path,
          expected="one output per aliased buffer",
          got=", ".join(outputs[j].path for j in outs),
          fix="alias the buffer into one output only",
        )
      )
  return problems


def _requests(
  requested: dict[int, Request], flow: dataflow.Dataflow, adopt_inner: bool
) -> tuple[dict, list, dict]:
  """Adds annotations to the requests. Returns ({leaf: (request, where)}, notes, {leaf: ignored
  inner donation})."""
  sources: dict[int, tuple[Request, str | None]] = {
    i: (r if type(r) is Request else Request(r), None) for i, r in requested.items()
  }
  notes: list[str] = []
  ignored: dict[int, str] = {}
  for a in flow.annotations:
    kind = Request(a.kind)
    if a.origin is None:
      notes.append(
        f"{kind.label} at {notebook_cell(a.where)} had no effect: the value is an intermediate "
        "or a constant, not an input buffer (XLA already reuses intermediates)"
      )
    elif kind == Request.INNER_JIT and not adopt_inner:
      if a.origin not in sources:
        ignored.setdefault(a.origin, a.where)
    elif a.origin not in sources:
      sources[a.origin] = (kind, a.where)
  for i in list(ignored):
    if i in sources:
      del ignored[i]
  if ignored:
    notes.append(
      f"inner jax.jit donation ignored for {len(ignored)} input(s) the caller did not "
      "donate (jax.jit ignores it too); donate.jit(..., adopt_inner_donation=True) "
      "adopts it"
    )
  return sources, notes, ignored


def _pair(leaves, outputs, donated, flow, xla_decides: bool = False):
  """Greedy maximal matching, strongest dataflow link first. Returns {leaf: (output, strength)}.

  A linked input that an operation depending on the output still reads cannot host it
  (`Dataflow.blocked`: XLA would copy it); among equally strong links, an input that dies into
  the output comes first. The same matching as sorting every compatible (leaf, output) pair by
  (-strength, not dying, output, leaf) and taking each pair whose leaf and output are both free,
  in time near-linear in the leaves and outputs: linked pairs come from the dataflow (few per
  output), and the unlinked rest pairs each output, in order, with the first free donated leaf of
  its key. With `xla_decides` (several devices, an output sharding not given) an output with no
  dataflow link to a leaf is left to XLA: its sharding is only known after partitioning.
  """
  donated_set = set(donated)
  candidates = []
  for j, out in enumerate(outputs):
    sources = flow.out_sources[j]
    if flow.out_explicit[j]:
      sources = {**sources, **dict.fromkeys(flow.out_explicit[j], dataflow.EXPLICIT)}
    candidates.append(
      [
        (i, s)
        for i, s in sources.items()
        if s > 0 and i in donated_set and compatible(leaves[i], out)
      ]
    )
  links: dict[int, int] = {}  # leaf -> outputs linked to it (a Counter costs more to build)
  for c in candidates:
    for i, _ in c:
      links[i] = links.get(i, 0) + 1
  linked = []
  for j, found in enumerate(candidates):
    # One input linked to this output alone: first come, first served pairs the same, so
    # liveness cannot make it worse, and the walk it needs is saved (wide pytrees' common case).
    alone = len(found) == 1 and links[found[0][0]] == 1
    for i, strength in found:
      if alone:
        linked.append((-strength, False, j, i))
      elif strength >= dataflow.EXPLICIT or flow.can_host(i, j):
        linked.append((-strength, not flow.dies_into(i, j), j, i))
  pairs, taken = {}, set()
  for neg, _, j, i in sorted(linked):
    if i not in pairs and j not in taken:
      pairs[i] = (j, -neg)
      taken.add(j)
  free, one = collections.defaultdict(list), per_device(outputs)
  for i in sorted(donated_set.difference(pairs)):
    free[key(leaves[i], one)].append(i)
  for j, out in enumerate(outputs if free else ()):
    queue = free.get(key(out, one))
    if j in taken or not queue or (xla_decides and out.sharding_obj is None):
      continue
    fits = (k for k, i in enumerate(queue) if compatible(leaves[i], out))
    k = next((k for k in fits if len(queue) == 1 or flow.can_host(queue[k], j)), None)
    if k is not None:
      pairs[queue.pop(k)] = (j, 0)
      taken.add(j)
  return pairs


def _first_come(leaves, outputs, donated, flow):
  """`jax.jit`'s pairs as {leaf: (output, strength of their dataflow link)}, when only its own
  lowering runs a call."""
  pairs = {}
  for i, j in fcfs_pairs(leaves, outputs, donated).items():
    if compatible(leaves[i], outputs[j]):
      strength = flow.out_sources[j].get(i, 0) if j < len(flow.out_sources) else 0
      pairs[i] = (j, dataflow.EXPLICIT if i in flow.out_explicit[j] else strength)
  return pairs


def _donors(leaves, outputs, donated, pairs, xla_decides: bool = False) -> dict[int, int | None]:
  """`jax.jit`'s second chance: a donated input left over becomes a buffer donor when an unpaired
  output has as many elements (first come, first served); XLA decides whether to reuse it.

  With `xla_decides` (a program over several devices whose output shardings are not all given),
  `jax.jit` hands every donated input to XLA as a donor: XLA pairs them after partitioning.
  """
  if xla_decides:
    return {i: None for i in donated if i not in pairs}
  free: collections.defaultdict[Any, collections.deque] = collections.defaultdict(collections.deque)
  paired_outs = {j for j, _ in pairs.values()}
  for j, o in enumerate(outputs):
    if j not in paired_outs:
      free[donor_key(o)].append(j)
  donor_out = {}
  for i in donated:
    if i not in pairs and free[donor_key(leaves[i])]:
      donor_out[i] = free[donor_key(leaves[i])].popleft()
  return donor_out


def _layout(pairs, donor_out) -> Layout:
  """The leaves the program donates: each paired input and each buffer donor."""
  return Layout(tuple(sorted(set(pairs) | set(donor_out))))


def _unusable_reason(leaf, outputs, pairs, leaves) -> tuple[Cause, str]:
  """Why no output can reuse a donated leaf: the cause, and the nearest output in words."""
  taken = {j: i for i, (j, _) in pairs.items()}
  whole = key(leaf, per_device=False)  # the shapes the user knows
  same = [j for j, o in enumerate(outputs) if key(o, per_device=False) == whole]
  if same:
    usable = [j for j in same if compatible(leaf, outputs[j])]
    if not usable:
      o = outputs[same[0]]
      if o.memory_space != leaf.memory_space:
        inside, outside = leaf.memory_space or "Device", o.memory_space or "Device"
        return Cause.MEMORY_DIFFERS, f"not usable: memory differs (in {inside}, out {outside})"
      inside, outside = (getattr(x.sharding_obj, "memory_kind", None) for x in (leaf, o))
      if inside != outside:  # (both shardings known: `compatible`)
        return Cause.MEMORY_DIFFERS, f"not usable: memory kind differs (in {inside}, out {outside})"
      inside, outside = sharding_text(leaf.sharding_obj), sharding_text(o.sharding_obj)
      return Cause.SHARDING_DIFFERS, f"not usable: sharding differs (in {inside}, out {outside})"
    sized = [j for j in usable if shard_size(outputs[j]) == shard_size(leaf)]
    if not sized:  # another size on one device (a host value's copy is whole on each device)
      o = outputs[usable[0]]
      return Cause.SHARDING_DIFFERS, (
        f"output {o.path} has its shape and dtype, but {shard_size(o)} elements on one device "
        f"against its {shard_size(leaf)}"
      )
    j = next((j for j in sized if j in taken), None)
    if j is None:
      return Cause.NO_MATCHING_OUTPUT, f"output {outputs[sized[0]].path} is not paired with it"
    return Cause.OUTPUT_TAKEN, (
      f"output {outputs[j].path} has its shape and dtype but already reuses {leaves[taken[j]].path}"
    )
  if not outputs:
    return Cause.NO_OUTPUTS, "the function has no outputs"

  def distance(o):
    return (o.dtype != leaf.dtype, _byte_distance(o.nbytes, leaf.nbytes), o.shape != leaf.shape)

  o = min(outputs, key=distance)
  fields = []
  if o.shape != leaf.shape:
    fields.append(f"shape {shape_text(o.shape)} vs {shape_text(leaf.shape)}")
  if o.dtype != leaf.dtype:
    fields.append(f"dtype {o.dtype} vs {leaf.dtype}")
  if not fields and o.group_kind != leaf.group_kind:  # (jax.jit pairs by memory kind then)
    nearest = f"no output of its shape and dtype in its memory; nearest is {o.path}: "
    return Cause.MEMORY_DIFFERS, f"{nearest}memory kind {o.group_kind} vs {leaf.group_kind}"
  nearest = f"no output of its shape and dtype; nearest is {o.path}: "
  return Cause.NO_MATCHING_OUTPUT, nearest + ", ".join(fields)


def _byte_distance(a, b) -> int | float:
  """How far apart two byte counts are; a symbolic count (shape-polymorphic export) is 0 from an
  identical expression and farther than any constant difference otherwise.

  >>> import jax
  >>> n, = jax.export.symbolic_shape("n")
  >>> _byte_distance(16, 24), _byte_distance(4 * n, 4 * n), _byte_distance(4 * n, 16)
  (8, 0, inf)
  """
  if isinstance(a, int) and isinstance(b, int):
    return abs(a - b)
  return 0 if a == b else float("inf")


def _decide(i, leaf, source, used, pairs, donor_out, outputs, leaves, ignored) -> LeafDecision:
  """The decision of leaf `i`; `source` is its `(request, where)`, or None: not requested."""
  out = None
  if leaf.kind == Kind.REF:  # never donated nor paired; `_with_refs` says what jax.jit makes of it
    action, cause, reason = Action.REF, Cause.WRITTEN_BACK, WRITTEN_BACK
  elif not source:
    action, cause, reason = Action.KEPT, Cause.NOT_REQUESTED, "not donated"
    if i in ignored:
      cause = Cause.INNER_JIT_IGNORED
      reason = (
        f"not donated: inner jax.jit donation at {notebook_cell(ignored[i])} ignored (the "
        "caller did not donate this argument)"
      )
  elif leaf.kind == Kind.HOST:
    action, cause = Action.KEPT, Cause.NOT_A_DEVICE_BUFFER
    reason = f"{NOT_A_DEVICE_BUFFER} ({leaf.type_name})"
  elif not used:
    action, cause = Action.UNUSED, Cause.UNUSED
    reason = (
      "the computation does not read it; it stays alive, as in jax.jit "
      "(keep_unused=True donates it)"
    )
  elif i in pairs:
    j, strength = pairs[i]
    action, out, (cause, reason) = Action.ALIASED, outputs[j].path, _STRENGTH[strength]
  elif i in donor_out and donor_out[i] is None:
    action, cause = Action.DONOR, Cause.XLA_PAIRS_AFTER_PARTITIONING
    reason = "a buffer donor: XLA pairs it with an output after partitioning"
  elif i in donor_out:
    action, cause = Action.DONOR, Cause.SAME_SIZE
    reason = (
      f"no free output of its shape and dtype; XLA may reuse it for {outputs[donor_out[i]].path}"
    )
  else:
    action = Action.UNUSABLE
    cause, reason = _unusable_reason(leaf, outputs, pairs, leaves)
  request, where = source or (None, None)
  return LeafDecision(leaf, request, where, action, out, cause, reason)


def _with_refs(decisions, leaves, outputs, used, donated, xla_decides: bool, disabled: bool):
  """The decisions with every `jax.Ref` leaf's own: the call writes a ref back into its buffer.

  No output is ever paired with a ref's buffer (`make_plan` donates none). A ref in
  `donate_argnums` is what `jax.jit` makes of it: offered to XLA as a donor when an output of its
  size is still free after `jax.jit`'s own pairs (XLA then rejects the program, as under
  `jax.jit`), else an unusable donation.
  """
  refs = [i for i, leaf in enumerate(leaves) if leaf.kind == Kind.REF]
  if not refs:
    return decisions
  asked = [i for i in refs if decisions[i].requested]
  rejected = set() if disabled else _ref_donors(leaves, outputs, donated, xla_decides, asked)
  out = list(decisions)
  for i in refs:
    d = out[i]
    unused = (Action.REF, Cause.REF_UNUSED, "ref: the computation does not use it")
    action, cause, reason = (Action.REF, Cause.WRITTEN_BACK, WRITTEN_BACK) if used[i] else unused
    if d.requested and used[i] and not disabled and i in rejected:
      cause = Cause.REF_OFFERED_AS_DONOR
      reason += "; jax.jit offers it to XLA as a donor too, which XLA rejects"
    elif d.requested and used[i] and not disabled:
      action, cause = Action.UNUSABLE, Cause.REF_NOT_DONATED
      reason += "; a ref is never donated (leave it out of donate_argnums)"
    out[i] = dataclasses.replace(d, action=action, output=None, cause=cause, reason=reason)
  return tuple(out)


def _with_hosts(decisions, leaves, outputs, hosts, pairs, donor_out):
  """The decisions with each of `hosts` (requested host values the computation reads: numpy
  arrays, Python or numpy scalars) that no output can reuse made unusable, so that it is warned
  about as `jax.jit` warns: `jax.jit` donates the value's copy on the device, and so does the
  program (a buffer donor, `signature.Prepared._alias_plan`), which XLA can reuse only for an
  output of its size that the pairs and donors left free. The value itself is never consumed;
  its cause stays `NOT_A_DEVICE_BUFFER` (strict mode refuses it by that cause)."""
  if not hosts:
    return decisions
  taken = {j for j, _ in pairs.values()} | {j for j in donor_out.values() if j is not None}
  free = collections.Counter(donor_key(o) for j, o in enumerate(outputs) if j not in taken)
  out = list(decisions)
  for i in hosts:
    if _claim(free, leaves[i]):
      continue
    _, why = _unusable_reason(leaves[i], outputs, pairs, leaves)
    reason = (
      f"not a device buffer ({leaves[i].type_name}); its copy on the device is donated, as "
      f"by jax.jit, and {why}"
    )
    out[i] = dataclasses.replace(out[i], action=Action.UNUSABLE, reason=reason)  # same cause
  return tuple(out)


def _ref_donors(leaves, outputs, donated, xla_decides: bool, refs) -> set[int]:
  """The requested refs `jax.jit` offers XLA as buffer donors (`mlir._set_up_aliases`): after
  its first come, first served aliases, each donated input left over (refs among them, in
  order) takes a free output of its size."""
  if not refs:
    return set()
  fcfs = fcfs_pairs(leaves, outputs, donated)
  aliased = {j for j in fcfs.values() if not xla_decides or outputs[j].sharding_obj is not None}
  free = collections.Counter(donor_key(o) for j, o in enumerate(outputs) if j not in aliased)
  rejected = set()
  for i in sorted(set(donated).difference(fcfs).union(refs)):
    if _claim(free, leaves[i]) and i in refs:
      rejected.add(i)
  return rejected


def _claim(free: collections.Counter, leaf) -> bool:
  """Takes one of the free outputs of the leaf's donor key (`free`: how many per key), if any is
  left: `jax.jit`'s second chance, a buffer donor."""
  k = donor_key(leaf)
  if free[k] > 0:
    free[k] -= 1
    return True
  return False


def _disabled(leaf, source) -> LeafDecision:
  """A requested leaf kept because JAX donates nothing while `jax_debug_nans` is on."""
  request, where = source
  return LeafDecision(leaf, request, where, Action.KEPT, None, Cause.JAX_DEBUG_NANS, JAX_DISABLED)


def make_plan(
  function: str,
  leaves: Sequence[LeafInfo],
  outputs: Sequence[OutputInfo],
  requested: dict[int, Request],
  flow: dataflow.Dataflow,
  *,
  keep_unused: bool = False,
  adopt_inner: bool = False,
  xla_decides: bool = False,
  first_come: str = "",
  disabled: bool = False,
) -> DonationPlan:
  """Decides every input leaf; raises one DonationError listing every misuse found.

  Args:
    function: the function's name, for messages.
    leaves: facts about every input leaf, in flat order.
    outputs: facts about every output leaf, in flat order.
    requested: leaf index -> how donation was requested (`Request.DONATE_ARGNUMS` or
      `DONATE_ARGNAMES`).
    flow: the dataflow of the traced program (`dataflow.analyze`).
    keep_unused: keep unread inputs in the computation (as `jax.jit(keep_unused=True)`).
    adopt_inner: honour `jax.jit(donate_argnums=...)` of inner calls on the outer inputs.
    xla_decides: the program spans several devices and not every output sharding is given:
      `jax.jit` offers every donated input to XLA as a donor (see `_donors`).
    first_come: why `jax.jit`'s own lowering runs the call (custom layouts, ...), in words: pair
      first come, first served as `jax.jit` does, and say so in a note.
    disabled: JAX donates nothing in this call (`jax_debug_nans` is on): every requested leaf is
      kept, with that cause (`Cause.JAX_DEBUG_NANS`).
  """
  leaves, outputs = grouped(leaves, outputs)
  sources, notes, ignored = _requests(requested, flow, adopt_inner)
  problems = _check(leaves, flow, outputs)
  if problems:
    raise errors.DonationError("\n".join(problems))
  # jax.jit prunes no input of a program with symbolic shapes: each one stays in the module.
  keep_unused = keep_unused or any(
    is_symbolic(d) for shape in {leaf.shape for leaf in leaves} for d in shape
  )
  used = [keep_unused or u for u in flow.used]
  donated = [] if disabled else [i for i in sorted(sources) if used[i] and leaves[i].is_array]
  hosts = (
    [] if disabled else [i for i in sorted(sources) if used[i] and leaves[i].kind == Kind.HOST]
  )
  copies = {}  # host values whose copies jax.jit's own first come, first served pairs take
  if not first_come:
    pairs = _pair(leaves, outputs, donated, flow, xla_decides)
  else:
    pairs = _first_come(leaves, outputs, sorted([*donated, *hosts]), flow)
    copies = {i: pairs.pop(i) for i in hosts if i in pairs}
    notes.append(
      f"dataflow pairing not applied: {first_come}; outputs reuse donated buffers "
      "first come, first served"
    )
  # A buffer asked for by `alias` alone that no output can take is an error (see `signature`),
  # never a donor; one `donate_argnums` asks for is offered as `jax.jit` offers it.
  explicit = set().union(*flow.out_explicit) if flow.out_explicit else set()
  rest = [i for i in donated if i not in explicit or sources[i][0] != Request.ALIAS]
  both = {**pairs, **copies} if copies else pairs
  donor_out = _donors(leaves, outputs, rest, both, xla_decides)
  layout = _layout(pairs, donor_out)
  decisions = tuple(
    _disabled(leaf, sources[i])
    if disabled and sources.get(i) and leaf.is_array
    else _decide(i, leaf, sources.get(i), used[i], both, donor_out, outputs, leaves, ignored)
    for i, leaf in enumerate(leaves)
  )
  if not xla_decides:  # else jax.jit offers the host copies to XLA with the rest: never warned
    decisions = _with_hosts(decisions, leaves, outputs, [i for i in hosts if i not in copies],
                            both, donor_out)  # fmt: skip
  decisions = _with_refs(decisions, leaves, outputs, used, donated, xla_decides, bool(disabled))
  return DonationPlan(function, decisions, tuple(outputs), tuple(notes), layout)
