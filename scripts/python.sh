#!/usr/bin/env bash
# Prints the path of a Python interpreter that runs: NAME itself (a command or a path, default
# python3) when it does, else, for NAME = python3.N, pyenv's installed 3.N
# ($PYENV_ROOT/versions/3.N*/bin/python3.N). A bare python3.12 on PATH may be a version manager's
# shim that is there but not set up to run ("pyenv: python3.12: command not found"); the scripts
# and CI find the interpreter through here. Exits 1, saying so, when nothing runs.
# Usage: bash scripts/python.sh [NAME]
set -euo pipefail
name=${1:-python3}
candidates=("$name")
if [[ "$(basename "$name")" =~ ^python(3\.[0-9]+)$ ]]; then
  version=${BASH_REMATCH[1]}
  candidates+=("${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/"python$version")
fi
for candidate in "${candidates[@]}"; do
  if "$candidate" -c "" >/dev/null 2>&1; then
    command -v "$candidate"
    exit 0
  fi
done
echo "scripts/python.sh: no working $name (tried: ${candidates[*]})" >&2
exit 1
