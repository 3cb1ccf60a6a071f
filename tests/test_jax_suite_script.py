"""`scripts/jax_suite.py`, the maintainer tool that runs JAX's own test files against donate.jit:
its rewrite of every spelling of JAX's jit, and its `patch` target (files unmodified, `jax.jit =
donate.jit` set first, JAX's test utilities compiling through donate.jit too), run here on small
sources so that a broken tool cannot report "no difference" for files it never touched.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "jax_suite.py"


@pytest.fixture(scope="module")
def suite():
  spec = importlib.util.spec_from_file_location("jax_suite", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_spelling_of_jax_jit_is_rewritten_and_a_shadowing_name_is_left_alone(suite):
  source = textwrap.dedent("""\
      import jax
      from jax import jit
      from jax._src import api
      from functools import partial

      @jax.jit
      def f(x):
        return x

      g = partial(jax.jit, donate_argnums=0)(f)
      h = jit(f)
      k = api.jit(f)

      def uses_own(jit):
        return jit(f)
  """)
  new, counts, skipped = suite.rewrite(source, "donate.jit")
  lines = new.splitlines()
  assert lines[0] == "import donate; import jax"  # line numbers stay the upstream file's
  assert "@donate.jit" in lines and "g = partial(donate.jit, donate_argnums=0)(f)" in lines
  assert "h = donate.jit(f)" in lines and "k = donate.jit(f)" in lines
  assert "  return jit(f)" in lines and skipped  # the parameter called jit is its own
  assert sum(counts.values()) == 4
  assert suite.rewrite(source, "jax.jit")[0].count("jax.jit") == 4  # the rewrite's self-check


def test_the_patch_target_gives_jax_and_its_test_utilities_donate_jit(suite, tmp_path):
  pytest.importorskip("absl")  # JAX's test utilities import it
  (tmp_path / "conftest.py").write_text(suite.PATCH_CONFTEST)
  check = textwrap.dedent("""\
      import conftest
      import jax, jax.numpy as jnp
      import donate
      from jax._src import api, test_util

      assert jax.jit is donate.jit
      assert test_util.api.jit is donate.jit and api.jit is not donate.jit  # JAX's own keeps its
      assert test_util.api.device_put is api.device_put  # the rest is JAX's module
      built = []
      original = donate._jit.calling._missed  # what every miss of a donate.jit runs

      def counting(self, *args, **kwargs):
        built.append(self)
        return original(self, *args, **kwargs)

      donate._jit.calling._missed = counting

      class Case(test_util.JaxTestCase):
        def runTest(self):
          self._CompileAndCheck(lambda x: x * 2 + 1, lambda: [jnp.arange(4.0)])

      Case().runTest()
      assert built, "_CompileAndCheck did not compile through donate.jit"
      print("ok", len(built))
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True,
                        text=True, timeout=300, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith("ok ")
