"""A framework's own tests through the global patch: chex's `fake_test` and `asserts_test`, as its
installed wheel ships them, run plainly and with `jax.jit = donate.jit` set before chex is imported
(the plugin `scripts/framework_suite.sh` loads, `PATCH_CONFTEST` of `scripts/jax_suite.py`). They
are the files where chex looks *at* a jitted function: `fake_pmap` reads its signature and
`assert_max_traces` / `is_traceable` recognise its type. Every test that passes plainly passes
patched. The other frameworks' suites (haiku, numpyro, jaxopt, optax, flax, equinox) run with the
script; their counts are in docs/jax_tests.md.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

pytest.importorskip("chex")

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "jax_suite.py"
MODULES = ("chex._src.fake_test", "chex._src.asserts_test")
PATCH_IS_ON = """\
import jax

import donate


def test_the_patch_is_on():
  assert jax.jit is donate.jit
"""


def suite_script():
  spec = importlib.util.spec_from_file_location("jax_suite", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_chex(folder: pathlib.Path, patched: bool) -> pathlib.Path:
  """Runs chex's two files in a child process; returns its JUnit XML."""
  xml = folder / f"{'patched' if patched else 'plain'}.xml"
  extra = ["-p", "donate_patch", str(folder / "patch_on_test.py")] if patched else []
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(folder))
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      *extra,
      "--pyargs",
      *MODULES,
      "-q",
      "-p",
      "no:cacheprovider",
      "--tb=line",
      f"--junitxml={xml}",
    ],
    cwd=folder,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert xml.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
  return xml


def test_chex_tests_that_pass_plainly_pass_through_the_global_patch(tmp_path):
  suite = suite_script()  # its `outcomes`: test id -> (outcome, first line of the failure)
  (tmp_path / "donate_patch.py").write_text(suite.PATCH_CONFTEST)
  (tmp_path / "patch_on_test.py").write_text(PATCH_IS_ON)
  plain = suite.outcomes(run_chex(tmp_path, patched=False))
  patched = suite.outcomes(run_chex(tmp_path, patched=True))
  passed = {test for test, (outcome, _) in plain.items() if outcome == "pass"}
  assert len(passed) > 300  # both files ran (392 tests at chex 0.1.92)
  (on,) = [test for test in patched if test.endswith("::test_the_patch_is_on")]
  assert patched.pop(on) == ("pass", "")
  assert patched.keys() == plain.keys()
  broken = {test: patched[test] for test in passed if patched[test][0] != "pass"}
  assert not broken, f"pass plainly, fail with jax.jit = donate.jit: {broken}"
