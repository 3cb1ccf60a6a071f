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
import json

from donate._base.text import format_bytes
from donate._profile.naming import layer_scope, middle
from donate._xla import frames as _frames

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


def _split(items: list, length: float, least: float = 3.0) -> list:
  """`items` ((bytes, payload), largest first) with those under `least` px of `length` merged
  into one last item (`payload` None): the smallest blocks fold, never the largest."""
  total = sum(b for b, _ in items) or 1
  keep = [(b, x) for b, x in items if length * b / total >= least]
  rest = [(b, x) for b, x in items if length * b / total < least]
  if rest:
    keep.append((sum(b for b, _ in rest), None))
  return keep


def _group_key(e) -> str:
  if e.scope:
    return layer_scope(e.scope) or e.scope
  path = e.path or e.value
  cut = max(path.rfind("["), path.rfind("."))
  return path[:cut] if cut > 0 else path


def interactive(p, width: int = 1152, height: int = 420) -> tuple[str, str]:
  """The peak as an SVG treemap, category -> layer or scope -> buffer (its path or line), and
  the script that shows a block's path, line (the user's, then the library's), scope and bytes
  on hover: (html, script).

  Categories are columns (width by bytes), their scopes rows, a scope's buffers side by side;
  blocks under 3 px fold into one "small buffers" block, the last and smallest of their row."""
  esc = _html.escape
  by_cat: dict[str, dict[str, list]] = {}
  for e in p.at_peak:
    if e.nbytes:
      by_cat.setdefault(e.category, {}).setdefault(_group_key(e), []).append(e)
  cats = sorted(
    ((sum(x.nbytes for g in gs.values() for x in g), c) for c, gs in by_cat.items()), reverse=True
  )
  rects: list[str] = []
  info: list[list] = []
  x = 0.0
  total = sum(b for b, _ in cats) or 1
  for cbytes, cat in _split([(b, c) for b, c in cats], width):
    w = width * cbytes / total
    colour = COLOURS.get(cat, "#888")
    groups = (
      sorted(
        ((sum(e.nbytes for e in es), k) for k, es in by_cat.get(cat, {}).items()), reverse=True
      )
      if cat is not None
      else []
    )
    y = 0.0
    for gbytes, key in _split(groups, height) or [(cbytes, None)]:
      h = height * gbytes / (cbytes or 1)
      entries = sorted(by_cat[cat][key], key=lambda e: -e.nbytes) if key is not None else []
      bx = x
      for ebytes, e in _split([(e.nbytes, e) for e in entries], w) or [(gbytes, None)]:
        bw = w * ebytes / (gbytes or 1)
        k = len(info)
        if e is None:
          label = f"{cat or 'other'}: small buffers"
          info.append([label, "", key or "", format_bytes(ebytes)])
        else:
          label = e.path or _frames.short(e.source) or e.value
          info.append(
            [label, e.source or "", e.scope or "", format_bytes(e.nbytes), cat, e.library or ""]
          )
        rects.append(
          f"<rect x='{bx:.1f}' y='{y:.1f}' width='{max(bw, 0.5):.1f}' height='{max(h, 0.5):.1f}' "
          f"fill='{colour}' stroke='#fff' stroke-width='1' data-k='{k}'/>"
        )
        if bw > 60 and h > 14:
          text = middle(label, int(bw / 6.5))
          rects.append(f"<text x='{bx + 3:.1f}' y='{y + 12:.1f}'>{esc(text)}</text>")
        bx += bw
      y += h
    x += w
  svg = (
    f"<svg id='treemap' width='{width}' height='{height}' role='img' "
    f"style='background:#fff;display:block'>{''.join(rects)}</svg><div id='tip'></div>"
  )
  script = (
    f"const INFO={json.dumps(info)};"
    "const tip=document.getElementById('tip');"
    "function show(ev){const k=ev.target.getAttribute('data-k');if(k===null){tip.style.display="
    "'none';return;}const [n,l,s,b,c,f]=INFO[+k];tip.textContent='';"
    "for(const t of [n,c?('category: '+c):'',l?('line: '+l):'',f?('library: '+f):'',"
    "s?('scope: '+s):'','bytes: '+b])"
    "{if(t){const d=document.createElement('div');d.textContent=t;tip.appendChild(d);}}"
    "tip.style.display='block';tip.style.left=Math.min(ev.clientX+12,innerWidth-540)+'px';"
    "tip.style.top=(ev.clientY+12)+'px';}"
    "const tm=document.getElementById('treemap');tm.addEventListener('mousemove',show);"
    "tm.addEventListener('mouseleave',()=>{tip.style.display='none';});"
  )
  return svg, script
