#!/usr/bin/env bash
# The test command: makes .venv (if missing), installs the package with its test extra, runs every
# test, doctest and notebook. Usage: bash scripts/test.sh [pytest args]
# PYTHON picks the interpreter (default python3; scripts/python.sh finds it), VENV the environment
# folder (default .venv). INSTALL=wheel tests the built distribution instead of the checkout: builds
# and checks the sdist and the wheel, installs the wheel into a fresh environment and runs the same
# tests against it from outside the source tree (scripts/wheel.sh). JAX=newest then moves jax and
# jaxlib to the newest release the package allows, past the CUDA plugin of the test extra when
# that lags (it is removed; the tests that compile for GPU targets then skip, saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${INSTALL:-editable}" = wheel ]; then
  bash scripts/wheel.sh build
  exec bash scripts/wheel.sh test "$@"
fi
source scripts/venv.sh
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test]"
if [ "${JAX:-}" = newest ]; then
  "$VENV/bin/python" -m pip uninstall -q -y jax-cuda12-plugin jax-cuda12-pjrt
  "$VENV/bin/python" -m pip install -q --upgrade "jax<0.13" "jaxlib<0.13"
  "$VENV/bin/python" -c "import jax; print('jax', jax.__version__)"
fi
"$VENV/bin/python" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
exec "$VENV/bin/python" -m pytest "$@"
