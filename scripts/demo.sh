#!/usr/bin/env bash
# The main job: makes .venv (if missing), installs the package, runs the demo on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
"$VENV/bin/python" -m pip install -q -e .
exec "$VENV/bin/python" -m donate "$@"
