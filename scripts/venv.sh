# Sourced by demo.sh, test.sh and notebooks.sh (from the repository root): makes the environment
# folder VENV (default .venv) with the interpreter PYTHON (default python3) if it is missing.
# CPU is the only runtime here: with the CUDA plugin installed (test and gpu-aot extras, for
# compile-only H100/B200 targets), JAX_PLATFORMS=cpu keeps it from searching for CUDA libraries in
# every process (tests, notebook kernels, subprocesses), which would print plugin errors.
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
