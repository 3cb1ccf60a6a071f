"""Link check within the built site: every internal href/src of every page resolves to a file, and
every #fragment to an id (or name) in that file. Offline: links with a scheme are not followed.

Usage: python scripts/docs_links.py [docs/_build/html]    (exit status 1 and a list when broken)
"""

import html.parser
import pathlib
import sys
import urllib.parse

REPO = pathlib.Path(__file__).resolve().parent.parent


class _Page(html.parser.HTMLParser):
  """The ids a page defines and the links it makes."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.ids, self.links = set(), []

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    for key in ("id", "name") if tag == "a" else ("id",):
      if attrs.get(key):
        self.ids.add(attrs[key])
    for key in ("href", "src"):
      if attrs.get(key):
        self.links.append(attrs[key])


def _parse(path: pathlib.Path) -> _Page:
  page = _Page()
  page.feed(path.read_text(encoding="utf-8", errors="replace"))
  return page


def _pages(site: pathlib.Path) -> list[pathlib.Path]:
  """The site's pages; _static/ holds the theme's template fragments, which are not pages."""
  return [p for p in sorted(site.rglob("*.html")) if "_static" not in p.relative_to(site).parts]


def broken_links(site: pathlib.Path) -> list[str]:
  """'page: link (why)' for every internal link of the site that does not resolve."""
  pages = {p.resolve(): _parse(p) for p in _pages(site)}
  broken = []
  for path, page in pages.items():
    for link in page.links:
      parts = urllib.parse.urlsplit(link)
      if parts.scheme or link.startswith("//"):
        continue  # external (http, https, mailto, data): not followed offline
      target = (path.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else path
      where = f"{path.relative_to(site.resolve())}: {link}"
      if target.is_dir():
        target = target / "index.html"
      if not target.exists():
        broken.append(f"{where} (no file)")
      elif parts.fragment and target.suffix == ".html":
        ids = pages[target].ids if target in pages else _parse(target).ids
        if urllib.parse.unquote(parts.fragment) not in ids:
          broken.append(f"{where} (no id {parts.fragment!r})")
  return broken


def main(argv: list[str]) -> int:
  site = pathlib.Path(argv[0]) if argv else REPO / "docs" / "_build" / "html"
  if not (site / "index.html").exists():
    print(f"docs_links: no built site at {site} (run bash scripts/docs.sh)", file=sys.stderr)
    return 1
  broken = broken_links(site)
  for line in broken:
    print(f"broken link: {line}", file=sys.stderr)
  count = len(_pages(site))
  print(f"docs_links: {count} pages, {len(broken)} broken internal links")
  return 1 if broken else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
