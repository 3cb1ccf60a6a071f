#!/usr/bin/env bash
# The main job: makes .venv (if missing), installs the package, runs the demo on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q -e .
# CPU is the demo's platform; with the gpu-aot/test extra installed, the CUDA plugin then does not
# look for CUDA libraries (which would print a plugin error on machines without them).
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
exec .venv/bin/python -m donate "$@"
