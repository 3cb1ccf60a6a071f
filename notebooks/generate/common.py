"""Builds a notebook from (kind, source) cells, executes it, fills <<name>> placeholders in
markdown from a FIGURES dict the notebook defines, and saves it with outputs.

Regenerate a notebook (outputs and the numbers quoted in its text, from one run):
  PYTHONPATH=. python notebooks/generate/nb1.py     # likewise nb2.py, nb3.py, nb4.py
"""
import json, os, re, sys, time
import nbformat
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NBDIR = os.path.join(REPO, "notebooks")


_NOISE = ("cudart_stub.cc", "absl::InitializeLog()")


def _plugin_noise(out):
  if out.get("output_type") != "stream" or out.get("name") != "stderr":
    return False
  kept = [l for l in out["text"].splitlines(True) if not any(n in l for n in _NOISE)]
  out["text"] = "".join(kept)
  return not kept


def build(name, cells):
  nb = nbformat.v4.new_notebook()
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                               "language": "python"}
  nb.metadata["language_info"] = {"name": "python"}
  for kind, src in cells:
    src = src.strip("\n")
    nb.cells.append(nbformat.v4.new_markdown_cell(src) if kind == "md"
                    else nbformat.v4.new_code_cell(src))
  probe = nbformat.v4.new_code_cell("import json as _json; print(_json.dumps(FIGURES))")
  nb.cells.append(probe)
  env = dict(os.environ, PYTHONPATH=REPO)
  client = NotebookClient(nb, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": NBDIR}})
  t0 = time.perf_counter()
  client.execute(env=env)
  seconds = time.perf_counter() - t0
  figures = json.loads(nb.cells[-1].outputs[0]["text"])
  nb.cells.pop()
  missing = set()
  for cell in nb.cells:
    if cell.cell_type == "markdown":
      def sub(m):
        key = m.group(1)
        if key not in figures:
          missing.add(key)
          return m.group(0)
        return str(figures[key])
      cell.source = re.sub(r"<<(\w+)>>", sub, cell.source)
  for cell in nb.cells:  # the CUDA plugin's start-up lines ("no CUDA drivers") are not results
    if cell.cell_type == "code":
      cell.outputs = [o for o in cell.outputs if not _plugin_noise(o)]
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if out.get("output_type") == "stream" and out.get("name") == "stderr":
        print("STDERR in cell:", cell.source[:60], "->", out["text"][:300], file=sys.stderr)
  if missing:
    raise SystemExit(f"missing figures: {missing}")
  # Clean ids/metadata noise.
  for i, cell in enumerate(nb.cells):
    cell.id = f"cell-{i:02d}"
    cell.metadata = {}
  nbformat.validate(nb)
  path = os.path.join(NBDIR, name)
  nbformat.write(nb, path)
  print(f"{name}: executed in {seconds:.1f} s; figures: {figures}")
  return figures
