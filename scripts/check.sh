#!/usr/bin/env bash
# The structural checks, in seconds: only donate's compatibility module imports jax._src, no import
# cycle among donate's modules, no module/class/function over its size limit (but the known ones),
# every committed notebook matches its source (tests/test_structure.py, which the full test command
# runs too). Usage: bash scripts/check.sh [pytest args]   (environment as scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/test.sh -q -p no:randomly tests/test_structure.py "$@"
