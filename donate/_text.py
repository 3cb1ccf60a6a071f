"""Text shared by every report (plans, copy records, the demo, the planner): sizes in bytes."""

from __future__ import annotations

import numbers


def is_symbolic(n) -> bool:
  """Whether a dimension, size or byte count is an expression of dimension variables
  (`jax.export.symbolic_shape`) rather than a number.

  >>> import jax
  >>> b, = jax.export.symbolic_shape("b")
  >>> is_symbolic(4 * b), is_symbolic(16)
  (True, False)
  """
  return not isinstance(n, numbers.Integral)


def format_bytes(n) -> str:
  """`n` bytes in the largest binary unit it reaches, one decimal.

  A symbolic count (an expression of `jax.export.symbolic_shape` dimensions) is shown as that
  expression, in parentheses when it is a sum.

  >>> format_bytes(512), format_bytes(65536), format_bytes(3 << 29), format_bytes(-(1 << 20))
  ('512 B', '64.0 KiB', '1.5 GiB', '-1.0 MiB')
  >>> import jax
  >>> a, b = jax.export.symbolic_shape("a, b")
  >>> format_bytes(4 * a * b), format_bytes(4 * b + 16)
  ('4*a*b B', '(4*b + 16) B')
  """
  if is_symbolic(n):
    text = str(n)
    return f"({text}) B" if " " in text else f"{text} B"
  for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if abs(n) >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"
