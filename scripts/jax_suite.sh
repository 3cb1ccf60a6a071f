#!/usr/bin/env bash
# Maintainer tool, never run in CI: runs JAX's own jit tests against donate.jit.
# Takes JAX's test files that exercise jax.jit (api, pjit, export, mutable_array, layout, shard_map,
# memories, array, debugging_primitives, aot, compilation_cache, cache_key, multi_device,
# jaxpr_effects, x64_context, checkify; api and pjit unless files are named) of a jax-ml/jax
# checkout at the installed jax's tag (jax-vX.Y.Z), rewrites every jax.jit in them to donate.jit
# (scripts/jax_suite.py) into a temporary folder, and runs them with pytest under JAX's own pytest
# settings (warnings are errors).
#
# Usage: bash scripts/jax_suite.sh JAX_CHECKOUT [--plain | --self-check | --patch | --compare] [--keep]
#          [pytest args]
#   JAX_CHECKOUT  a clone or a bare git dir of jax-ml/jax that has the tag
#   --plain       run the files unmodified (the baseline)
#   --self-check  rewrite to jax.jit instead of donate.jit (checks the rewrite itself)
#   --patch       run the files unmodified with `jax.jit = donate.jit` set first (and JAX's test
#                 utilities' jit: lax_test.py and lax_numpy_test.py compile through them); any test
#                 file of the checkout can be named, not only those above
#   --compare     run plain, self-check and rewritten, and list what passes unmodified but fails
#                 with donate.jit
#   --keep        keep the temporary folder and print its path
# pytest runs in that folder, so test ids are `api_test.py::JitTest`, `pjit_test.py::PJitTest`
# (with none among the pytest args both files run) and other paths must be absolute. Example:
#   bash scripts/jax_suite.sh ~/src/jax --compare -k "donat or Donat"
# Makes .venv-jaxsuite once (PYTHON picks the interpreter, VENV the folder) with donate installed
# editable plus what JAX's tests need (absl-py, pytest<9 as JAX pins it, pytest-xdist: `-n 2` runs
# the tests in two processes, as JAX's CI runs them with `-n auto`). JAX_NUM_CPU_DEVICES
# defaults to 8 (pjit_test.py asks for 8 CPU devices). JAX_REF takes the files at another ref of
# the checkout (a commit, a branch) when it has no tag for the installed jax: with --compare (or
# --plain beside --patch) only what passes unmodified counts, so files newer or older than the
# installed jax still judge donate.
set -euo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,30p' "$0" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHECKOUT=$(cd "$1" && pwd)
shift
MODE=donate.jit
KEEP=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --plain) MODE=none ;;
    --self-check) MODE=jax.jit ;;
    --patch) MODE=patch ;;
    --compare) MODE=compare ;;
    --keep) KEEP=1 ;;
    *) ARGS+=("$a") ;;
  esac
done

PY=$(bash "$ROOT/scripts/python.sh" "${PYTHON:-python3}")  # a shim that does not run: pyenv's
VENV=${VENV:-$ROOT/.venv-jaxsuite}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import absl, donate, pytest, xdist" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e "$ROOT" absl-py "pytest>=8,<9" pytest-xdist
fi
TAG=${JAX_REF:-"jax-v$("$VENV/bin/python" -c 'import jax; print(jax.__version__)')"}
suite() { "$VENV/bin/python" "$ROOT/scripts/jax_suite.py" "$@"; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/jax_suite.XXXXXX")
if [ "$KEEP" = 1 ]; then
  echo "rewritten files in $TMP" >&2
else
  trap 'rm -rf "$TMP"' EXIT
fi
FILES=()  # the named files, written as they are named (the patch mode takes any test file)
for a in ${ARGS[@]+"${ARGS[@]}"}; do
  if [[ "$a" == *.py* ]] && [[ "${a%%::*}" =~ ^[a-z0-9_]+_test\.py$ ]]; then
    FILES+=("tests/${a%%::*}")
  fi
done
if [ ${#FILES[@]} = 0 ]; then
  ARGS+=(api_test.py pjit_test.py)
fi
export JAX_NUM_CPU_DEVICES=${JAX_NUM_CPU_DEVICES:-8}

run() {  # TARGET DIR [pytest args]: writes the files rewritten to TARGET into DIR, runs pytest there
  local target=$1 dir=$2
  shift 2
  suite write "$CHECKOUT" "$TAG" "$dir" --target "$target" ${FILES[@]+--files "${FILES[@]}"}
  echo "jax $TAG, jit rewritten to: $target" >&2
  cd "$dir"
  "$VENV/bin/python" -m pytest -c pytest.ini --rootdir . -p no:cacheprovider "$@"
}

if [ "$MODE" != compare ]; then
  run "$MODE" "$TMP" "${ARGS[@]}"
  exit
fi
for target in none jax.jit donate.jit; do
  (run "$target" "$TMP/$target" -q --tb=no "${ARGS[@]}" --junitxml="$TMP/$target.xml") ||
    [ -s "$TMP/$target.xml" ]
done
suite compare "$TMP/none.xml" "$TMP/jax.jit.xml" "$TMP/donate.jit.xml"
