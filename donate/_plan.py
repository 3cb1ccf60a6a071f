"""Donation planning: one decision per input leaf, pure data in, pure data out.

`make_plan` reads the facts of one traced call (leaves, outputs, the dataflow of `_dataflow`) and
decides, for every input leaf, whether it is donated and which output reuses its buffer:

1. collect what was requested (`donate_argnums`/`donate_argnames` as `jax.jit` resolved them,
   in-function annotations, inner `jax.jit` donation when adopted) and check the annotations
   (inputs aliased to each other, one source aliased into two outputs);
2. set aside what cannot be donated, as `jax.jit` does: host values (numpy arrays, Python scalars)
   are not device buffers, and inputs the computation never reads are left alone;
3. pair outputs with donated inputs as `jax.jit` keys them (shape, dtype, sharding, memory kind),
   strongest dataflow first (explicit `alias`, an input returned as is, an in-place update, a loop
   carry, an elementwise update, then any free output), so `(b.at[0].set(1), a + 1)` pairs
   b -> [0] and a -> [1];
4. predict what `jax.jit` does with the rest: a donor when an unpaired output has as many elements,
   otherwise unusable;
5. lay the call out so that `jax.jit`'s first-come, first-served pairing yields exactly these pairs:
   the inputs stay in order, the outputs of the inner computation are reordered when needed.

After compiling, `DonationPlan.realize` folds in the aliases XLA really made and the compiled
program's memory figures.
"""

from __future__ import annotations

import collections
import dataclasses
import html
from typing import Any, Sequence

import numpy as np

from donate import _copies
from donate import _dataflow
from donate import _errors

ALIASED, DONOR, KEPT, UNUSABLE, UNUSED = "aliased", "donor", "kept", "unusable", "unused"
DEVICE, ABSTRACT, HOST = "device", "abstract", "host"

_STRENGTH_WORDS = {
    _dataflow.EXPLICIT: "explicit alias",
    _dataflow.IDENTITY: "returned unchanged",
    _dataflow.UPDATE: "updated in place (.at[].set / dynamic_update_slice / scatter)",
    _dataflow.CARRY: "loop carry updated in place",
    _dataflow.ELEMENTWISE: "elementwise update of this input",
    0: "same shape and dtype (no dataflow link)",
}
_WIDTH = 100  # the plan's text fits in this many columns


@dataclasses.dataclass(frozen=True, slots=True)
class LeafInfo:
  """Static facts about one input leaf.

  `kind` is "device" (a `jax.Array`: donating consumes it), "abstract" (a `jax.ShapeDtypeStruct`:
  planned as if it were an array) or "host" (numpy arrays, Python and numpy scalars: `jax.jit`
  copies them to the device, so the caller's value is never consumed).
  """
  path: str
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  sharding: str
  memory_kind: str | None
  kind: str
  type_name: str
  sharding_obj: Any = dataclasses.field(default=None, compare=False)

  @property
  def is_array(self) -> bool:
    return self.kind != HOST


@dataclasses.dataclass(frozen=True, slots=True)
class OutputInfo:
  """Static facts about one output leaf (`sharding_obj` when `out_shardings` fixes it)."""
  path: str
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  sharding_obj: Any = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class LeafDecision:
  """What happens to one input leaf.

  Attributes:
    path: the leaf's pytree path, e.g. `params['w']`.
    shape, dtype, nbytes, sharding, memory_kind: the leaf's facts.
    requested: donation was asked for (`donate_argnums`/`donate_argnames` or an annotation).
    source: how it was asked for ("donate_argnums", "donate_argnames", "donate_buffer at f.py:3", ...).
    action: "aliased" (output `output` reuses the buffer), "donor" (given to XLA to reuse for any
      output), "kept" (not donated: not requested, or not a device buffer), "unused" (requested,
      but the computation does not read it: it stays alive, as in `jax.jit`) or "unusable"
      (requested but nothing can reuse it; it stays alive).
    output: the output path that reuses the buffer, if any.
    reason: why, in words.

  >>> import jax.numpy as jnp, donate
  >>> f = donate.jit(lambda w, x: w - x, donate_argnums=0)
  >>> d = f.plan(jnp.ones(4), jnp.ones(4)).decisions[0]
  >>> d.path, d.action, d.output, d.reason, d.consumed
  ('w', 'aliased', 'out', 'elementwise update of this input', True)
  """
  path: str
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  sharding: str
  memory_kind: str | None
  requested: bool
  source: str
  action: str
  output: str | None
  reason: str

  @property
  def consumed(self) -> bool:
    """Whether the caller's array is deleted by the call."""
    return self.action in (ALIASED, DONOR)


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryStats:
  """The compiled program's own memory figures (`Compiled.memory_analysis()`), in bytes.

  >>> import jax.numpy as jnp, donate
  >>> m = donate.jit(lambda a: a * 2, donate_argnums=0).plan(jnp.ones(256)).memory
  >>> m.argument, m.output, m.alias, m.temp, m.peak
  (1024, 1024, 1024, 0, 1024)
  """
  argument: int
  output: int
  alias: int
  temp: int
  generated_code: int

  @property
  def peak(self) -> int:
    """Arguments + outputs - aliased + temporaries: what the step holds at once."""
    return self.argument + self.output - self.alias + self.temp

  @classmethod
  def from_compiled(cls, compiled) -> "MemoryStats | None":
    stats = compiled.memory_analysis()
    if stats is None:
      return None
    return cls(int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes),
               int(stats.alias_size_in_bytes), int(stats.temp_size_in_bytes),
               int(stats.generated_code_size_in_bytes))


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
  """How the call is laid out for `jax.jit` when donate re-lays it out.

  The inner computation takes the leaves in their own order and donates exactly `donated`;
  its output k is the user's output `out_order[k]` (None: the user's order).
  """
  donated: tuple[int, ...]
  out_order: tuple[int, ...] | None


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class DonationPlan:
  """One decision per input leaf, the alias map, totals, and the compiled memory figures.

  `str(plan)` is a readable table (at most 100 columns); in a notebook the plan renders as HTML.

  >>> import jax.numpy as jnp, donate
  >>> f = donate.jit(lambda a, b: (b.at[0].set(1.0), a + 1.0), donate_argnums=(0, 1))
  >>> plan = f.plan(jnp.zeros(4), jnp.zeros(4))
  >>> [(d.path, d.action, d.output) for d in plan.decisions]
  [('a', 'aliased', 'out[1]'), ('b', 'aliased', 'out[0]')]
  >>> plan.bytes_requested, plan.bytes_reused
  (32, 32)
  """
  function: str
  decisions: tuple[LeafDecision, ...]
  outputs: tuple[OutputInfo, ...]
  notes: tuple[str, ...]
  layout: Layout
  memory: MemoryStats | None = None
  compiled: bool = False
  collective_memory_bytes: int = 0  # bytes of values marked for symmetric memory (unpacked)
  copies: tuple = ()  # the copies XLA added (`_copies.CopyRecord`), once compiled
  copy_threshold: int = 65536  # the smallest copy `copies` reports, in bytes
  placements: Any = None  # where marked values landed on a GPU target (`_symm` report)

  @property
  def bytes_requested(self) -> int:
    """Bytes of every leaf whose donation was asked for."""
    return sum(d.nbytes for d in self.decisions if d.requested)

  @property
  def bytes_reused(self) -> int:
    """Bytes of donated leaves whose buffer an output really reuses."""
    return sum(d.nbytes for d in self.decisions if d.action == ALIASED)

  @property
  def aliases(self) -> dict[str, str]:
    """The alias map: output path -> input path whose buffer it takes over."""
    return {d.output: d.path for d in self.decisions
            if d.output is not None and d.action in (ALIASED, DONOR)}

  @property
  def unusable(self) -> tuple[LeafDecision, ...]:
    return tuple(d for d in self.decisions if d.action == UNUSABLE)

  def pairs(self) -> dict[int, int]:
    """{input leaf index: output index} of the planned aliases."""
    index = {o.path: j for j, o in enumerate(self.outputs)}
    return {i: index[d.output] for i, d in enumerate(self.decisions) if d.action == ALIASED}

  def realize(self, realized: dict[int, int], memory: MemoryStats | None,
              shardings: dict[int, tuple[str, str]] | None = None) -> "DonationPlan":
    """Folds in what the compiled program does: realized[leaf index] = output index it aliases.

    A planned alias XLA did not make becomes "unusable" with the reason (`shardings[i]` gives the
    compiled input and output sharding when they differ); a donor XLA reused becomes "aliased".
    """
    decisions = list(self.decisions)
    shardings = shardings or {}
    for i, d in enumerate(decisions):
      got = realized.get(i)
      got_path = self.outputs[got].path if got is not None else None
      if d.action == ALIASED and got_path != d.output:
        if got_path is not None:
          reason = f"XLA reuses it for {got_path} (planned {d.output})"
          decisions[i] = dataclasses.replace(d, output=got_path, reason=reason)
        else:
          decisions[i] = dataclasses.replace(d, action=UNUSABLE, output=None,
                                             reason=_not_made(d.output, shardings.get(i)))
      elif d.action == DONOR:
        reason = (f"XLA reuses it for {got_path} (same size, other shape or dtype)" if got_path
                  else "offered to XLA as a donor, but XLA reused it for no output; it stays alive")
        decisions[i] = dataclasses.replace(
            d, output=got_path, reason=reason, action=ALIASED if got_path else UNUSABLE)
    return dataclasses.replace(self, decisions=tuple(decisions), memory=memory, compiled=True)

  def explain_unusable(self, decisions: Sequence[LeafDecision] | None = None) -> str:
    """The per-leaf explanation used in warnings (and, after "donate: ", in strict-mode errors).

    It starts with `jax.jit`'s own sentence, so warning filters written for `jax.jit` match it.
    """
    unusable = self.unusable if decisions is None else tuple(decisions)
    avals = ", ".join(f"{_type(d)} ({d.path})" for d in unusable)
    lines = [f"{_errors.JAX_UNUSABLE_PREFIX} {avals}.",
             f"{self.function}: {len(unusable)} donated buffer(s) cannot be used and stay alive:"]
    lines += [f"  {d.path}: {_type(d)}, sharding {d.sharding}, memory kind "
              f"{d.memory_kind}: {d.reason}" for d in unusable]
    lines.append("Fix: return an output of the same shape, dtype and sharding, or leave these "
                 "leaves out of donate_argnums.")
    return "\n".join(lines)

  def explain_host(self) -> str:
    """The strict-mode error for requested leaves that are not device buffers."""
    host = [d for d in self.decisions if d.requested and d.reason.startswith(NOT_A_DEVICE_BUFFER)]
    return "\n".join(_errors.message(
        f"{self.function}: strict mode cannot donate a leaf that is not a device buffer "
        f"(asked by {d.source})", path=d.path, expected="a jax.Array",
        got=d.reason.removeprefix(NOT_A_DEVICE_BUFFER).strip(" ()"),
        fix="pass an array (jnp.asarray(x)) or leave this argument out of donate_argnums")
        for d in host)

  def __str__(self) -> str:
    lines = _wrap([f"DonationPlan for {self.function}: {len(self.decisions)} input leaves, "
                   f"{len(self.outputs)} outputs"])
    lines += _table(self.decisions)
    lines += _wrap([f"note: {n}" for n in self.notes])
    if self.collective_memory_bytes:
      lines += _wrap([f"symmetric memory: {_bytes(self.collective_memory_bytes)} of marked "
                      "buffers (donate.planner.plan_memory packs them into pools)"])
    lines.append(f"totals: requested {_bytes(self.bytes_requested)}, "
                 f"reused {_bytes(self.bytes_reused)}")
    if self.memory is not None:
      lines += _wrap([f"compiled: {_memory_text(self.memory)}"])
    lines += _wrap(_copies.format_copies(self.copies, self.copy_threshold), indent="      ")
    if self.placements is not None:
      lines += _wrap(str(self.placements).splitlines(), indent="      ")
    return "\n".join(lines)

  __repr__ = __str__

  def _repr_html_(self) -> str:
    esc = html.escape
    head = "".join(f"<th>{h}</th>" for h in
                   ("input", "type", "bytes", "sharding", "donate", "action", "output", "reason"))
    colors = {ALIASED: "#d4f7d4", DONOR: "#e8f0ff", UNUSED: "#f0f0f0", UNUSABLE: "#ffd6d6"}
    body = "".join(
        f"<tr style='background:{colors.get(d.action, 'transparent')}'>"
        f"<td><code>{esc(d.path)}</code></td><td>{esc(_type(d))}</td>"
        f"<td>{_bytes(d.nbytes)}</td><td>{esc(d.sharding)}</td>"
        f"<td>{esc(d.source) if d.requested else '-'}</td>"
        f"<td><b>{d.action}</b></td><td><code>{esc(d.output or '-')}</code></td>"
        f"<td>{esc(d.reason)}</td></tr>" for d in self.decisions)
    foot = f"<p>requested {_bytes(self.bytes_requested)}, reused {_bytes(self.bytes_reused)}"
    if self.memory is not None:
      foot += f"; compiled: {_memory_text(self.memory)}"
    foot += "</p>" + "".join(f"<p>note: {esc(n)}</p>" for n in self.notes)
    return (f"<div><b>DonationPlan for {esc(self.function)}</b><table>"
            f"<tr>{head}</tr>{body}</table>{foot}{_copies.copies_html(self.copies)}</div>")


NOT_A_DEVICE_BUFFER = "not donated: not a device buffer"


def _not_made(output: str | None, shardings: tuple[str, str] | None) -> str:
  if shardings is not None:
    return f"not usable: sharding differs (in {shardings[0]}, out {shardings[1]})"
  return f"planned for {output}, but XLA did not make the alias; it stays alive"


def _memory_text(m: MemoryStats) -> str:
  return (f"arguments {_bytes(m.argument)}, outputs {_bytes(m.output)}, aliased "
          f"{_bytes(m.alias)}, temporaries {_bytes(m.temp)}, peak {_bytes(m.peak)}")


def _table(decisions: Sequence[LeafDecision]) -> list[str]:
  """Fixed columns first (action, bytes, type, sharding), then `input -> output`, then the reason."""
  rows = [(d.action, _bytes(d.nbytes), _type(d), d.sharding,
           d.path + (f" -> {d.output}" if d.output else ""), d) for d in decisions]
  head = ("action", "bytes", "type", "sharding", "input -> output")
  widths = [max([len(head[k])] + [len(r[k]) for r in rows]) for k in range(4)]
  lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(head, widths + [0])).rstrip()]
  for r in rows:
    lines += _wrap(["  " + "  ".join(c.ljust(w) for c, w in zip(r[:5], widths + [0])).rstrip()])
    d = r[5]
    extra = d.reason if not d.requested or d.source in ("-", "") else f"{d.reason} [{d.source}]"
    lines += _wrap([f"      {extra}"], indent="      ")
  return lines


def _wrap(lines: Sequence[str], indent: str = "    ") -> list[str]:
  out = []
  for line in lines:
    while len(line) > _WIDTH:
      cut = line.rfind(" ", len(indent) + 1, _WIDTH)
      cut = cut if cut > len(indent) else _WIDTH
      out.append(line[:cut].rstrip())
      line = indent + line[cut:].lstrip()
    out.append(line)
  return out


def _type(d) -> str:
  return f"{d.dtype}[{','.join(map(str, d.shape))}]"


def _shape(shape) -> str:
  return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _bytes(n: int) -> str:
  for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"


def _key(x) -> tuple:
  """How `jax.jit` groups inputs and outputs for aliasing: shape and dtype (weak types ignored)."""
  return (tuple(x.shape), x.dtype)


def _size(x) -> int:
  """Elements per device: what `jax.jit` compares when it offers a donor."""
  shape = tuple(x.shape)
  sharding = x.sharding_obj
  if sharding is not None and hasattr(sharding, "shard_shape"):
    try:
      shape = tuple(sharding.shard_shape(shape))
    except Exception:  # a sharding that does not fit the shape: jax.jit reports that itself
      pass
  return int(np.prod(shape, dtype=np.int64))


def _compatible(leaf: LeafInfo, out: OutputInfo) -> bool:
  """Whether the output can live in the leaf's buffer: same key, and same layout across devices
  when both shardings are known."""
  if _key(leaf) != _key(out):
    return False
  a, b = leaf.sharding_obj, out.sharding_obj
  if a is None or b is None:
    return True
  if getattr(a, "memory_kind", None) != getattr(b, "memory_kind", None):
    return False
  try:
    return bool(a.is_equivalent_to(b, len(leaf.shape)))
  except Exception:  # different device sets or sharding kinds that cannot be compared
    return False


def _check(leaves: Sequence[LeafInfo], flow: _dataflow.Dataflow,
           outputs: Sequence[OutputInfo]) -> list[str]:
  problems = []
  for a in flow.annotations:
    if a.kind == "alias" and a.origin is not None and a.dst_origin is not None:
      problems.append(_errors.message(
          f"alias at {a.where} aliases two inputs to each other: {leaves[a.origin].path} "
          f"and {leaves[a.dst_origin].path}", fix="alias an input to a value computed from it"))
  into: dict[int, list[int]] = collections.defaultdict(list)
  for j in range(len(outputs)):
    for i in flow.out_explicit[j]:
      into[i].append(j)
  for i, outs in into.items():
    if len(outs) > 1:
      problems.append(_errors.message(
          "alias of one source into two outputs", path=leaves[i].path,
          expected="one output per aliased buffer",
          got=", ".join(outputs[j].path for j in outs), fix="alias the buffer into one output only"))
  return problems


_WORDS = {"donate_buffer": "donate_buffer", "alias": "alias", "inner_jit": "inner jit donation",
          "donate_jit": "inner donate.jit"}


def _requests(requested: dict[int, str], flow: _dataflow.Dataflow,
              adopt_inner: bool) -> tuple[dict, list, dict]:
  """Adds annotations to the requests. Returns (sources, notes, {leaf: ignored inner donation})."""
  sources = dict(requested)
  notes, ignored = [], {}
  for a in flow.annotations:
    label = f"{_WORDS[a.kind]} at {a.where}"
    if a.origin is None:
      notes.append(f"{label} had no effect: the value is an intermediate or a constant, not an "
                   "input buffer (XLA already reuses intermediates)")
    elif a.kind == "inner_jit" and not adopt_inner:
      if a.origin not in sources:
        ignored.setdefault(a.origin, a.where)
    elif a.origin not in sources:
      sources[a.origin] = label
  for i in list(ignored):
    if i in sources:
      del ignored[i]
  if ignored:
    notes.append(f"inner jax.jit donation ignored for {len(ignored)} input(s) the caller did not "
                 "donate (jax.jit ignores it too); donate.jit(..., adopt_inner_donation=True) "
                 "adopts it")
  return sources, notes, ignored


def _pair(leaves, outputs, donated, flow):
  """Greedy maximal matching, strongest dataflow link first. Returns {leaf: (output, strength)}."""
  candidates = []
  for i in donated:
    for j, out in enumerate(outputs):
      if _compatible(leaves[i], out):
        strength = (_dataflow.EXPLICIT if i in flow.out_explicit[j]
                    else flow.out_sources[j].get(i, 0))
        candidates.append((-strength, j, i))
  pairs, taken = {}, set()
  for neg, j, i in sorted(candidates):
    if i not in pairs and j not in taken:
      pairs[i] = (j, -neg)
      taken.add(j)
  return pairs


def fcfs_pairs(leaves: Sequence[LeafInfo], outputs: Sequence[OutputInfo],
               donated: Sequence[int]) -> dict[int, int]:
  """What `jax.jit` pairs on one device: each output, in order, takes the first donated input of
  its shape and dtype not yet taken. Returns {leaf: output}.

  >>> leaf = lambda p: LeafInfo(p, (4,), "float32", 16, "cpu:0", None, DEVICE, "ArrayImpl")
  >>> out = lambda p: OutputInfo(p, (4,), "float32", 16)
  >>> fcfs_pairs([leaf("a"), leaf("b")], [out("out[0]"), out("out[1]")], [0, 1])
  {0: 0, 1: 1}
  """
  queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
  for i in sorted(donated):
    queues[_key(leaves[i])].append(i)
  pairs = {}
  for j, out in enumerate(outputs):
    queue = queues.get(_key(out))
    if queue:
      pairs[queue.popleft()] = j
  return pairs


def _donors(leaves, outputs, donated, pairs, xla_decides: bool = False) -> dict[int, int | None]:
  """`jax.jit`'s second chance: a donated input left over becomes a buffer donor when an unpaired
  output has as many elements (first come, first served); XLA decides whether to reuse it.

  With `xla_decides` (a program over several devices whose output shardings are not all given),
  `jax.jit` hands every donated input to XLA as a donor: XLA pairs them after partitioning.
  """
  if xla_decides:
    return {i: None for i in donated if i not in pairs}
  free = collections.defaultdict(collections.deque)
  paired_outs = {j for j, _ in pairs.values()}
  for j, o in enumerate(outputs):
    if j not in paired_outs:
      free[_size(o)].append(j)
  donor_out = {}
  for i in donated:
    if i not in pairs and free[_size(leaves[i])]:
      donor_out[i] = free[_size(leaves[i])].popleft()
  return donor_out


def _layout(leaves, outputs, pairs, donor_out, xla_decides: bool = False) -> Layout:
  """The inner computation's donated leaves and output order, so that first come, first served
  yields `pairs`: in each (shape, dtype) group the k-th output gets the k-th donated input."""
  paired_out = {j: i for i, (j, _) in pairs.items()}
  by_input = sorted(paired_out, key=paired_out.__getitem__)
  order = by_input + [j for j in range(len(outputs)) if j not in paired_out]
  # A donor must not come before a paired input of its own group: it would take that output.
  last_paired = {}
  for i in pairs:
    last_paired[_key(leaves[i])] = max(i, last_paired.get(_key(leaves[i]), -1))
  donors = [i for i in donor_out if xla_decides or i > last_paired.get(_key(leaves[i]), -1)]
  donated = tuple(sorted(set(pairs) | set(donors)))
  out_order = tuple(order) if order != list(range(len(outputs))) else None
  return Layout(donated, out_order)


def _unusable_reason(leaf, outputs, pairs, leaves) -> str:
  taken = {j: i for i, (j, _) in pairs.items()}
  same = [j for j, o in enumerate(outputs) if _key(o) == _key(leaf)]
  if same:
    usable = [j for j in same if _compatible(leaf, outputs[j])]
    if not usable:
      o = outputs[same[0]]
      return (f"not usable: sharding differs (in {_sharding_text(leaf.sharding_obj)}, "
              f"out {_sharding_text(o.sharding_obj)})")
    j = usable[0]
    return (f"output {outputs[j].path} has its shape and dtype but already reuses "
            f"{leaves[taken[j]].path}")
  if not outputs:
    return "the function has no outputs"

  def distance(o):
    return (o.dtype != leaf.dtype, abs(o.nbytes - leaf.nbytes), o.shape != leaf.shape)
  o = min(outputs, key=distance)
  fields = []
  if o.shape != leaf.shape:
    fields.append(f"shape {_shape(o.shape)} vs {_shape(leaf.shape)}")
  if o.dtype != leaf.dtype:
    fields.append(f"dtype {o.dtype} vs {leaf.dtype}")
  return f"no output of its shape and dtype; nearest is {o.path}: " + ", ".join(fields)


def _sharding_text(sharding) -> str:
  return sharding_str(sharding) if sharding is not None else "unknown"


def sharding_str(sharding) -> str:
  """A compact name for a sharding: `cpu:0`, `P('x', None)`, `host`.

  >>> import jax
  >>> sharding_str(jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  'cpu:0'
  """
  if sharding is None:
    return "host"
  spec = getattr(sharding, "spec", None)
  if spec is not None:  # str() spells unreduced / reduced axes too
    text = str(spec)
    text = "P" + text[len("PartitionSpec"):] if text.startswith("PartitionSpec") else text
    text = text[:-2] + ")" if text.endswith(",)") else text  # P('x',) reads P('x')
  else:
    try:
      devices = sharding.device_set
    except Exception:  # an abstract mesh has no devices
      devices = None
    if devices is not None and len(devices) == 1:
      d = next(iter(devices))
      text = f"{d.platform}:{d.id}"
    else:
      text = type(sharding).__name__
  kind = getattr(sharding, "memory_kind", None)
  if kind not in (None, "device"):
    text += f"@{kind}"
  return text


def _decide(i, leaf, source, used, pairs, donor_out, outputs, leaves, ignored) -> LeafDecision:
  if not source:
    action, out, reason = KEPT, None, "not donated"
    if i in ignored:
      reason = (f"not donated: inner jax.jit donation at {ignored[i]} ignored (the caller did "
                "not donate this argument)")
  elif leaf.kind == HOST:
    action, out, reason = KEPT, None, f"{NOT_A_DEVICE_BUFFER} ({leaf.type_name})"
  elif not used:
    action, out = UNUSED, None
    reason = ("the computation does not read it; it stays alive, as in jax.jit "
              "(keep_unused=True donates it)")
  elif i in pairs:
    j, strength = pairs[i]
    action, out, reason = ALIASED, outputs[j].path, _STRENGTH_WORDS[strength]
  elif i in donor_out:
    action, out = DONOR, None
    reason = ("a buffer donor: XLA pairs it with an output after partitioning" if donor_out[i]
              is None else f"no free output of its shape and dtype; XLA may reuse it for "
              f"{outputs[donor_out[i]].path}")
  else:
    action, out, reason = UNUSABLE, None, _unusable_reason(leaf, outputs, pairs, leaves)
  return LeafDecision(leaf.path, leaf.shape, leaf.dtype, leaf.nbytes, leaf.sharding,
                      leaf.memory_kind, bool(source), source or "-", action, out, reason)


def make_plan(function: str, leaves: Sequence[LeafInfo], outputs: Sequence[OutputInfo],
              requested: dict[int, str], flow: _dataflow.Dataflow, *,
              keep_unused: bool = False, adopt_inner: bool = False,
              xla_decides: bool = False) -> DonationPlan:
  """Decides every input leaf; raises one DonationError listing every misuse found.

  Args:
    function: the function's name, for messages.
    leaves: facts about every input leaf, in flat order.
    outputs: facts about every output leaf, in flat order.
    requested: leaf index -> how donation was requested ("donate_argnums", ...).
    flow: the dataflow of the traced program (`_dataflow.analyze`).
    keep_unused: keep unread inputs in the computation (as `jax.jit(keep_unused=True)`).
    adopt_inner: honour `jax.jit(donate_argnums=...)` of inner calls on the outer inputs.
    xla_decides: the program spans several devices and not every output sharding is given:
      `jax.jit` offers every donated input to XLA as a donor (see `_donors`).
  """
  sources, notes, ignored = _requests(requested, flow, adopt_inner)
  problems = _check(leaves, flow, outputs)
  if problems:
    raise _errors.DonationError("\n".join(problems))
  used = [keep_unused or u for u in flow.used]
  donated = [i for i in sorted(sources) if used[i] and leaves[i].is_array]
  pairs = _pair(leaves, outputs, donated, flow)
  explicit = set().union(*flow.out_explicit) if flow.out_explicit else set()
  donor_out = _donors(leaves, outputs, [i for i in donated if i not in explicit], pairs,
                      xla_decides)
  layout = _layout(leaves, outputs, pairs, donor_out, xla_decides)
  donor_out = {i: j for i, j in donor_out.items() if i in layout.donated}
  decisions = tuple(_decide(i, leaf, sources.get(i, ""), used[i], pairs, donor_out, outputs,
                            leaves, ignored) for i, leaf in enumerate(leaves))
  return DonationPlan(function, decisions, tuple(outputs), tuple(notes), layout)
