"""What each buffer at the peak is in the user's terms, from the program's dataflow.

The vocabulary (`CATEGORIES`):

- an argument is **parameters** when the step returns it updated (an output is computed from it,
  `flow.Flow.computed_from`), from a value of a backward pass, and a forward pass reads it, or
  a trial point made from it (a line search's `x + t * d`: jaxopt's solvers);
  **optimizer state** when it is updated from a backward pass's value but no forward pass reads
  it (Adam's `mu` and `nu`); **state** when it is updated otherwise (a KV cache, a loop's carry,
  a step counter); **inputs** when no output is computed from it (a batch);
- a temporary is **activations** when a forward pass made it and a backward pass reads it (the
  residuals saved for the backward pass), **gradients** when a backward pass made it and something
  outside the backward pass reads it (the optimizer's update, an output), **state** when it is a
  loop's carry, **collective** when a collective made it or it lives in collective memory, else
  **temporaries**; a copy XLA made of an argument has the argument's category;
- outputs that reuse no argument are **outputs**; the program's literals **constants**, and so are
  the closed-over arrays JAX passes as leading parameters (`jax_use_simplified_jaxpr_constants`,
  the default from jax 0.12.1), whose path is `<constant>`.

Nothing is attributed by size or by a variable's name: the pass is JAX's name stack
(`transpose(jvp(...))`), the rest is which instruction reads which.

>>> import jax, jax.numpy as jnp, donate
>>> def sgd(w, x):
...   g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
...   return w - 0.1 * g
>>> p = donate.memory_profile(jax.jit(sgd, donate_argnums=0), jnp.ones((512, 512)),
...                           jnp.ones((16, 512)))
>>> {e.path: e.category for e in p.at_peak if e.kind == "argument"}
{'w': 'parameters', 'x': 'inputs'}
>>> "gradients" in {g.key for g in p.by_category()}
True
>>> sum(g.total_bytes for g in p.by_category()) == p.peak_bytes
True
"""

from __future__ import annotations

import dataclasses

from donate._profile import naming
from donate._profile.flow import Flow as Flow
from donate._xla import hlo as _hlo

CATEGORIES = (
  "parameters",
  "optimizer state",
  "gradients",
  "activations",
  "state",
  "inputs",
  "outputs",
  "collective",
  "temporaries",
  "constants",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Pairing:
  """Entry parameter -> (output index, dataflow distance) of the output computed from it."""

  outputs: dict[int, tuple[int, int]]


def _suffix(a: str | None, b: str | None) -> int:
  """How many trailing characters two pytree paths share (`params['w']`, `out[0]['w']`)."""
  a, b, n = a or "", b or "", 0
  while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
    n += 1
  return n


def pair(flow: Flow, params, outs, module: _hlo.Module) -> Pairing:
  """Each argument with the output computed from it, of its shape: an aliased one with its
  alias; any other with the free output nearest to it in the dataflow (ties: the output whose
  pytree path ends like the argument's, then the first)."""
  found: dict[int, tuple[int, int]] = {}
  for p in params:
    if p.index is not None and p.aliased and p.index in module.aliases:
      found[p.index] = ((module.aliases[p.index] or (0,))[0], 0)
  taken = {k for k, _ in found.values()}
  candidates = []
  for o in outs:
    if o.index is None or o.index in taken:
      continue
    for number, distance in flow.computed_from(o.index).items():
      candidates.append((distance, o, number))
  by_number = {p.index: p for p in params if p.index is not None and p.index not in found}
  ranked = sorted(
    (
      c
      for c in candidates
      if c[2] in by_number
      and c[1].shape == by_number[c[2]].shape
      and c[1].nbytes == by_number[c[2]].nbytes
    ),
    key=lambda c: (c[0], -_suffix(by_number[c[2]].path, c[1].path), c[1].index, c[2]),
  )
  for distance, o, number in ranked:
    if number in found or o.index in taken:
      continue
    found[number] = (o.index, distance)
    taken.add(o.index)
  return Pairing(found)


def _reads_forward(flow: Flow, module: _hlo.Module, number: int) -> bool:
  """Whether a forward pass reads the argument, or a trial point made from it: a value of its
  shape that one instruction outside the passes computes from it (`x + t * d`, as a line
  search evaluates: jaxopt's solvers, which keep the parameters' gradient in their state)."""
  param = module.entry.parameter(number)
  if param is None:
    return False
  readers: list = []
  if "forward" in flow.reader_phases(param, readers=readers):
    return True
  return any(
    r.shape.dims == param.shape.dims
    and r.opcode not in ("while", "call", "conditional")
    and flow.phase_of(r) == "other"
    and "forward" in flow.reader_phases(r)
    for r in readers
  )


def argument_categories(flow: Flow, module: _hlo.Module, params, pairing: Pairing) -> dict:
  """Entry parameter -> its category (see the module docstring)."""
  out = {}
  for p in params:
    if p.index is None:
      continue
    if p.path == naming.CONSTANT:
      out[p.index] = "constants"
      continue
    paired = pairing.outputs.get(p.index)
    if paired is None:
      out[p.index] = "inputs"
    elif flow.depends_on_backward(paired[0]):
      out[p.index] = "parameters" if _reads_forward(flow, module, p.index) else "optimizer state"
    else:
      out[p.index] = "state"
  return out


def temporary_category(flow: Flow, entry, of_argument: dict) -> str:
  """The category of a temporary, copy, loop carry or collective buffer at the peak."""
  if entry.kind == "collective":
    return "collective"
  module = flow.module
  base, _, rest = entry.value.partition("{")
  index = tuple(int(k) for k in rest.rstrip("}").split(",") if k.strip().isdigit())
  instr, index = flow.origin(module.find(naming.instruction_name(base)), index)
  if (
    instr is not None
    and instr.parameter_number is not None
    and (module.computations[instr.computation].is_entry)
  ):
    return of_argument.get(instr.parameter_number, "inputs")
  made = flow.phase_of(instr)
  if made == "other" and instr is not None and instr.opcode == "while" and index:
    if flow.made_from_backward(instr, index[0]):  # a sum of gradients over microbatches
      made = "backward"
  readers = flow.reader_phases(instr, index) if instr is not None else set()
  if made == "forward" and "backward" in readers:
    return "activations"
  if made == "backward" and readers - {"backward"}:
    return "gradients"
  if entry.kind == "loop carry":
    return "state"
  return "temporaries"


def repeat_of(flow: Flow, entry) -> int:
  """How many layers' values one buffer stacks: a loop's output whose leading dimension is the
  loop's trip count (a `scan` over layers saves each layer's residual in one buffer)."""
  base, _, rest = entry.value.partition("{")
  index = tuple(int(k) for k in rest.rstrip("}").split(",") if k.strip().isdigit())
  instr, index = flow.loop_element(
    *flow.origin(flow.module.find(naming.instruction_name(base)), index)
  )
  if instr is None or instr.opcode != "while" or not index:
    return 1
  trips = instr.trip_count()
  shape = instr.shape.element(index[0]) if instr.shape.elements else None
  dims = shape.dims if shape is not None else ()
  return trips if trips and dims and dims[0] == trips and trips > 1 else 1


def layer_source(flow: Flow, entry) -> tuple[str | None, str | None, str | None]:
  """(file:line, function, the library's line) of the value a loop stacks into one of its
  outputs (the update a `scan`'s dynamic-update-slice writes), else of the buffer's own
  instruction."""
  module = flow.module
  base, _, rest = entry.value.partition("{")
  index = tuple(int(k) for k in rest.rstrip("}").split(",") if k.strip().isdigit())
  instr, index = flow.loop_element(*flow.origin(module.find(naming.instruction_name(base)), index))
  if instr is not None and instr.opcode == "while" and index:
    body = flow._body(instr)
    root = body.root if body is not None else None
    if (
      body is not None
      and root is not None
      and root.opcode == "tuple"
      and index[0] < len(root.operands)
    ):
      written = body.get(_hlo.tuple_element(root.operands[index[0]])[0])
      update = _written_update(module, written)
      where = _located(module, update)
      if where is not None:
        return where
  return _located(module, module.find(naming.instruction_name(base))) or (None, None, None)


def _written_update(module: _hlo.Module, instr):
  """The update operand of a dynamic-update-slice (or of the fusion that wraps one)."""
  if instr is None:
    return None
  if instr.opcode == "dynamic-update-slice" and len(instr.operands) > 1:
    return module.find(_hlo.tuple_element(instr.operands[1])[0], instr.computation)
  if instr.opcode == "fusion":
    for name in instr.calls:
      comp = module.computations.get(name)
      root = comp.root if comp is not None else None
      if (
        comp is not None
        and root is not None
        and root.opcode == "dynamic-update-slice"
        and len(root.operands) > 1
      ):
        inner = comp.get(root.operands[1])
        while inner is not None and inner.opcode in ("bitcast", "reshape", "parameter"):
          if inner.opcode == "parameter":
            k = inner.parameter_number
            if k is None:
              return None
            return module.find(_hlo.tuple_element(instr.operands[k])[0], instr.computation)
          inner = comp.get(inner.operands[0])
        return inner
  return None


def _located(module: _hlo.Module, instr) -> tuple[str | None, str | None, str | None] | None:
  """(file:line, function, the library's line) of `instr` or of what it copies or carries."""
  if instr is None:
    return None
  found = naming._speaker(module, instr, lambda i: naming._own_source(module, i) is not None)
  where, library = naming._own_lines(module, found) if found is not None else (None, None)
  if where is None:
    return None
  head, sep, tail = where.partition(" (")
  library = naming.library_line(where, library)
  return (head, tail.rstrip(")") or None, library) if sep else (where, None, library)
