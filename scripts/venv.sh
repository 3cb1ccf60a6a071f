# Sourced by demo.sh, test.sh, notebooks.sh and wheel.sh (from the repository root): makes the
# environment folder VENV with the interpreter PYTHON (default python3) if it is missing. PYTHON is
# looked up by scripts/python.sh, so PYTHON=python3.12 works where python3.12 is a version
# manager's shim that does not run (pyenv's installed 3.12 is used then). VENV defaults to .venv,
# or, when PYTHON is given, to .venvXY for its version X.Y (.venv312), so an environment of another
# version is never reused.
# CPU is the only runtime here: with the CUDA plugin installed (test and gpu-aot extras, for
# compile-only H100/B200 targets), JAX_PLATFORMS=cpu keeps it from searching for CUDA libraries in
# every process (tests, notebook kernels, subprocesses), which would print plugin errors.
if [ -z "${VENV:-}" ] && [ -n "${PYTHON:-}" ]; then
  interpreter=$(bash scripts/python.sh "$PYTHON")  # exits (set -e) when none runs
  VENV=.venv$("$interpreter" -c 'import sys; print("%d%d" % sys.version_info[:2])')
fi
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  interpreter=$(bash scripts/python.sh "${PYTHON:-python3}")
  "$interpreter" -m venv "$VENV"
fi
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
