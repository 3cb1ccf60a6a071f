"""Regenerates docs/doctor_report.png, the README's picture of the memory doctor's report.

A real run, not a drawing: a small training script (the demo's 4-layer transformer with Adam,
copied from `donate._examples`) runs unchanged under `python -m donate.profile`, which writes one
HTML page per compiled program; the training step's page is opened in headless Chromium (Debian's
`chromium`) at 1280 px and its first screen saved as the PNG.

  python scripts/report_picture.py [--out docs/doctor_report.png] [--height 1040] [--keep DIR]

Re-run it whenever the report's page changes.
"""

from __future__ import annotations

import argparse
import inspect
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL = ("_norm", "_causal_attention", "lm_init", "lm_loss", "adam_init", "lm_train_step")
STEPS = """
params = lm_init(jax.random.key(0))
opt = adam_init(params)
tokens = jax.random.randint(jax.random.key(1), (8, 129), 0, 512)
train_step = jax.jit(lm_train_step)
for _ in range(2):
  params, opt, loss = train_step(params, opt, tokens)
print("loss", float(loss))
"""


def train_script() -> str:
  """A user's train.py: the demo's model (copied from donate/_examples.py, so the report's source
  lines name train.py) and two training steps."""
  sys.path.insert(0, str(REPO))
  from donate import _examples

  head = "import jax\nimport jax.numpy as jnp\nfrom jax import lax\n\n"
  return head + "\n\n".join(inspect.getsource(getattr(_examples, n)) for n in MODEL) + STEPS
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def chromium() -> str:
  for name in ("chromium", "chromium-browser", "google-chrome"):
    if found := shutil.which(name):
      return found
  sys.exit("report_picture: no Chromium (apt-get install chromium)")


def screenshot(page: pathlib.Path, png: pathlib.Path, width: int = 1280, height: int = 900):
  """Saves the first `width` x `height` pixels of `page` as rendered by headless Chromium."""
  with tempfile.TemporaryDirectory() as profile:
    subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                    f"--window-size={width},{height}", f"--screenshot={png}",
                    "--virtual-time-budget=5000", page.as_uri()],
                   check=True, capture_output=True, timeout=180)


def report_page(folder: pathlib.Path) -> pathlib.Path:
  """Runs the training script under `python -m donate.profile`; the training step's page."""
  (folder / "train.py").write_text(train_script())
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  env.setdefault("JAX_PLATFORMS", "cpu")
  subprocess.run([sys.executable, "-m", "donate.profile", "--out", "pages", "train.py"],
                 cwd=folder, env=env, check=True)
  pages = sorted((folder / "pages").glob("*lm_train_step*.html"))
  if not pages:
    sys.exit(f"report_picture: no page of lm_train_step in {folder / 'pages'}")
  return pages[0]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs" / "doctor_report.png")
  parser.add_argument("--height", type=int, default=1040)
  parser.add_argument("--keep", type=pathlib.Path, help="run in this folder and keep its pages")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as scratch:
    folder = args.keep or pathlib.Path(scratch)
    folder.mkdir(parents=True, exist_ok=True)
    page = report_page(folder)
    screenshot(page, args.out.resolve(), height=args.height)
  print(f"report_picture: {page.name} -> {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
