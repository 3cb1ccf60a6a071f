"""The planning passes: from live ranges to comm-buffer pools per (kind, group) and the arena.

`plan` is pure data in, pure data out. It reads as a list of passes:

1. `classify`: give every value from the liveness walk a name, a role and a live range;
2. `copy_out`: comm buffers never leave the program; an output that is one gets copied out;
3. `group`: one pool per (kind, group) of comm buffers, one arena for the rest, and in-place
   reuse of dying regular buffers by elementwise results (comm buffers take no part);
4. `allocate`: offsets per pool from `assign_offsets`, each pool planned in isolation.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import cast

from donate._base import errors as _errors
from donate._planner.liveness import Liveness, Value
from donate._planner.memory_plan import MemoryPlan
from donate._planner.offsets import assign_offsets
from donate._planner.records import Allocation, Buffer, Copy, LiveRange, Pool

ARENA = "arena"
_VALIDATE_MAX = 600  # pairwise overlap asserts up to this many allocations per pool


# Pass 1: classify -------------------------------------------------------------------------------


def classify(
  lv: Liveness,
  *,
  arg_names: Sequence[str],
  out_names: Sequence[str],
  donated: set[int],
  comm: Mapping[int, tuple[str, tuple[str, ...]]],
) -> list[Buffer]:
  """Names every value and gives it a role and the live range the planner reserves for it.

  Returns one buffer per value, in the order of `lv.values`.

  Invariant: caller-owned inputs live over the whole program, outputs to its end, every other
  value from its producer to its last use. A comm argument keeps its argument role (and its kind
  and group) for `copy_out` to deal with.
  """
  used: set[str] = set()
  end, buffers = lv.num_steps, []
  for v in lv.values:
    name = _unique(_value_name(v, arg_names, out_names), used)
    is_arg = v.producer in ("argument", "constant")
    is_donated = is_arg and (v.id in lv.donated or v.arg_index in donated)
    if is_arg:
      role = "donated input" if is_donated else "input"
    else:
      role = "comm" if v.id in comm else "output" if v.is_output else "regular"
    keep = (v.is_output and role != "comm") or role == "input"
    kind, group = comm.get(v.id, (None, None))
    buffers.append(
      Buffer(
        name,
        role,
        v.producer,
        v.shape,
        v.dtype,
        v.nbytes,
        LiveRange(v.start, end if keep else v.last_use),
        v.scope,
        kind,
        group,
        v.is_output,
      )
    )
  assert all(b.live_range.end <= end for b in buffers)
  return buffers


def _value_name(v: Value, arg_names: Sequence[str], out_names: Sequence[str]) -> str:
  if v.arg_index is not None and v.arg_index < len(arg_names):
    return arg_names[v.arg_index]
  if v.out_index is not None and v.out_index < len(out_names):
    return out_names[v.out_index]
  return f"buf{v.id}"


def _unique(name: str, used: set[str]) -> str:
  candidate, n = name, 1
  while candidate in used:
    candidate, n = f"{name}#{n}", n + 1
  used.add(candidate)
  return candidate


# Pass 2: copy comm buffers in and out ----------------------------------------------------------


def copy_out(
  buffers: list[Buffer], lv: Liveness, *, strict: bool
) -> tuple[list[Buffer], list[Copy]]:
  """Comm buffers never leave the program: each comm output gets a regular copy at its last use.

  Comm arguments get the mirror image: a comm copy made at step 0 that lives as long as the
  argument is read. In strict mode both raise one `DonationError` naming every such buffer.
  New buffers are appended, so `buffers[i]` still belongs to `lv.values[i]`.

  Invariant (asserted): afterwards every comm buffer is produced and consumed inside the program.
  """
  outs = [i for i, b in enumerate(buffers) if b.is_comm and b.is_output]
  args = [i for i, b in enumerate(buffers) if not b.is_comm and b.kind is not None]
  if strict and (outs or args):
    raise _errors.DonationError(
      _errors.message(
        "comm buffers cannot be program outputs or arguments (their pool is freed when the "
        "program ends)",
        path=", ".join(buffers[i].name for i in outs + args),
        expected="values that feed a collective and are consumed inside the program",
        got="; ".join(
          [f"{buffers[i].name} ({buffers[i].type_str}) returned" for i in outs]
          + [f"{buffers[i].name} ({buffers[i].type_str}) an argument" for i in args]
        ),
        fix="return the collective's result instead, or pass strict=False to let the plan copy "
        "comm buffers out (and arguments in)",
      )
    )
  buffers, copies, used = list(buffers), [], {b.name for b in buffers}
  for i in outs:
    b, step = buffers[i], buffers[i].live_range.end - 1
    source = _unique(f"buf{lv.values[i].id}", used)  # the copy takes over the output's name
    buffers[i] = dataclasses.replace(b, name=source, is_output=False)
    buffers.append(
      dataclasses.replace(
        b,
        role="output",
        producer="copy-out",
        kind=None,
        group=None,
        scope="",
        live_range=LiveRange(step, lv.num_steps),
      )
    )
    copies.append(Copy(source, b.name, step, "out"))
  for i in args:
    b = buffers[i]
    target = _unique(f"{b.name}.symm", used)
    buffers[i] = dataclasses.replace(b, kind=None, group=None)
    buffers.append(
      dataclasses.replace(
        b,
        name=target,
        role="comm",
        producer="copy-in",
        is_output=False,
        live_range=LiveRange(0, lv.values[i].last_use),
      )
    )
    copies.append(Copy(b.name, target, 0, "in"))
  assert not any(
    b.is_comm and (b.is_output or b.producer in ("argument", "constant")) for b in buffers
  )
  return buffers, copies


# Pass 3: group ----------------------------------------------------------------------------------


def pool_key(b: Buffer) -> tuple[str, tuple[str, ...]]:
  # A comm buffer has both its kind and its group (`classify`).
  return cast(tuple[str, tuple[str, ...]], (b.kind, b.group)) if b.is_comm else ("regular", ())


def group(buffers: Sequence[Buffer]) -> dict[tuple[str, tuple[str, ...]], list[int]]:
  """Indices of `buffers` per pool key, comm pools in order of first use, the arena last."""
  pools: dict[tuple[str, tuple[str, ...]], list[int]] = collections.defaultdict(list)
  for i in sorted(range(len(buffers)), key=lambda i: buffers[i].live_range.start):
    pools[pool_key(buffers[i])].append(i)
  arena = pools.pop(("regular", ()), [])
  return {**pools, ("regular", ()): arena}


def inplace_reuse(
  buffers: Sequence[Buffer], lv: Liveness, index: Mapping[int, int]
) -> dict[int, int]:
  """Chooses in-place reuse: buffer index -> index of the dying buffer whose memory it takes.

  A regular elementwise result may take over an operand of the same size that dies at that very
  step (an intermediate or a donated input). Each buffer is taken over at most once.

  Invariant (asserted): comm buffers, caller-owned inputs and copies take no part.
  """
  takes: dict[int, int] = {}
  taken: set[int] = set()
  for cand in lv.inplace:
    out = index.get(cand.out)
    for op in (index.get(v) for v in cand.operands):
      if (
        out is not None
        and op is not None
        and op not in taken
        and _can_take_over(buffers[out], buffers[op], cand.step)
      ):
        takes[out] = op
        taken.add(op)
        break
  assert not any(buffers[i].is_comm or buffers[j].is_comm for i, j in takes.items())
  return takes


def _can_take_over(out: Buffer, op: Buffer, step: int) -> bool:
  """Whether `out`, produced at `step`, may be written into `op`'s memory."""
  return (
    out.role in ("regular", "output")
    and out.producer != "copy-out"
    and op.role in ("regular", "donated input")
    and op.nbytes == out.nbytes
    and op.live_range.end == step + 1
    and out.live_range.start == step
  )


def _slots(indices: Sequence[int], buffers: Sequence[Buffer], takes: Mapping[int, int]):
  """Merges in-place chains into slots: (root of each index, {root: (size, start, end)})."""
  root: dict[int, int] = {}
  for i in sorted(indices, key=lambda i: buffers[i].live_range.start):
    root[i] = root.get(takes[i], takes[i]) if i in takes else i
  span: dict[int, list[int]] = {}
  for i in indices:
    r, lr = root[i], buffers[i].live_range
    s = span.setdefault(r, [buffers[r].nbytes, lr.start, lr.end])
    s[1], s[2] = min(s[1], lr.start), max(s[2], lr.end)
  return root, span


# Pass 4: allocate -------------------------------------------------------------------------------


def allocate(
  name: str,
  key: tuple[str, tuple[str, ...]],
  indices: Sequence[int],
  buffers: Sequence[Buffer],
  takes: Mapping[int, int],
  *,
  alignment: int,
  time_limit: float,
) -> Pool:
  """Assigns offsets to one pool's buffers, in isolation from every other pool.

  Invariant (asserted for pools of up to a few hundred buffers): two buffers whose live ranges
  overlap never overlap in memory, unless one takes the other over in place.
  """
  root, span = _slots(indices, buffers, takes)
  roots = list(span)
  if roots:
    result = assign_offsets(
      [span[r][0] for r in roots],
      [span[r][1] for r in roots],
      [span[r][2] for r in roots],
      alignment=alignment,
      time_limit=time_limit,
    )
    offset_of = dict(zip(roots, result.offsets))
    size, bound, optimal, method = result.height, result.lower_bound, result.optimal, result.method
  else:
    offset_of, size, bound, optimal, method = {}, 0, 0, True, "empty"
  order = sorted(indices, key=lambda i: (buffers[i].live_range.start, i))
  allocs = tuple(
    Allocation(buffers[i], offset_of[root[i]], buffers[takes[i]].name if i in takes else None)
    for i in order
  )
  assert all(a.offset % alignment == 0 and a.offset + a.nbytes <= size for a in allocs)
  if len(allocs) <= _VALIDATE_MAX:
    _assert_disjoint(allocs)
  return Pool(name, key[0], key[1], size, bound, allocs, optimal, method)


def _assert_disjoint(allocs: Sequence[Allocation]) -> None:
  chain = {a.name: a.reuses for a in allocs}

  def related(x: str, y: str) -> bool:
    return any(_reaches(chain, p, q) for p, q in ((x, y), (y, x)))

  for i, a in enumerate(allocs):
    for b in allocs[i + 1 :]:
      if (
        a.live_range.overlaps(b.live_range)
        and a.offset < b.offset + b.nbytes
        and b.offset < a.offset + a.nbytes
      ):
        assert related(a.name, b.name), f"{a} and {b} overlap in time and memory"


def _reaches(chain: Mapping[str, str | None], src: str | None, dst: str) -> bool:
  while src is not None:
    if src == dst:
      return True
    src = chain.get(src)
  return False


def pool_name(kind: str, group: Sequence[str]) -> str:
  """``pool_<kind>_<axes>`` as an identifier, e.g. ``pool_symm_mem_x``."""
  return re.sub(r"\W", "_", "_".join(["pool", kind, *map(str, group)]))


def plan(
  lv: Liveness,
  *,
  name: str,
  arg_names: Sequence[str],
  out_names: Sequence[str],
  donated: set[int],
  comm: Mapping[int, tuple[str, tuple[str, ...]]],
  strict: bool,
  alignment: int,
  time_limit: float,
  inplace: bool = True,
) -> MemoryPlan:
  """Runs the passes: classify, copy out, group, allocate.

  Args:
    lv: the liveness walk of the program.
    name: the function's name, for the listing.
    arg_names, out_names: names of the flat arguments and outputs.
    donated: flat argument indices the program may overwrite.
    comm: value id -> (kind, group) for values that must live in a comm pool.
    strict: raise instead of copying comm buffers in or out.
    alignment: every offset is a multiple of this.
    time_limit: seconds each pool's offset search may take.
    inplace: let elementwise results take over dying regular buffers.
  """
  if alignment < 1:
    raise _errors.DonationError(
      _errors.message(
        "alignment must be a positive number of bytes",
        expected="an int >= 1",
        got=repr(alignment),
        fix="pass e.g. alignment=64",
      )
    )
  buffers = classify(lv, arg_names=arg_names, out_names=out_names, donated=donated, comm=comm)
  buffers, copies = copy_out(buffers, lv, strict=strict)
  index = {v.id: i for i, v in enumerate(lv.values)}  # `copy_out` keeps value order
  takes = inplace_reuse(buffers, lv, index) if inplace else {}
  pools = [
    allocate(
      ARENA if key == ("regular", ()) else pool_name(*key),
      key,
      idx,
      buffers,
      takes,
      alignment=alignment,
      time_limit=time_limit,
    )
    for key, idx in group(buffers).items()
  ]
  return MemoryPlan(
    name, tuple(buffers), tuple(pools[:-1]), pools[-1], tuple(copies), lv.steps, alignment
  )
