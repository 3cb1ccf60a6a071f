"""The documentation site as a reader gets it: the built pages opened in headless Chromium.

`bash scripts/docs.sh` builds docs/_build/html; this file then checks that the API page lists every
public name (`donate.__all__`, `donate.symm.__all__`, `donate.planner.__all__`,
`donate.targets.__all__`), each linked to a page that documents it, and looks at the pages a
newcomer opens first (the index, Getting started, the memory doctor's guide) and the doctor's own
HTML report as a person would (`tests/_browser.py`): the title, the first picture, table or code
block rendered, no script errors, nothing wider than a 1280 px window or cut inside its box. The
screenshots are kept for a person to look at, in $DONATE_SCREENSHOTS or the test's temporary
folder. Without a built site or a
Chromium these tests skip, saying why; CI (`.ci/run`) builds the site first and sets
DONATE_DOCS_REQUIRED=1, which turns a missing site or browser into a failure.

The link checker of the build (scripts/docs_links.py) is tested here too, on a tiny site.
"""

import html.parser
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

import donate
from donate import planner, symm, targets

import _browser

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

REPO = pathlib.Path(__file__).resolve().parent.parent
SITE = REPO / "docs" / "_build" / "html"
REQUIRED = os.environ.get("DONATE_DOCS_REQUIRED") == "1"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
MODULES = {"donate": donate, "donate.symm": symm, "donate.planner": planner,
           "donate.targets": targets}


def _missing(reason: str):
  if REQUIRED:
    pytest.fail(f"{reason} (DONATE_DOCS_REQUIRED=1: CI builds the site and installs Chromium)")
  pytest.skip(reason)


def _chromium() -> str:
  for name in ("chromium", "chromium-browser", "google-chrome"):
    found = shutil.which(name)
    if found:
      return found
  _missing("no Chromium to open the pages with (apt-get install chromium)")


class _Dom(html.parser.HTMLParser):
  """Links (text -> href), element ids and the text of one page."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.links, self.ids, self.text, self._href, self._words = {}, set(), [], None, []

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if attrs.get("id"):
      self.ids.add(attrs["id"])
    if tag == "a" and attrs.get("href"):
      self._href, self._words = attrs["href"], []

  def handle_data(self, data):
    self.text.append(data)
    if self._href is not None:
      self._words.append(data)

  def handle_endtag(self, tag):
    if tag == "a" and self._href is not None:
      self.links.setdefault("".join(self._words).strip(), self._href)
      self._href = None


def _parse(text: str) -> _Dom:
  dom = _Dom()
  dom.feed(text)
  return dom


def open_in_chromium(page: pathlib.Path) -> _Dom:
  """The DOM of `page` after Chromium has loaded it and run its scripts."""
  with tempfile.TemporaryDirectory() as profile:
    done = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                           "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=180)
  assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-2000:]
  return _parse(done.stdout)


def _expected_names():
  """(module name, public name) for every name the API page must list."""
  return [(module, name) for module, obj in MODULES.items() for name in obj.__all__]


def test_the_api_page_lists_every_public_name_in_chromium():
  page = SITE / "api.html"
  if not page.exists():
    _missing(f"no built site at {SITE.relative_to(REPO)} (bash scripts/docs.sh builds it)")
  dom = open_in_chromium(page)
  text = " ".join(dom.text)
  assert "API reference" in text
  missing, undocumented = [], []
  for module, name in _expected_names():
    full = f"{module}.{name}"
    target, ids = dom.links.get(full), {full, f"module-{full}"}
    if target is None and getattr(MODULES[module], name) is getattr(donate, name, None):
      target, ids = dom.links.get(f"donate.{name}"), {f"donate.{name}"}  # the same object
      if full not in text:
        target = None
    if target is None:
      missing.append(full)
      continue
    documented = (page.parent / target.split("#")[0]).resolve()
    if not documented.exists() or not ids & _parse(documented.read_text(encoding="utf-8")).ids:
      undocumented.append(f"{full} -> {target}")
  assert not missing, f"the API page does not list: {missing}"
  assert not undocumented, f"linked pages that do not document the name: {undocumented}"


def _docs_links():
  spec = importlib.util.spec_from_file_location("docs_links", REPO / "scripts" / "docs_links.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_link_check_finds_missing_pages_and_anchors(tmp_path):
  (tmp_path / "index.html").write_text(
      '<a href="a.html#x">ok</a> <a href="a.html#nope">anchor</a> <a href="gone.html">page</a>'
      '<a href="https://example.org/">external</a> <a href="#top">self</a><p id="top"></p>')
  (tmp_path / "a.html").write_text('<section id="x"></section><img src="_static/logo.png">')
  broken = _docs_links().broken_links(tmp_path)
  assert broken == ["a.html: _static/logo.png (no file)", "index.html: a.html#nope (no id 'nope')",
                    "index.html: gone.html (no file)"]


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> pathlib.Path:
  """Where the screenshots go: $DONATE_SCREENSHOTS, or a temporary folder of this test run."""
  folder = os.environ.get("DONATE_SCREENSHOTS")
  return pathlib.Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


def _reads_well(look: _browser.Look, title: str, first: str, heading: bool = True) -> None:
  assert look.screenshot.stat().st_size > 10_000, look.screenshot  # a page, not a blank screen
  assert title in look.title and (look.heading or not heading), (look.title, look.heading)
  assert look.first == first and look.drawn, (look.first, look.drawn)
  assert all(look.pictures), f"pictures that did not load: {look.pictures}"
  assert not look.errors, look.errors
  assert look.width <= _browser.WIDTH, f"the page is {look.width} px wide"
  assert not look.cut, f"cut at {_browser.WIDTH} px: {look.cut}"


@pytest.mark.parametrize(("page", "title", "first"), [
    ("index.html", "donate", "PRE"),
    ("getting_started.html", "Getting started", "PRE"),
    ("memory_profile.html", "Where the memory goes", "PRE"),
    ("benchmarks.html", "Benchmarks", "PRE"),
])
def test_a_newcomer_reads_the_page_at_1280_px(page, title, first, shots):
  if not _browser.chromium():
    _missing("no Chromium to open the pages with (apt-get install chromium)")
  if not (SITE / page).exists():
    _missing(f"no built site at {SITE.relative_to(REPO)} (bash scripts/docs.sh builds it)")
  look = _browser.look(SITE / page, shots)
  _reads_well(look, title, first)
  if page == "index.html":
    assert look.pictures, "the index shows the memory doctor's report"


def test_the_doctors_report_reads_well_at_1280_px(tmp_path, shots):
  if not _browser.chromium():
    _missing("no Chromium to open the pages with (apt-get install chromium)")
  (tmp_path / "train.py").write_text(
      "import jax, jax.numpy as jnp\n"
      "def step(w, x):\n"
      "  loss = lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)\n"
      "  return w - 0.1 * jax.grad(loss)(w)\n"
      "jax.jit(step)(jnp.ones((256, 256)), jnp.ones((64, 256)))\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  done = subprocess.run([sys.executable, "-m", "donate.profile", "--out", "pages", "train.py"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  page = next((tmp_path / "pages").glob("*step*.html"))
  look = _browser.look(page, shots)
  _reads_well(look, "step", look.first or "none")
  assert look.heading == "step" and look.first in {"IMG", "TABLE", "PRE", "svg"}, look
  index = _browser.look(tmp_path / "pages" / "index.html", shots)
  _reads_well(index, "", index.first or "none")
  assert index.heading == "Memory report" and index.first == "TABLE", index
