#!/usr/bin/env bash
# Maintainer tool: writes the notebooks from their sources. For each notebooks/NN_name.py (jupytext
# percent format, the file to edit) it writes notebooks/NN_name.ipynb, executed, and
# docs/notebooks/NN_name.html (scripts/notebooks.py). The test suite fails until both match the source.
#
# Usage: bash scripts/notebooks.sh [NAME ...]   all notebooks, or those whose name starts with NAME
#        bash scripts/notebooks.sh --check      only list what does not match its source
# Uses .venv like scripts/test.sh (PYTHON picks the interpreter, VENV the folder; the committed
# notebooks are made with Python 3.11 and jax 0.10), with the test extra and nbconvert (for the HTML).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
if ! "$VENV/bin/python" -c "import donate, jupytext, nbclient, nbconvert" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q -e ".[test]" nbconvert
fi
"$VENV/bin/python" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
exec "$VENV/bin/python" scripts/notebooks.py "$@"
