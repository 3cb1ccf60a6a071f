"""From XLA's buffer assignment and the compiled module to a `MemoryProfile`: the timeline, the
buffers live at the peak with their owners, and the inputs an output could reuse.

`assemble(dump, module, stats, **names)` is pure: the dump of one compile (`reading.Dump`), its
parsed HLO (`_hlo.Module`), its `memory_analysis()` and the user's names for its parameters and
outputs in, a profile out.
"""

from __future__ import annotations

import dataclasses
import inspect

from donate._profile import categories, naming, reading, shadow
from donate._profile.model import Entry, Suggestion, Timeline
from donate._profile.profile import MemoryProfile
from donate._xla import hlo as _hlo


def assemble(
  dump: reading.Dump,
  module: _hlo.Module,
  stats,
  *,
  function: str = "?",
  platform: str = "?",
  in_paths=None,
  out_paths=None,
  donated=(),
  signature=None,
  in_shardings=None,
  out_shardings=None,
) -> MemoryProfile:
  """The profile of one compiled program (see `MemoryProfile`).

  Args:
    dump: XLA's buffer assignment and live ranges of the program.
    module: the program's parsed HLO (`Compiled.as_text()`).
    stats: its `memory_analysis()` (for XLA's own peak figure), or None.
    function: the function's name, for the text.
    platform: "cpu", "gpu", ...
    in_paths: the user's path of each entry parameter (default: JAX's `op_name` of it).
    out_paths: the user's path of each output (default: `out[k]`).
    donated: entry parameters already donated (never suggested again).
    signature: the user function's `inspect.Signature`, to write `donate_argnums`.
    in_shardings, out_shardings: per parameter / output, to pair only equal shardings.
  """
  collective = _hlo.collective_memory_spaces(module) - {0}
  params, outs = _owners(dump, module, in_paths, out_paths)
  buffers = reading.temp_buffers(dump)
  steps = max(len(dump.sequence), 1)
  temp, coll = [0] * (steps + 1), [0] * (steps + 1)
  for b in buffers:
    series = coll if b.color in collective else temp
    series[b.start] += b.nbytes
    series[b.end] -= b.nbytes
  temp, coll = _running(temp, steps), _running(coll, steps)
  fixed = (
    sum(e.nbytes for e in params if not e.aliased),
    sum(e.nbytes for e in outs),
    sum(e.nbytes for e in params if e.aliased),
  )
  constants = _constants(dump, module, steps)
  held = sum(e.nbytes for e in constants)
  timeline = Timeline(dump.sequence or ("(empty)",), *fixed, tuple(temp), tuple(coll), held)
  peak = max(range(steps), key=lambda t: temp[t] + coll[t])
  paths = {e.index: e.path for e in params}
  at = [b for b in buffers if b.start <= peak < b.end]
  live = [_temp_entry(module, b, peak, b.color in collective, paths) for b in at]
  flow = categories.Flow(module)
  pairing = categories.pair(flow, params, outs, module)
  params, outs, constants, live = _categorized(flow, module, pairing, params, outs, constants, live)
  at_peak = sorted(params + outs + constants + live, key=lambda e: -e.nbytes)
  advice = _could_donate(
    params, outs, set(donated), signature, in_shardings, out_shardings, pairing
  )
  sums = reading.totals(dump)
  xla_peak = getattr(stats, "peak_memory_in_bytes", None) if stats is not None else None
  peak_bytes = timeline[peak].total_bytes
  shadowed = shadow.shadows(dump, module, params, list(zip(live, at)), peak, peak_bytes)
  return MemoryProfile(
    function,
    platform,
    sums["argument"],
    sums["output"],
    sums["alias"],
    sums["temp"],
    None if xla_peak is None else int(xla_peak),
    timeline,
    peak,
    tuple(at_peak),
    tuple(advice),
    shadowed,
    timeline.constant_bytes,
    layout=_layout(dump, buffers),
    operations=operations(module),
    host_bytes=reading.host_bytes(dump),
  )


_NOT_COMPUTING = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy")


def operations(module: _hlo.Module) -> tuple[str, ...]:
  """The opcodes of the entry computation's instructions that compute (not parameters,
  constants, tuples, bitcasts, copies), in order: one for a program that runs one operation."""
  return tuple(i.opcode for i in module.entry.instructions if i.opcode not in _NOT_COMPUTING)


def _layout(dump, buffers) -> tuple:
  """Each temp buffer as (low, high, start, end, value): its bytes in the program's temp block
  (the device's temp allocations one after the other) and its schedule steps."""
  base, at = {}, 0
  for a in sorted(dump.allocations, key=lambda a: a.index):
    if reading.is_temp(a) and reading.on_device(a):
      base[a.index], at = at, at + a.nbytes
  return tuple(
    (base[b.allocation] + b.low, base[b.allocation] + b.high, b.start, b.end, b.values[0][0])
    for b in buffers
    if b.allocation in base
  )


def _categorized(flow, module, pairing, params, outs, constants, live):
  """The entries with their category (`categories`), function and layer count."""
  of_argument = categories.argument_categories(flow, module, params, pairing)
  params = [dataclasses.replace(e, category=of_argument.get(e.index, "inputs")) for e in params]
  outs = [dataclasses.replace(e, category="outputs") for e in outs]
  constants = [dataclasses.replace(e, category="constants") for e in constants]
  named = []
  for e in live:
    source, function, library = categories.layer_source(flow, e)
    named.append(
      dataclasses.replace(
        e,
        category=categories.temporary_category(flow, e, of_argument),
        repeat=categories.repeat_of(flow, e),
        source=source or e.source,
        function=function,
        library=library if source else e.library,
      )
    )
  return params, outs, constants, named


def _running(diff: list[int], steps: int) -> list[int]:
  out, level = [], 0
  for t in range(steps):
    level += diff[t]
    out.append(level)
  return out


def _owners(dump, module, in_paths, out_paths):
  """One entry per argument allocation and per output allocation (not an argument)."""
  params, outs = [], []
  roots = naming.output_instructions(module)
  outputs = [naming.value_names(module, n) for n in roots]
  for a in filter(reading.on_device, dump.allocations):
    number = reading.parameter_number(a)
    names = [naming.instruction_name(v[0]) for v in a.values]
    values = {v[0] for v in a.values} | {v[0] + "{}" for v in a.values if "{" not in v[0]}
    k = next((k for k, forms in enumerate(outputs) if forms & values), None)
    out_path = None
    if k is not None:
      out_path = out_paths[k] if out_paths is not None and k < len(out_paths) else f"out[{k}]"
    if number is not None:
      path = (
        in_paths[number]
        if in_paths is not None and number < len(in_paths)
        else naming.entry_parameter_path(module, number)
      )
      instr = module.entry.parameter(number)
      params.append(
        Entry(
          a.nbytes,
          "argument",
          instr.name if instr else "?",
          str(instr.shape) if instr else "?",
          None,
          path,
          None,
          (0, len(dump.sequence)),
          reading.is_output(a),
          out_path,
          number,
        )
      )
    elif reading.is_output(a):
      name = roots[k] if k is not None else (names[0] if names else "?")
      instr = module.find(name)
      outs.append(
        Entry(
          a.nbytes,
          "output",
          name,
          str(instr.shape) if instr else _root_shape(module, k),
          naming.source_of(module, instr),
          out_path or "(output table)",
          naming.scope_of(module, instr),
          (0, len(dump.sequence)),
          False,
          None,
          k,
          library=naming.library_of(module, instr),
        )
      )
  return params, outs


def _constants(dump, module, steps: int) -> list[Entry]:
  """One entry per constant allocation: a literal of the program, which XLA keeps on the device
  for the whole program (none of `memory_analysis()`'s four figures counts it)."""
  found = []
  for a in filter(reading.on_device, dump.allocations):
    if reading.is_constant(a) and a.values:
      value = a.values[0][0]
      instr = module.find(naming.instruction_name(value))
      found.append(
        Entry(
          a.nbytes,
          "constant",
          value,
          str(instr.shape) if instr else "?",
          naming.source_of(module, instr),
          None,
          naming.scope_of(module, instr),
          (0, steps),
          library=naming.library_of(module, instr),
        )
      )
  return found


def _root_shape(module, k) -> str:
  """The shape of output `k` from the root tuple's (an operand XLA 0.12 spells `call.1#k`)."""
  root = module.entry.root
  shape = root.shape if root is not None else None
  if k is None or shape is None or shape.elements is None or k >= len(shape.elements):
    return "?"
  return str(shape.element(k))


def _temp_entry(module, buffer: reading.Buffer, step: int, collective: bool, paths) -> Entry:
  value = buffer.value_at(step)
  instr = module.find(naming.instruction_name(value))
  shape = instr.shape if instr is not None else None
  if shape is not None and "{" in value and shape.elements is not None:
    index = value.split("{", 1)[1].rstrip("}").split(",")[0]
    shape = shape.element(int(index)) if index.strip().isdigit() else shape
  source = naming.source_of(module, instr)
  path = paths.get(naming.argument_of(module, instr)) if source is None else None
  return Entry(
    buffer.nbytes,
    naming.kind_of(module, instr, collective),
    value,
    str(shape) if shape is not None else "?",
    source,
    path,
    naming.scope_of(module, instr),
    (buffer.start, buffer.end),
    library=naming.library_of(module, instr) if source is not None else None,
  )


def _argument_of(path: str, signature) -> tuple[int | None, str]:
  """(positional index, name) of the top-level argument a leaf path starts with."""
  name = path.split("[", 1)[0].split(".", 1)[0]
  if signature is None:
    return None, name
  positional = [
    p.name
    for p in signature.parameters.values()
    if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  ]
  return (positional.index(name) if name in positional else None), name


def _could_donate(params, outs, donated, signature, in_shardings, out_shardings, pairing):
  """Inputs not donated whose buffer the output computed from them (`categories.pair`: the
  dataflow, never a size alone) could reuse, where that output has the input's shape, dtype and
  sharding."""
  by_index = {o.index: o for o in outs if o.index is not None}
  found = []
  for p in params:
    if p.aliased or p.index in donated or p.index not in pairing.outputs:
      continue
    if p.path == naming.CONSTANT:  # a closed-over constant: no argument to donate
      continue
    o = by_index.get(pairing.outputs[p.index][0])
    if o is not None and _same_sharding(
      p.index, o.index, in_shardings, out_shardings, _ndim(p.shape)
    ):
      argnum, argname = _argument_of(p.path, signature)
      found.append(Suggestion(p.path, o.path, p.nbytes, argnum, argname))
  return found


def _ndim(shape: str) -> int:
  dims = shape.partition("[")[2].partition("]")[0]
  return len(dims.split(",")) if dims.strip() else 0


def _same_sharding(i, k, ins, outs, ndim) -> bool:
  a = ins[i] if ins is not None and i < len(ins) else None
  b = outs[k] if outs is not None and k < len(outs) else None
  if a is None or b is None:
    return True
  try:
    return bool(a.is_equivalent_to(b, ndim))
  except (AttributeError, TypeError, ValueError):
    return True
