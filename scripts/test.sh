#!/usr/bin/env bash
# The test command: makes .venv (if missing), installs the package with its test extra, runs every
# test, doctest and notebook. Usage: bash scripts/test.sh [pytest args]
# PYTHON picks the interpreter (default python3), VENV the environment folder (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
# CPU is the only runtime here; the CUDA plugin (test extra, for compile-only H100/B200 targets)
# then skips its search for CUDA libraries in every process: tests, notebook kernels, subprocesses.
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
exec "$VENV/bin/python" -m pytest "$@"
