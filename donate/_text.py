"""Text shared by every report (plans, copy records, the demo, the planner): sizes in bytes."""

from __future__ import annotations


def format_bytes(n: int) -> str:
  """`n` bytes in the largest binary unit it reaches, one decimal.

  >>> format_bytes(512), format_bytes(65536), format_bytes(3 << 29), format_bytes(-(1 << 20))
  ('512 B', '64.0 KiB', '1.5 GiB', '-1.0 MiB')
  """
  for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if abs(n) >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"
