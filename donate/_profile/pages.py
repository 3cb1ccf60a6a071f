"""The report's pages: `index.html` (the verdict, programs ranked by peak) and one page per program
(the verdict, an interactive treemap of the peak, the by-line table folded by layers, the timeline,
XLA's copies, the measured remedies, the full text). Self-contained: inline CSS, SVG and a few
lines of script, nothing fetched; at most 1200 px wide.
"""

from __future__ import annotations

import html as _html
import json
import os
import re

from donate._base.text import format_bytes
from donate._profile import report, views
from donate._profile.treemap import COLOURS, interactive, packing

esc = _html.escape
WIDTH = 1200

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#222;margin:0;
background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px;box-sizing:border-box}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{background:#fff;border-left:5px solid #4e79a7;padding:10px 14px;margin:12px 0;
box-shadow:0 1px 2px #0002;font-size:15px}
.verdict.bad{border-left-color:#e15759}
table{border-collapse:collapse;width:100%;table-layout:fixed;background:#fff}
td,th{padding:4px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
th{background:#f0f0f0;font-weight:600}
td.n,th.n{text-align:right;white-space:nowrap}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
.bar{height:10px;background:#4e79a7;border-radius:2px}
.muted{color:#666}
pre{white-space:pre-wrap;background:#fff;padding:8px;font-size:12px;overflow-x:auto}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;padding:6px 8px;
border-radius:4px;font:12px ui-monospace,monospace;max-width:520px;display:none;z-index:9}
.legend span{display:inline-block;color:#fff;padding:1px 6px;margin:2px;border-radius:3px}
svg text{font:11px system-ui,sans-serif;fill:#fff;pointer-events:none}
a{color:#2f5f9e}
"""


def _page(title: str, body: str, script: str = "") -> str:
  return (
    "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
    "<meta name='viewport' content='width=device-width,initial-scale=1'>"
    f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>{body}</main>"
    + (f"<script>{script}</script>" if script else "")
    + "</body></html>"
  )


def file_name(k: int, p) -> str:
  """The page's file name: `NNN_function` (the JSON beside it shares the stem)."""
  return f"{k:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', p.function)[:80]}"


def _fits_class(p, device) -> str:
  return "verdict bad" if device is not None and not p.fits(device) else "verdict"


def index(found: list, device=None, advice=None, top=10, min_share=0.01, compared="") -> str:
  """The index page: the headline, one row per program shown (largest peak first, its verdict,
  a link to its page), the folded ones in one line, and the comparison with an earlier run."""
  shown, rest = report.ranked(found, top, min_share)
  position = {id(p): k for k, p in enumerate(found)}
  largest = shown[0].peak_bytes if shown else 1
  rows = []
  for p in shown:
    k = position[id(p)]
    line = report.verdict(p, device, (advice or {}).get(k))
    rows.append(
      f"<tr><td><a href='{esc(file_name(k, p))}.html'>{esc(p.function)}</a></td>"
      f"<td class='n'>{esc(format_bytes(p.peak_bytes))}</td><td><div class='bar' "
      f"style='width:{100 * p.peak_bytes / (largest or 1):.1f}%'></div></td>"
      f"<td>{esc(line)}</td></tr>"
    )
  head = report.summary(found, device, advice, top, min_share).splitlines()[0]
  first = shown[0] if shown else None
  verdict = (
    report.verdict(first, device, (advice or {}).get(position[id(first)]))
    if first
    else "no compiled programs"
  )
  body = (
    f"<h1>Memory report</h1><p class='muted'>{esc(head)}</p>"
    f"<div class='{_fits_class(first, device) if first else 'verdict'}' id='verdict'>"
    f"{esc(verdict)}</div>"
    "<h2>Programs by peak</h2><table><colgroup><col style='width:18%'><col style='width:10%'>"
    "<col style='width:14%'><col></colgroup><tr><th>program</th><th class='n'>peak</th>"
    f"<th></th><th>what to know</th></tr>{''.join(rows)}</table>"
    + (f"<p class='muted' id='folded'>{esc(report.folded(rest, min_share))}</p>" if rest else "")
    + (f"<h2>Against the earlier run</h2><pre>{esc(compared)}</pre>" if compared else "")
  )
  return _page("donate.profile: memory report", body)


def _groups_table(p) -> str:
  rows = "".join(
    f"<tr><td class='n'>{esc(format_bytes(g.total_bytes))}</td><td>{esc(g.category)}</td>"
    f"<td><code>{esc(str(g))}</code>"
    + (f"<br><span class='muted'>in <code>{esc(g.library)}</code></span>" if g.library else "")
    + "</td></tr>"
    for g in report.groups(p)[:40]
  )
  return (
    "<table><colgroup><col style='width:11%'><col style='width:15%'><col></colgroup>"
    "<tr><th class='n'>bytes</th><th>category</th><th>buffers (layers x count x size at the "
    f"user's line, scopes; the library's line under it)</th></tr>{rows}</table>"
  )


def timeline(p, width: int = WIDTH - 48, height: int = 180) -> str:
  """An SVG of the bytes live at each step of the schedule, the peak marked."""
  totals = p.timeline.totals() if hasattr(p.timeline, "totals") else []
  if not totals:
    return ""
  n, top = len(totals), max(totals) or 1
  stride = max(1, n // width)
  points = " ".join(
    f"{width * k / max(n - 1, 1):.1f},{height - height * max(totals[k : k + stride]) / top:.1f}"
    for k in range(0, n, stride)
  )
  x = width * p.peak_step / max(n - 1, 1)
  return (
    f"<svg width='{width}' height='{height + 16}' style='background:#fff' role='img'>"
    f"<polyline fill='none' stroke='#4e79a7' stroke-width='1.5' points='{points}'/>"
    f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{height}' stroke='#e15759' "
    f"stroke-dasharray='4 3'/><text x='{min(x + 4, width - 160):.1f}' y='12' "
    f"style='fill:#e15759'>peak {esc(format_bytes(p.peak_bytes))} at step {p.peak_step}</text>"
    f"<text x='0' y='{height + 14}' style='fill:#666'>step 0</text><text x='{width - 60}' "
    f"y='{height + 14}' style='fill:#666'>step {n - 1}</text></svg>"
  )


def _copies(p) -> str:
  copies = [e for e in p.at_peak if e.kind == "copy"]
  if not copies:
    return "<p class='muted'>XLA added no copy live at the peak.</p>"
  rows = "".join(
    f"<tr><td class='n'>{esc(format_bytes(e.nbytes))}</td><td><code>{esc(e.value)}</code></td>"
    f"<td>a copy XLA added of <code>{esc(e.path or e.source or '?')}</code>"
    f"{' (' + esc(e.scope) + ')' if e.scope else ''}: its layout or a buffer an output or a "
    "loop writes in place needs its own</td></tr>"
    for e in copies[:20]
  )
  return f"<table><tr><th class='n'>bytes</th><th>value</th><th>why</th></tr>{rows}</table>"


def _remedies(items) -> str:
  if items is None:
    return (
      "<p class='muted'>Not measured: run with <code>--advice</code> (one compile per remedy), "
      "or in Python <code>donate.memory_profile(jax.jit(f), *args).advice()</code>.</p>"
    )
  rows = "".join(
    f"<tr><td>{esc(report.change(a))}</td>"
    + (
      f"<td>{esc(views.device(a))}</td><td class='n'>{esc(format_bytes(a.saving_bytes))}</td>"
      if a.peak_bytes is not None
      else f"<td>stated</td><td class='n'>{esc(format_bytes(a.saving_bytes))}</td>"
    )
    + f"<td><code>{esc(a.how)}</code></td></tr>"
    for a in items
  )
  return (
    "<table><colgroup><col style='width:32%'><col style='width:18%'><col style='width:11%'>"
    "<col></colgroup><tr><th>change</th><th>peak</th><th class='n'>saved at the "
    f"peak</th><th>how</th></tr>{rows}</table>"
  )


def program(p, device=None, advice=None, fit=None) -> str:
  """One program's page (see the module docstring)."""
  figures = (
    f"peak {views.device(p)} at step {p.peak_step} of {len(p.timeline)}; "
    f"{format_bytes(p.reserved_bytes)} allocated: arguments {format_bytes(p.argument_bytes)}, "
    f"outputs {format_bytes(p.output_bytes)}, aliased {format_bytes(p.alias_bytes)}, "
    f"temporaries {format_bytes(p.temp_bytes)}"
  )
  legend = "".join(
    f"<span style='background:{COLOURS.get(g.key, '#888')}'>{esc(g.key)} "
    f"{esc(format_bytes(g.total_bytes))}</span>"
    for g in p.by_category()
  )
  could = "".join(f"<li>{esc(str(s))}</li>" for s in p.could_donate)
  tree, script = interactive(p, WIDTH - 48, 420)
  body = (
    f"<p><a href='index.html'>&larr; all programs</a></p><h1>{esc(p.function)}</h1>"
    f"<div class='{_fits_class(p, device)}' id='verdict'>{esc(report.verdict(p, device, advice))}"
    "</div>"
    + (f"<div class='verdict'>{esc(str(fit))}</div>" if fit is not None else "")
    + f"<p class='muted'>{esc(figures)} ({esc(p.platform)}, per device). "
    f"{esc(views.saving(p))}</p>"
    f"<h2>The peak by category, layer and line</h2><p class='legend'>{legend}</p>{tree}"
    "<p class='muted'>Hover a block for its path, line, scope and bytes.</p>"
    f"<h2>Where the bytes at the peak come from</h2>{_groups_table(p)}"
    f"<h2>Timeline</h2>{timeline(p)}"
    f"<h2>Measured remedies</h2>{_remedies(advice)}"
    + (
      f"<h2>Could donate</h2><details><summary>{len(p.could_donate)} inputs an output of their "
      "shape could reuse, leaf by leaf (what donating them saves is one measured total, under "
      f"Measured remedies)</summary><ul>{could}</ul></details>"
      if could
      else ""
    )
    + f"<h2>Copies XLA added</h2>{_copies(p)}"
    + (
      f"<details><summary>XLA's packing of the temporaries</summary>{packing(p)}</details>"
      if p.layout
      else ""
    )
    + f"<details><summary>The full text</summary><pre>{esc(str(p))}</pre></details>"
  )
  return _page(f"{p.function}: memory", body, script)


def write(
  found: list, out: str, device=None, advice=None, fits=None, top=10, min_share=0.01, compared=""
) -> str:
  """Writes `index.html`, one page and one JSON (`report.record`) per program into `out`;
  the index's path."""
  os.makedirs(out, exist_ok=True)
  for k, p in enumerate(found):
    stem = os.path.join(out, file_name(k, p))
    with open(stem + ".html", "w", encoding="utf-8") as fh:
      fh.write(program(p, device, (advice or {}).get(k), (fits or {}).get(k)))
    with open(stem + ".json", "w", encoding="utf-8") as fh:
      json.dump(report.record(p), fh, indent=1)
  path = os.path.join(out, "index.html")
  with open(path, "w", encoding="utf-8") as fh:
    fh.write(index(found, device, advice, top, min_share, compared))
  return path
