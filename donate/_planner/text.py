"""How the planner writes sizes and counts: one place, so the listing, HTML and plot agree.

>>> size_text(448, 448)
'448 bytes (lower bound 448)'
>>> count(1, "buffer"), count(3, "buffer")
('1 buffer', '3 buffers')
"""

from __future__ import annotations


def size_text(nbytes: int, lower_bound: int | None = None, *notes: str) -> str:
  """``"N bytes"``, then ``" (lower bound M, notes...)"`` when a lower bound is given."""
  if lower_bound is None:
    return f"{nbytes} bytes"
  return f"{nbytes} bytes ({', '.join([f'lower bound {lower_bound}', *notes])})"


def count(n: int, noun: str) -> str:
  """``n`` and ``noun``, plural unless ``n`` is 1."""
  return f"{n} {noun}" + ("" if n == 1 else "s")
