#!/usr/bin/env bash
# The distribution as users get it (`pip install jax-donate`), built and tested from the outside.
#
#   bash scripts/wheel.sh build          the sdist and the wheel into dist/ (`python -m build`: the
#                                        wheel is built from the sdist), checked by `twine check`
#   bash scripts/wheel.sh test [ARGS]    dist/'s wheel with the test extra in a fresh VENV-wheel;
#                                        every test and doctest (pytest ARGS) against it
#   bash scripts/wheel.sh smoke          dist/'s wheel with its own dependencies and the plot
#                                        extra (matplotlib, for the plots' doctests) only, and
#                                        pytest, in a fresh VENV-wheel: `python -m donate`, every
#                                        doctest and the core tests, so the declared dependencies
#                                        are shown to be enough
#
# Tests run from a temporary folder with pytest's `--import-mode=importlib` (the tests folder alone
# on sys.path, for the tests' shared helpers), so `donate` comes from the installed wheel, not from
# the checkout (tests/test_packaging.py checks it: DONATE_TEST_WHEEL=1); the doctests are collected
# from the installed package (`--pyargs donate`).
# PYTHON and VENV as in scripts/test.sh (VENV holds `build` and `twine`, the `dist` dependency
# group of pyproject.toml). `INSTALL=wheel bash scripts/test.sh [ARGS]` = build, then test.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ROOT=$PWD
case $VENV in /*) WHEEL_VENV=$VENV-wheel ;; *) WHEEL_VENV=$ROOT/$VENV-wheel ;; esac
CORE_TESTS=(tests/test_packaging.py tests/test_demo.py tests/test_transforms.py
            tests/test_planner.py)

fresh_venv() {  # $1: what to install besides the wheel
  local interpreter
  interpreter=$(bash scripts/python.sh "${PYTHON:-python3}")
  rm -rf "$WHEEL_VENV"
  "$interpreter" -m venv "$WHEEL_VENV"
  "$WHEEL_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  local wheels=(dist/*.whl)
  "$WHEEL_VENV/bin/python" -m pip install -q "${wheels[0]}$1" "${@:2}"
}

run_pytest() {  # from outside the source tree, against the installed package
  local work status=0
  work=$(mktemp -d "${TMPDIR:-/tmp}/donate-wheel.XXXXXX")
  (cd "$work" && DONATE_TEST_WHEEL=1 "$WHEEL_VENV/bin/python" -m pytest -c "$ROOT/pyproject.toml" \
     --rootdir "$ROOT" --import-mode=importlib -o pythonpath=tests "$@") || status=$?
  rm -rf "$work"
  return "$status"
}

case "${1:-}" in
  build)
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q --group dist
    rm -rf dist
    "$VENV/bin/python" -m build -q -o dist .
    "$VENV/bin/python" -m twine check --strict dist/*
    ;;
  test)
    fresh_venv "[test]"
    "$WHEEL_VENV/bin/python" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
    run_pytest "$ROOT/tests" --pyargs donate "${@:2}"
    ;;
  smoke)
    fresh_venv "[plot]" "pytest>=8" "hypothesis>=6"
    (cd "${TMPDIR:-/tmp}" && "$WHEEL_VENV/bin/python" -m donate --elements 65536 --steps 2)
    run_pytest -q "${CORE_TESTS[@]/#/$ROOT/}" --pyargs donate
    ;;
  *)
    echo "usage: bash scripts/wheel.sh build | test [pytest args] | smoke" >&2
    exit 2
    ;;
esac
