#!/usr/bin/env bash
# The test command: makes .venv (if missing), installs the package with its test extra, runs every
# test, doctest and notebook. Usage: bash scripts/test.sh [pytest args]
# PYTHON picks the interpreter (default python3), VENV the environment folder (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
exec "$VENV/bin/python" -m pytest "$@"
