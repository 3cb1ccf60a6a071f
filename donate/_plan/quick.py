"""The pairs of a plain program, found without building its plan.

`dataflow.analyze` and `pairing.make_plan` serve every program: annotations at any depth, loops,
host values, refs, shardings over many devices, and a record with words for each leaf. Most calls
are simpler: device arrays on one device, a program of array operations and plain calls, donation
asked for by `donate_argnums` alone. For those, `dataflow_of` walks the program as
`dataflow._Walker` does (the same rules, without the bookkeeping annotations need) and `pairs_of`
pairs it as `pairing._pair`, `pairing._donors` and `keys.fcfs_pairs` do, over a shape, dtype and
size per leaf and output (on one device, with the output shardings left to the program, nothing
else of them decides a pair). The plan with its words is made when it is first read
(`_jit/quick.py`); this is what a lowering needs before it.

Each function returns None where a program leaves that domain (an annotation or a mark for
symmetric memory, a loop, a branch, a donation no output can take...): the full planner then
plans it. Both must agree wherever this answers; the test suite checks that on every call
(`DONATE_CHECK_QUICK`, set by the repository's `conftest.py`).
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Sequence
from typing import Any

from jax.extend import core as jcore

from donate._base import compat as _compat
from donate._base import primitives as _primitives
from donate._base.jaxprs import open_jaxpr
from donate._plan import dataflow

_EMPTY = dataflow._EMPTY  # noqa: SLF001 (the same never-mutated empty sources)
_PASS = _primitives.IDENTITY | _primitives.TRANSPARENT
_OWN = _primitives.OWN  # donate_buffer, alias and with_symmetric's marks
_LOOPS = frozenset({"scan", "while", "cond"})
_JAXPRS = (jcore.Jaxpr, jcore.ClosedJaxpr)


class _Unplain(Exception):
  """Raised by the walk where the program leaves the quick domain."""


def dataflow_of(closed, skip: int) -> dataflow.Dataflow | None:
  """`dataflow.analyze(closed, skip)` for a program without annotations, loops or branches
  (calls are walked into, as the full walker does); None for any other."""
  jaxpr = closed.jaxpr
  n = len(jaxpr.invars) - skip
  try:
    sources = _walk(jaxpr, [_EMPTY] * skip + [_link(i, dataflow.IDENTITY) for i in range(n)])
  except _Unplain:
    return None
  named = set().union(*sources)
  used = (True,) * n if len(named) == n else tuple(_compat.used_inputs(jaxpr)[skip:])
  none: frozenset[int] = frozenset()
  hosting = dataflow.LazyHosting(jaxpr, skip)
  return dataflow.Dataflow((), tuple(sources), (none,) * len(sources), used, hosting)


def _walk(jaxpr, sources_in: list[dict[int, int]]) -> list[dict[int, int]]:
  """The sources of `jaxpr.outvars` given those of its invars (`dataflow._Walker.walk`'s rules)."""
  sources: dict[Any, dict[int, int]] = dict(zip(jaxpr.invars, sources_in))
  get, literal = sources.get, jcore.Literal
  elementwise_only = dataflow._ELEMENTWISE_ONLY  # noqa: SLF001
  weak, strong = dataflow.ELEMENTWISE, dataflow.EXPLICIT
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    outvars = eqn.outvars
    if name in elementwise_only and len(outvars) == 1:  # most equations: `_elementwise` inline
      shape = getattr(outvars[0].aval, "shape", ())
      same = None
      for atom in eqn.invars:
        if isinstance(atom, literal):
          continue
        s = get(atom)
        if s and getattr(atom.aval, "shape", None) == shape:
          same = s if same is None else dataflow._merge(same, s)  # noqa: SLF001
      if same is not None:  # (a value without sources has none in `sources`)
        if len(same) == 1:  # `dataflow._cap` of one link
          ((k, link),) = same.items()
          same = same if link <= weak or link >= strong else _link(k, weak)
        else:
          same = dataflow._cap(same, weak)  # noqa: SLF001
        sources[outvars[0]] = same
      continue
    ins = [_EMPTY if isinstance(v, literal) else get(v, _EMPTY) for v in eqn.invars]
    if name in _OWN or name in _LOOPS:
      raise _Unplain
    if name in _PASS and len(ins) == len(outvars):
      outs = ins
    elif name in _primitives.IN_PLACE:
      outs = [dataflow._cap(ins[0], dataflow.UPDATE)] + [_EMPTY] * (len(outvars) - 1)  # noqa: SLF001
    elif name in _primitives.ELEMENTWISE and len(outvars) == 1:
      outs = [dataflow._elementwise(eqn, ins)]  # noqa: SLF001
    else:
      outs = dataflow.key_sources(name, ins, len(outvars)) or _call(eqn, ins)
    sources.update(zip(outvars, outs))
  return [_EMPTY if isinstance(v, literal) else get(v, _EMPTY) for v in jaxpr.outvars]


def _link(i: int, strength: int) -> dict[int, int]:
  """The sources `{i: strength}`, one dict for every walk (sources are never changed once made:
  a wide pytree's step makes thousands, each an object Python's collector counts). The list of
  them grows by replacement, never in place, so a thread reading it never sees it half made."""
  links = _LINKS[strength]
  if i < len(links):
    return links[i]
  if i >= _LINKS_KEPT:
    return {i: strength}
  size = min(max(i + 1, 2 * len(links), 64), _LINKS_KEPT)
  links = links + [{k: strength} for k in range(len(links), size)]
  _LINKS[strength] = links
  return links[i]


_LINKS: dict[int, list[dict[int, int]]] = {dataflow.IDENTITY: [], dataflow.ELEMENTWISE: []}
_LINKS_KEPT = 4096  # the leaves whose one-link sources are kept


def _call(eqn, ins):
  """`dataflow._Walker._call` without annotations: a call's body is walked into; an equation
  with any other sub-jaxpr, or donating its operands, leaves the domain."""
  params = eqn.params
  if any(params.get("donated_invars") or ()):
    raise _Unplain
  for key in dataflow._CALL_PARAMS:  # noqa: SLF001
    sub = open_jaxpr(params.get(key))
    if sub is not None and len(sub.invars) == len(ins):
      outs = _walk(sub, ins)
      if len(outs) == len(eqn.outvars):
        return outs
  for value in params.values():
    for v in value if isinstance(value, tuple) else (value,):
      if isinstance(v, _JAXPRS):
        raise _Unplain
  return [_EMPTY] * len(eqn.outvars)


def pairs_of(
  flow: dataflow.Dataflow,
  leaves: Sequence[tuple],
  outputs: Sequence[tuple],
  requested: Collection[int],
  keep_unused: bool,
) -> tuple[dict[int, int], dict[int, int], dict[int, int]] | None:
  """`(pairs, donors, first_come)`: {leaf: output} of dataflow pairing, {leaf: output} of the
  buffer donors after it, and {leaf: output} of `jax.jit`'s first-come pairs; None when a
  requested leaf the program reads is left unusable (the full plan says why).

  For device leaves on one device and outputs whose shardings the program decides, each given
  as `((shape, dtype), elements, ...)`: a leaf and an output match by shape and dtype alone
  (`keys.key` and `keys.compatible` there), a donor by elements (`keys.donor_key`). The same
  matching as `pairing._pair`, `pairing._donors` and `keys.fcfs_pairs` (see them) over those
  facts.
  """
  used = (True,) * len(leaves) if keep_unused else flow.used
  donated = [i for i in sorted(requested) if used[i]]
  pairs, taken = _linked(flow, leaves, outputs, set(donated))
  free: dict[tuple, collections.deque] = {}
  for i in donated:
    if i not in pairs:
      free.setdefault(leaves[i][0], collections.deque()).append(i)
  for j, out in enumerate(outputs if free else ()):
    queue = free.get(out[0])
    if j in taken or not queue:
      continue
    k = next((k for k in range(len(queue)) if len(queue) == 1 or flow.can_host(queue[k], j)), None)
    if k is not None:
      pairs[queue[k]] = j
      del queue[k]
      taken.add(j)
  donors = _donors(leaves, outputs, donated, pairs, taken)
  return None if donors is None else (pairs, donors, _first_come(leaves, outputs, donated))


def first_come_of(
  flow: dataflow.Dataflow,
  leaves: Sequence[tuple],
  outputs: Sequence[tuple],
  requested: Collection[int],
  keep_unused: bool,
) -> tuple[dict[int, int], dict[int, int]] | None:
  """`(pairs, donors)` of `jax.jit`'s own first-come pairing ({leaf: output} of
  `keys.fcfs_pairs`, then of the buffer donors after it, as `pairing.make_plan` makes them with
  `first_come`), from shapes, dtypes and sizes alone (no dataflow link is read); None when a
  requested leaf the program reads is left unusable. Facts as for `pairs_of`."""
  used = (True,) * len(leaves) if keep_unused else flow.used
  donated = [i for i in sorted(requested) if used[i]]
  pairs = _first_come(leaves, outputs, donated)
  donors = _donors(leaves, outputs, donated, pairs, set(pairs.values()))
  return None if donors is None else (pairs, donors)


def _donors(leaves, outputs, donated, pairs, taken) -> dict[int, int] | None:
  """`pairing._donors`: each donated leaf left unpaired, in order, offered to the first output
  not `taken` with as many elements; None when one finds none (unusable)."""
  by_size: dict[Any, collections.deque] = {}
  for j, out in enumerate(outputs):
    if j not in taken:
      by_size.setdefault(out[1], collections.deque()).append(j)
  donors = {}
  for i in donated:
    if i not in pairs:
      queue = by_size.get(leaves[i][1])
      if not queue:
        return None  # unusable
      donors[i] = queue.popleft()
  return donors


def _linked(flow, leaves, outputs, donated: set[int]) -> tuple[dict[int, int], set[int]]:
  """`pairing._pair`'s first step: outputs paired with the donated inputs their dataflow links
  them to, strongest link first."""
  candidates = []
  links: dict[int, int] = {}
  for j, sources in enumerate(flow.out_sources):
    if not sources:
      continue
    key = outputs[j][0]
    found = [(i, s) for i, s in sources.items() if s > 0 and i in donated and leaves[i][0] == key]
    for i, _ in found:
      links[i] = links.get(i, 0) + 1
    candidates.append((j, found))
  linked = []
  for j, found in candidates:
    alone = len(found) == 1 and links[found[0][0]] == 1
    for i, strength in found:
      if alone:
        linked.append((-strength, False, j, i))
      elif flow.can_host(i, j):
        linked.append((-strength, not flow.dies_into(i, j), j, i))
  pairs: dict[int, int] = {}
  taken: set[int] = set()
  for _, _, j, i in sorted(linked):
    if i not in pairs and j not in taken:
      pairs[i] = j
      taken.add(j)
  return pairs, taken


def _first_come(leaves, outputs, donated: list[int]) -> dict[int, int]:
  """`keys.fcfs_pairs`: each output, in order, takes the first donated leaf of its key left."""
  queues: dict[tuple, collections.deque] = {}
  for i in donated:
    queues.setdefault(leaves[i][0], collections.deque()).append(i)
  pairs = {}
  for j, out in enumerate(outputs):
    queue = queues.get(out[0])
    if queue:
      pairs[queue.popleft()] = j
  return pairs
