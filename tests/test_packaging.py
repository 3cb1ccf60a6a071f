"""The distribution: its name and metadata, install hints that name it, what the wheel holds, and
the scripts' interpreter lookup.

`scripts/wheel.sh` runs the tests against the installed wheel from outside the source tree with
DONATE_TEST_WHEEL=1; then the package must come from the wheel and hold every module of the
checkout.
"""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

import pytest

import donate

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = pathlib.Path(donate.__file__).resolve().parent
FROM_WHEEL = os.environ.get("DONATE_TEST_WHEEL") == "1"
# An install of the package under its import name: "donate" on the package index is another
# project, so every hint must say jax-donate.
WRONG_INSTALL = re.compile(r"""pip install (-e )?["']?donate\b|(?<![\w.-])donate\[""")


def test_the_distribution_is_jax_donate_and_the_import_name_donate():
  meta = importlib.metadata.metadata("jax-donate")
  assert meta["Name"] == "jax-donate" and meta["Version"] == donate.__version__
  assert "jax-donate" in importlib.metadata.packages_distributions()["donate"]
  classifiers = meta.get_all("Classifier")
  assert {"Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.12"} <= (
      set(classifiers))
  assert meta["License-Expression"] == "Apache-2.0" and meta["Keywords"]
  assert {"gpu-aot", "test"} <= set(meta.get_all("Provides-Extra"))


def test_install_hints_name_the_distribution():
  files = [*PACKAGE.rglob("*.py"), *(REPO / "notebooks").glob("*.py"),
           *(REPO / "scripts").glob("*"), *(REPO / "benchmarks").rglob("*.py")]
  wrong = [f"{path}:{n}: {line.strip()}" for path in files if path.is_file()
           for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
           if WRONG_INSTALL.search(line)]
  assert not wrong, "\n".join(wrong)
  assert WRONG_INSTALL.search('pip install "donate[gpu-aot]"')
  assert not WRONG_INSTALL.search('pip install "jax-donate[gpu-aot]"')


@pytest.mark.skipif(not FROM_WHEEL, reason="only when scripts/wheel.sh tests the installed wheel")
def test_the_tests_import_the_installed_wheel_with_every_module_of_the_checkout():
  assert PACKAGE != REPO / "donate", f"donate imported from the checkout: {PACKAGE}"
  (wheel,) = importlib.metadata.distributions(name="jax-donate", path=[str(PACKAGE.parent)])
  installed = {str(f) for f in wheel.files}
  modules = {p.relative_to(REPO).as_posix() for p in (REPO / "donate").rglob("*.py")}
  assert modules and not modules - installed, sorted(modules - installed)
  assert not any(f.startswith("tests/") for f in installed)


def test_python_m_donate_runs_from_any_folder(tmp_path):
  out = subprocess.run([sys.executable, "-m", "donate", "--elements", "1024", "--steps", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, check=True)
  assert "DonationPlan for swapped_update" in out.stdout and "Why jax.jit copies:" in out.stdout


def _python_sh(tmp_path, name, path):
  env = dict(os.environ, PATH=f"{path}{os.pathsep}{os.environ['PATH']}",
             PYENV_ROOT=str(tmp_path / "pyenv"))
  return subprocess.run(["bash", str(REPO / "scripts" / "python.sh"), name], env=env,
                        capture_output=True, text=True, timeout=60)


def _fake(path: pathlib.Path, body: str) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f"#!/bin/sh\n{body}\n")
  path.chmod(0o755)
  return path


@pytest.mark.skipif(not (REPO / "scripts" / "python.sh").exists(), reason="needs the checkout")
def test_scripts_find_python_3_12_behind_a_shim_that_does_not_run(tmp_path):
  shims = tmp_path / "shims"
  _fake(shims / "python3.12", 'echo "pyenv: python3.12: command not found" >&2; exit 127')
  real = _fake(tmp_path / "pyenv" / "versions" / "3.12.9" / "bin" / "python3.12", "exit 0")
  found = _python_sh(tmp_path, "python3.12", shims)
  assert found.returncode == 0 and found.stdout.strip() == str(real), found.stderr
  _fake(shims / "python3.12", "exit 0")  # a shim that runs is used as it is
  assert _python_sh(tmp_path, "python3.12", shims).stdout.strip() == str(shims / "python3.12")
  real.unlink()
  _fake(shims / "python3.12", "exit 127")
  missing = _python_sh(tmp_path, "python3.12", shims)
  assert missing.returncode == 1 and "no working python3.12" in missing.stderr


@pytest.mark.skipif(not (REPO / ".ci" / "run").exists(), reason="needs the checkout")
def test_venv_script_makes_the_environment_with_the_interpreter_found_so(tmp_path):
  shims = tmp_path / "shims"
  _fake(shims / "python3.12", "exit 127")
  log = tmp_path / "calls"
  _fake(tmp_path / "pyenv" / "versions" / "3.12.9" / "bin" / "python3.12", f'echo "$@" >> {log}')
  env = dict(os.environ, PATH=f"{shims}{os.pathsep}{os.environ['PATH']}",
             PYENV_ROOT=str(tmp_path / "pyenv"), PYTHON="python3.12", VENV=str(tmp_path / "v"))
  subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/venv.sh"], cwd=REPO, env=env,
                 check=True, timeout=60)
  assert log.read_text().splitlines()[-1] == f"-m venv {tmp_path / 'v'}"
  _fake(tmp_path / "pyenv" / "versions" / "3.12.9" / "bin" / "python3.12", 'echo 312')
  env.pop("VENV")  # then named after the version, never the .venv of another one
  named = subprocess.run(["bash", "-c", 'set -euo pipefail; source scripts/venv.sh; echo "$VENV"'],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
  assert named.stdout.splitlines()[-1] == ".venv312", named.stderr
  assert "bash scripts/python.sh python3.12" in (REPO / ".ci" / "run").read_text()  # CI: same
