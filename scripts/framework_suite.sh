#!/usr/bin/env bash
# Maintainer tool, never run in CI: runs a framework's own tests, as its wheel ships them, plain
# and with `jax.jit = donate.jit` set before any of its modules is imported (the global patch, as
# users set it for a framework they did not write), and lists the tests that pass plain but fail
# patched (scripts/jax_suite.py compare).
#
# Usage: bash scripts/framework_suite.sh PACKAGE [pytest args]
#   PACKAGE   the package to install; its tests are those its wheel ships (`--pyargs PACKAGE`:
#             optax: 51 test files; chex: its chex/_src/*_test.py), or its repository's (REPO)
#   EXTRA     pip requirements its tests need besides it (default for optax: chex; for chex:
#             cloudpickle, which dataclass_test.py imports)
#   REPO      a clone or bare git dir of the package's repository: its `tests` folder at the tag of
#             the installed version (`v` and the version, else the version alone; TAG overrides
#             it) runs instead of the wheel's (flax, equinox and numpyro ship none)
#   TESTS     what runs instead of all: the wheel's test modules (pytest `--pyargs` names), or
#             paths in the repository, whose top folders are taken whole (numpyro's is `test`)
# Uses the suite's environment (VENV, default .venv-jaxsuite, as scripts/jax_suite.sh makes it),
# installing PACKAGE and EXTRA there (a version installed before is kept). Examples (about 5
# minutes a run on two cores; docs/jax_tests.md has the others and their counts):
#   bash scripts/framework_suite.sh optax -n 2
#   bash scripts/framework_suite.sh chex -n 2
#   REPO=~/src/equinox bash scripts/framework_suite.sh equinox -n 2
#   REPO=~/src/numpyro TESTS="test/test_util.py test/test_handlers.py" \
#     bash scripts/framework_suite.sh numpyro
set -euo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,24p' "$0" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PACKAGE=$1
shift
PY=$(bash "$ROOT/scripts/python.sh" "${PYTHON:-python3}")
VENV=${VENV:-$ROOT/.venv-jaxsuite}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
EXTRA=${EXTRA-$(case $PACKAGE in optax) echo chex ;; chex) echo cloudpickle ;; esac)}
"$VENV/bin/python" -m pip install -q -e "$ROOT" absl-py "pytest>=8,<9" pytest-xdist "$PACKAGE" $EXTRA

TMP=$(mktemp -d "${TMPDIR:-/tmp}/framework_suite.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# The plugin is jax_suite.py's patch conftest (`PATCH_CONFTEST`), loaded for the patched run only.
"$VENV/bin/python" -c 'import runpy, sys; sys.stdout.write(runpy.run_path(sys.argv[1])["PATCH_CONFTEST"])' \
  "$ROOT/scripts/jax_suite.py" > "$TMP/donate_patch.py"
if [ -n "${REPO:-}" ]; then
  VERSION=$("$VENV/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$PACKAGE")
  has_tag() { git -C "$REPO" rev-parse -q --verify "$1^{commit}" >/dev/null; }
  if [ -z "${TAG:-}" ]; then
    TAG=v$VERSION
    has_tag "$TAG" || ! has_tag "$VERSION" || TAG=$VERSION  # numpyro's tags have no `v`
  fi
  if ! has_tag "$TAG"; then
    echo "framework_suite.sh: $REPO has no tag $TAG (TAG, by default v and the installed" \
      "$PACKAGE's version, or that version alone); install the version of a tag it has into" \
      "$VENV first (pip install '$PACKAGE==X.Y.Z'), or set TAG to one" >&2
    exit 2
  fi
  read -ra TARGET <<< "${TESTS:-tests}"
  git -C "$REPO" archive "$TAG" $(printf '%s\n' "${TARGET[@]%%/*}" | sort -u) | tar -x -C "$TMP"
else
  read -ra TARGET <<< "${TESTS:-$PACKAGE}"
  TARGET=(--pyargs "${TARGET[@]}")
fi
cd "$TMP"
for patched in 0 1; do
  echo "--- $PACKAGE's tests, $([ $patched = 1 ] && echo "jax.jit = donate.jit" || echo plain)" >&2
  JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} PYTHONPATH="$TMP" "$VENV/bin/python" -m pytest \
    $([ $patched = 1 ] && echo "-p donate_patch") "${TARGET[@]}" -p no:cacheprovider -q \
    --tb=line -rf --continue-on-collection-errors --junitxml="$TMP/$patched.xml" "$@" ||
    [ -s "$TMP/$patched.xml" ]
done
"$VENV/bin/python" "$ROOT/scripts/jax_suite.py" compare "$TMP/0.xml" "$TMP/0.xml" "$TMP/1.xml"
