#!/usr/bin/env bash
# Builds the documentation site into docs/_build/html: installs the package with its docs extra
# into .venv (like scripts/test.sh), builds from scratch with Sphinx (warnings are errors, every
# cross-reference must resolve: nitpicky in docs/conf.py), then checks every internal link of the
# built pages (scripts/docs_links.py). Offline: nothing is fetched while building, and the
# notebooks are rendered from their executed .ipynb without running them.
# Usage: bash scripts/docs.sh [sphinx-build args]    then open docs/_build/html/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
if ! "$VENV/bin/python" -c "import donate, sphinx, myst_nb, sphinx_book_theme" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e ".[docs]"
fi
rm -rf docs/_build docs/_autosummary docs/_generated  # a fresh build: -W sees every warning
start=$SECONDS
"$VENV/bin/python" -m sphinx -W --keep-going -b html -q docs docs/_build/html "$@"
"$VENV/bin/python" scripts/docs_links.py docs/_build/html
echo "docs: built docs/_build/html in $((SECONDS - start)) s"
