"""Looks at a page as a person would, in headless Chromium (Debian's `chromium`, started here).

`look(page, shots)` opens `page` in a 1280 px wide frame and returns what a reader would check:
the title, the first heading, whether the first picture, table or code block rendered (a picture
with its pixels loaded, a box with a size), the page's width (wider than the frame means a
horizontal scroll bar), every code block or table whose content is cut (wider than its box), and
the script errors Chromium logged. It also saves a screenshot of the first screen into `shots`.

The frame is an `<iframe>` in a page of its own (a temporary file), read with
`--allow-file-access-from-files`; the report comes back through `--dump-dom`. No driver, nothing
downloaded.
"""

from __future__ import annotations

import dataclasses
import html
import json
import pathlib
import re
import shutil
import subprocess
import tempfile

WIDTH, HEIGHT = 1280, 1000
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
_FRAME = """<!doctype html><meta charset="utf-8"><body style="margin:0">
<iframe id="f" src="{src}" style="width:{w}px;height:{h}px;border:0"></iframe>
<pre id="report">pending</pre>
<script>
document.getElementById("f").addEventListener("load", () => setTimeout(() => {{
  const d = document.getElementById("f").contentDocument;
  const box = e => e.getBoundingClientRect();
  const first = d.querySelector("article img, article table, article pre, main img, main table,"
                                + " main pre, body img, body table, body pre");
  const drawn = first && box(first).width > 0 && box(first).height > 0
                && (first.tagName !== "IMG" || (first.complete && first.naturalWidth > 0));
  const cut = [...d.querySelectorAll("pre, table, div.highlight, .pst-scrollable-table-container")]
    .filter(e => box(e).width > 0 && e.scrollWidth > e.clientWidth + 1)
    .map(e => e.tagName + " " + e.clientWidth + " < " + e.scrollWidth + ": "
              + e.textContent.trim().slice(0, 80));
  const h1 = d.querySelector("h1");
  document.getElementById("report").textContent = JSON.stringify({{
    title: d.title, heading: h1 ? h1.textContent.trim() : "", first: first ? first.tagName : "",
    drawn: !!drawn, width: d.documentElement.scrollWidth, cut: cut,
    pictures: [...d.images].map(i => i.complete && i.naturalWidth > 0)}});
}}, 500));
</script>"""


@dataclasses.dataclass
class Look:
  """What a reader sees of one page at 1280 px."""

  title: str
  heading: str
  first: str  # the tag of the first picture, table or code block ("" if none)
  drawn: bool  # it rendered: a loaded picture, a box with a size
  width: int  # the page's scroll width: over 1280 is a horizontal scroll bar
  cut: list  # code blocks and tables whose content is wider than their box
  pictures: list  # per <img>: whether its pixels loaded
  errors: list  # script errors Chromium logged
  screenshot: pathlib.Path


def chromium() -> str | None:
  for name in ("chromium", "chromium-browser", "google-chrome"):
    if found := shutil.which(name):
      return found
  return None


def run(args: list[str]) -> subprocess.CompletedProcess:
  with tempfile.TemporaryDirectory() as profile:
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180)


def look(page: pathlib.Path, shots: pathlib.Path) -> Look:
  """Opens `page` at 1280 px; its report, and its first screen saved as `shots/<name>.png`."""
  shots.mkdir(parents=True, exist_ok=True)
  name = re.sub(r"[^A-Za-z0-9_.-]", "_", page.stem)
  with tempfile.TemporaryDirectory() as scratch:
    frame = pathlib.Path(scratch) / "frame.html"
    frame.write_text(_FRAME.format(src=html.escape(page.resolve().as_uri()), w=WIDTH, h=HEIGHT))
    done = run(["--allow-file-access-from-files", "--enable-logging=stderr", "--v=0",
                 "--virtual-time-budget=5000", f"--window-size={WIDTH + 20},{HEIGHT + 200}",
                 "--dump-dom", frame.as_uri()])
  found = re.search(r'<pre id="report">(.*?)</pre>', done.stdout, re.S)
  assert done.returncode == 0 and found, done.stderr[-2000:]
  report = json.loads(html.unescape(found.group(1)))
  errors = [line for line in done.stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
  shot = shots / f"{name}.png"
  run([f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}", "--virtual-time-budget=5000",
        page.resolve().as_uri()])
  return Look(**report, errors=errors, screenshot=shot)
