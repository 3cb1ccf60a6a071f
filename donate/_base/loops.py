"""The operand layout of ``scan`` and ``while`` equations on every supported JAX version.

The layout is read from the equations' public params, but spelled differently by the supported
versions (jax 0.10: `num_consts`/`num_carry`; jax 0.12: the flat trees `ft_in`), and `while`
splits its constants between the condition and the body. Every walker reads loops through
`loop_layout`; a version that changes a loop's params is fixed here.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class LoopLayout:
  """How a ``scan`` or ``while`` equation's operands feed its body (and condition).

  Operands are ``cond constants + body constants + carries + scanned inputs``; the body takes
  ``body constants + carries + one slice of each scanned input``; the condition (``while`` only)
  ``cond constants + carries``; the first ``carries`` results are the final carries.

  Attributes:
    kind: ``"scan"`` or ``"while"``.
    body: the body's open jaxpr.
    cond: the condition's open jaxpr (``while``), else None.
    cond_consts: number of leading operands that are the condition's constants (0 for scan).
    body_consts: number of operands, after those, that are the body's constants.
    carries: number of loop carries.
  """

  kind: str
  body: Any
  cond: Any
  cond_consts: int
  body_consts: int
  carries: int

  @property
  def carry_operands(self) -> range:
    """The positions of the initial carries among the equation's operands."""
    start = self.cond_consts + self.body_consts
    return range(start, start + self.carries)


def loop_layout(eqn) -> LoopLayout | None:
  """The layout of a ``scan``/``while`` equation on every supported JAX; None for other equations.

  >>> import jax
  >>> eqn = jax.make_jaxpr(lambda c, xs: jax.lax.scan(lambda c, x: (c + x, x), c, xs))(
  ...     0.0, jax.numpy.ones(3)).eqns[0]
  >>> l = loop_layout(eqn)
  >>> (l.kind, l.cond_consts, l.body_consts, l.carries, list(l.carry_operands))
  ('scan', 0, 0, 1, [0])
  """
  name, p = eqn.primitive.name, eqn.params
  if name == "scan":
    if "num_consts" in p:
      consts, carries = p["num_consts"], p["num_carry"]
    else:
      flat_consts, flat_carry, _ = p["ft_in"].unpack()
      consts, carries = len(flat_consts), len(flat_carry)
    return LoopLayout("scan", p["jaxpr"].jaxpr, None, 0, consts, carries)
  if name == "while":
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    return LoopLayout(
      "while", p["body_jaxpr"].jaxpr, p["cond_jaxpr"].jaxpr, cn, bn, len(eqn.invars) - cn - bn
    )
  return None
