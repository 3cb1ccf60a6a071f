"""Writes each notebook from its source and checks that the committed files match it.

The source of notebook `notebooks/NN_name.py` is in jupytext's percent format (`# %%` code cells,
`# %% [markdown]` text cells); it is what people edit and review. From it this tool writes
`notebooks/NN_name.ipynb`, executed in a fresh "python3" kernel (outputs kept, so the notebook reads
with its results wherever .ipynb files render), and `docs/notebooks/NN_name.html`, the same executed
notebook as one HTML page. Both carry the digest of the source's cells they were made from
(`source_digest`), so a check can tell an .ipynb or a page left behind by an edit of the source.

Maintainer tool behind `scripts/notebooks.sh` (which sets up the environment); `tests/` imports it
for `execute` and `problems`, so the test suite runs and checks notebooks exactly as written here.

Usage:
  python scripts/notebooks.py [NAME ...]   write every notebook, or those whose file name starts
                                           with one of the NAMEs (e.g. `02`)
  python scripts/notebooks.py --check      list what does not match its source; exit 1 if any
"""

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
HTML = REPO / "docs" / "notebooks"
CELL_TIMEOUT = 300  # seconds per cell
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
DIGEST_META = "donate-notebook-source"  # the HTML page's <meta name=...> carrying the digest
# The CUDA plugin of the test extra prints these start-up lines in every process (no CUDA drivers
# here); they are not results.
_PLUGIN_NOISE = ("cudart_stub.cc", "absl::InitializeLog()")


def sources() -> list[Path]:
  """The notebook sources, `notebooks/*.py`, in order."""
  return sorted(NOTEBOOKS.glob("*.py"))


def read_source(path: Path):
  """The notebook that the percent-format source `path` describes (cells only, no outputs)."""
  import jupytext  # noqa: PLC0415 - only the tools and tests that handle notebooks need it

  return jupytext.read(path, fmt="py:percent")


def cells(nb) -> list[tuple[str, str]]:
  """What a notebook says: each cell's type and source, without outputs, ids or metadata."""
  return [(cell.cell_type, cell.source) for cell in nb.cells]


def source_digest(nb) -> str:
  """A digest of `cells(nb)`: equal digests, equal cells."""
  return hashlib.sha256(json.dumps(cells(nb)).encode()).hexdigest()


def kernel_env() -> dict[str, str]:
  """The kernel's environment: this one, with this checkout first on PYTHONPATH unless this
  interpreter imports `donate` from elsewhere (an installed wheel, which the kernel then uses)."""
  spec = importlib.util.find_spec("donate")
  home = Path(spec.origin).resolve().parent.parent if spec is not None and spec.origin else REPO
  if home != REPO:
    return dict(os.environ)
  paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
  return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def execute(nb):
  """Runs `nb` in place, top to bottom, in a new "python3" kernel working in notebooks/.

  Raises `nbclient.exceptions.CellExecutionError` at the first cell that fails.
  """
  import nbclient  # noqa: PLC0415

  client = nbclient.NotebookClient(
      nb, timeout=CELL_TIMEOUT, kernel_name=KERNELSPEC["name"], allow_errors=False,
      record_timing=False, resources={"metadata": {"path": str(NOTEBOOKS)}})
  client.execute(env=kernel_env())
  return nb


def _drop_plugin_noise(cell) -> None:
  kept = []
  for out in cell.get("outputs", []):
    if out.get("output_type") == "stream" and out.get("name") == "stderr":
      out["text"] = "".join(line for line in out["text"].splitlines(True)
                            if not any(noise in line for noise in _PLUGIN_NOISE))
      if not out["text"]:
        continue
    kept.append(out)
  cell.outputs = kept


def _html_page(nb, digest: str) -> str:
  """The page of the executed `nb`; the stylesheets nbconvert would inline in every page are
  written once, beside the pages, and linked."""
  import markupsafe  # noqa: PLC0415 - installed with nbconvert
  import nbconvert  # noqa: PLC0415 - installed by scripts/notebooks.sh, not by the test extra

  class Exporter(nbconvert.HTMLExporter):
    def _init_resources(self, resources):
      resources = super()._init_resources(resources)
      inline = resources["include_css"]

      def link(name):
        css = inline(name).removeprefix('<style type="text/css">\n').removesuffix("</style>")
        (HTML / Path(name).name).write_text(css, encoding="utf-8")
        return markupsafe.Markup(f'<link rel="stylesheet" href="{Path(name).name}">')

      resources["include_css"] = link
      return resources

  body, _ = Exporter().from_notebook_node(nb)
  return body.replace("<head>", f'<head>\n<meta name="{DIGEST_META}" content="{digest}">', 1)


def write(source: Path) -> None:
  """Writes the executed .ipynb of `source` beside it and its HTML page under docs/notebooks/."""
  import nbformat  # noqa: PLC0415

  nb = read_source(source)
  digest = source_digest(nb)
  nb.metadata = {"kernelspec": dict(KERNELSPEC)}
  execute(nb)
  for i, cell in enumerate(nb.cells):  # stable ids and no metadata: small diffs between runs
    cell.id = f"cell-{i:02d}"
    cell.metadata = {}
    if cell.cell_type == "code":
      _drop_plugin_noise(cell)
      for out in cell.outputs:
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
          print(f"{source.name}: stderr in cell {i}: {out['text'][:300]}", file=sys.stderr)
  nb.metadata["donate"] = {"source_sha256": digest}
  nbformat.validate(nb)
  nbformat.write(nb, source.with_suffix(".ipynb"))
  HTML.mkdir(parents=True, exist_ok=True)
  (HTML / f"{source.stem}.html").write_text(_html_page(nb, digest), encoding="utf-8")


def problems(source: Path) -> list[str]:
  """What in the committed files does not match `source`; empty when the .ipynb and page do."""
  import nbformat  # noqa: PLC0415

  fix = "run `bash scripts/notebooks.sh " + source.stem[:2] + "`"
  ipynb, page = source.with_suffix(".ipynb"), HTML / f"{source.stem}.html"
  if not ipynb.exists():
    return [f"{source.name}: no {ipynb.name} beside it; {fix}"]
  want = read_source(source)
  digest = source_digest(want)
  have = nbformat.read(ipynb, as_version=4)
  found = []
  if cells(have) != cells(want):
    at = next((i for i, (a, b) in enumerate(zip(cells(have), cells(want))) if a != b),
              min(len(have.cells), len(want.cells)))
    found.append(f"{ipynb.name} differs from {source.name} from cell {at} on "
                 f"({len(have.cells)} cells vs {len(want.cells)}); {fix}")
  elif have.metadata.get("donate", {}).get("source_sha256") != digest:
    found.append(f"{ipynb.name} has the cells of {source.name} but outputs of another version; {fix}")
  if not page.exists():
    found.append(f"{source.name}: no docs/notebooks/{page.name}; {fix}")
  elif f'<meta name="{DIGEST_META}" content="{digest}">' not in page.read_text(encoding="utf-8"):
    found.append(f"docs/notebooks/{page.name} was made from another version of {source.name}; {fix}")
  return found


def orphans() -> list[str]:
  """The notebooks and pages whose source is gone."""
  stems = {source.stem for source in sources()}
  made = [*NOTEBOOKS.glob("*.ipynb"), *HTML.glob("*.html")]
  return [f"{p.relative_to(REPO)} has no source notebooks/{p.stem}.py" for p in made
          if p.stem not in stems]


def main(argv: list[str]) -> int:
  if argv == ["--check"]:
    found = orphans() + [p for source in sources() for p in problems(source)]
    print("\n".join(found) or "every notebook matches its source")
    return 1 if found else 0
  chosen = [s for s in sources() if not argv or any(s.name.startswith(name) for name in argv)]
  if not chosen:
    print(f"no notebook source in notebooks/ matches {argv}", file=sys.stderr)
    return 2
  for source in chosen:
    print(f"{source.name} -> {source.with_suffix('.ipynb').name}, docs/notebooks/{source.stem}.html")
    write(source)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
