"""The peak as an HTML treemap: one column per category (its width its share of the peak), each
column's buffers stacked by size (their height their share of the column), plain HTML and CSS;
and XLA's packing of the temporaries (`packing`): each buffer at its offset over the steps it is
live, an SVG, so the gaps XLA's packing leaves show.

>>> from donate._profile.model import Entry
>>> e = Entry(3 << 20, "temporary", "t", "f32[3]", "m.py:3", None, None, (0, 1),
...           category="activations")
>>> class P:
...   at_peak, peak_bytes = (e,), 3 << 20
>>> "activations" in treemap(P()) and "m.py:3" in treemap(P())
True
"""

from __future__ import annotations

import html as _html

from donate._base.text import format_bytes

COLOURS = {
  "parameters": "#4e79a7",
  "optimizer state": "#76b7b2",
  "gradients": "#f28e2b",
  "activations": "#e15759",
  "state": "#59a14f",
  "inputs": "#edc948",
  "outputs": "#b07aa1",
  "collective": "#ff9da7",
  "temporaries": "#9c755f",
  "constants": "#bab0ac",
}
_MAX_CELLS = 12  # buffers drawn per column; the rest as one cell


def treemap(p, width: int = 960, height: int = 320) -> str:
  """`p`'s buffers at the peak as nested boxes (see the module docstring)."""
  esc = _html.escape
  total = sum(e.nbytes for e in p.at_peak) or 1
  columns: dict[str, list] = {}
  for e in p.at_peak:
    columns.setdefault(e.category, []).append(e)
  order = sorted(columns, key=lambda c: -sum(e.nbytes for e in columns[c]))
  parts, left = [], 0.0
  for category in order:
    entries = sorted(columns[category], key=lambda e: -e.nbytes)
    share = sum(e.nbytes for e in entries) / total
    if share * width < 2:
      continue
    cells = [(esc(e.path or e.source or e.value), e.nbytes) for e in entries[:_MAX_CELLS]]
    rest = entries[_MAX_CELLS:]
    if rest:
      cells.append((f"{len(rest)} more", sum(e.nbytes for e in rest)))
    column_bytes = sum(b for _, b in cells) or 1
    top, inner = 0.0, []
    for label, nbytes in cells:
      h = height * nbytes / column_bytes
      inner.append(
        f"<div title='{label}: {esc(format_bytes(nbytes))}' style='position:absolute;"
        f"left:0;top:{top:.1f}px;width:100%;height:{h:.1f}px;box-sizing:border-box;"
        "border:1px solid #fff;overflow:hidden;font-size:10px;color:#fff'>"
        f"{label if h >= 12 else ''}</div>"
      )
      top += h
    w = share * width
    parts.append(
      f"<div title='{esc(category)}: {esc(format_bytes(sum(e.nbytes for e in entries)))}' "
      f"style='position:absolute;left:{left:.1f}px;top:0;width:{w:.1f}px;height:{height}px;"
      f"background:{COLOURS.get(category, '#888')}'>{''.join(inner)}</div>"
    )
    left += w
  legend = " ".join(
    f"<span style='background:{COLOURS.get(c, '#888')};color:#fff;padding:0 4px'>{esc(c)} "
    f"{esc(format_bytes(sum(e.nbytes for e in columns[c])))}</span>"
    for c in order
  )
  return (
    f"<div><p>The peak ({esc(format_bytes(p.peak_bytes))}) by category:</p>"
    f"<div style='position:relative;width:{width}px;height:{height}px'>{''.join(parts)}"
    f"</div><p>{legend}</p></div>"
  )


def packing(p, width: int = 960, height: int = 240, most: int = 400) -> str:
  """An SVG of `p.layout`: x the schedule, y the offset in the temp block; the peak marked."""
  esc = _html.escape
  layout = sorted(p.layout, key=lambda b: b[0] - b[1])[:most]
  steps = max(len(p.timeline), 1)
  top = max((b[1] for b in layout), default=0) or 1
  rects = "".join(
    f"<rect x='{width * s / steps:.1f}' y='{height * (1 - hi / top):.1f}' "
    f"width='{max(width * (e - s) / steps, 0.5):.1f}' "
    f"height='{max(height * (hi - lo) / top, 0.5):.1f}' "
    f"fill='#9c755f' fill-opacity='0.6' stroke='#fff' stroke-width='0.3'><title>"
    f"{esc(v)}: {esc(format_bytes(hi - lo))} at offset {lo}, steps {s}-{e}</title></rect>"
    for lo, hi, s, e, v in layout
  )
  x = width * (p.peak_step + 0.5) / steps
  return (
    f"<div><p>XLA's packing of the temporaries ({esc(format_bytes(p.temp_bytes))} block; "
    f"x: schedule step, y: offset; the dashed line is the peak):</p>"
    f"<svg width='{width}' height='{height}' style='background:#f4f4f4'>{rects}"
    f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{height}' stroke='#000' "
    "stroke-dasharray='4 3'/></svg></div>"
  )
