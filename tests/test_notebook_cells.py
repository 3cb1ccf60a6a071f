"""In a notebook, the words a user reads name source lines by their cell (`In[3]:17`), as IPython
names them in tracebacks, not by the kernel's temporary file (`/tmp/ipykernel_NNN/NNNN.py:17`); the
source lines the library keeps as keys (`LeafDecision.where`, `Loop.line`) stay the file's.

The cells run in a real IPython shell with ipykernel's compiler (the one a Jupyter kernel compiles
cells with), in a child process: a shell changes `__main__`, builtins and warning filters for good.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ipykernel")

REPO = pathlib.Path(__file__).resolve().parent.parent

# Each string is one cell, run in order (execution counts 1, 2, ...); its line 1 is the one after
# the opening quotes.
CELLS = [
  """
import json
import jax, jax.numpy as jnp
from jax import lax
import donate
""",
  """
def step(w, x):
    w = donate.donate_buffer(w)
    return w - x

plan = donate.jit(step).plan(jnp.ones(1024), jnp.ones(1024))
""",
  """
def decode(cache, q):
    def body(carry, t):
        k, q = carry
        prev = k[t - 1]
        k = lax.dynamic_update_slice(k, jnp.tanh(q)[None], (t, 0))
        return (k, jnp.tanh(jax.nn.softmax(k @ q) @ k + prev)), None
    return lax.scan(body, (cache, q), jnp.arange(1, 9))[0]

compiled = donate.jit(decode, donate_argnums=0).lower(jnp.zeros((256, 128)), jnp.ones(128)).compile()
""",
  """
def sgd(w, grad):
    new_w = donate.donate_buffer(w)
    norm = jnp.sum(w * w)
    return new_w - grad / norm

try:
    donate.jit(sgd)(jnp.ones(16), jnp.ones(16))
except donate.DonationError as e:
    error = str(e)
""",
  """
d = plan.decisions[0]
print(json.dumps({
    "where": d.where, "source": d.source, "plan": str(plan), "html": plan._repr_html_(),
    "copies_plan": str(compiled.plan),
    "copies": [{"value": r.value, "reason": r.reason, "lines": r.lines, "fix": r.fix,
                "loop": r.loops[-1].line, "how_often": str(r.loops[-1])}
               for r in compiled.plan.copies],
    "error": error,
}))
""",
]

SHELL = """
import sys
from IPython.core.interactiveshell import InteractiveShell
from ipykernel.compiler import XCachingCompiler
from traitlets.config import Config

config = Config()
config.HistoryManager.enabled = False
shell = InteractiveShell.instance(config=config, compiler_class=XCachingCompiler)
for cell in CELLS:
    result = shell.run_cell(cell.lstrip(), store_history=True)
    if not result.success:
        sys.exit(1)
"""


@pytest.fixture(scope="module")
def said(tmp_path_factory):
  """What the cells' objects say, as the last cell prints it."""
  home = tmp_path_factory.mktemp("ipython")
  env = dict(os.environ, IPYTHONDIR=str(home))
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
  script = f"CELLS = {CELLS!r}\n" + textwrap.dedent(SHELL)
  run = subprocess.run([sys.executable, "-c", script], env=env, cwd=home, capture_output=True,
                       text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


def _cell_file(where: str) -> bool:
  """Whether `where` ("file:line (function)") is in a Jupyter kernel's temporary cell file."""
  return "ipykernel_" in where.rpartition(":")[0]


def test_a_plan_names_the_annotation_by_its_cell_and_keeps_the_file_as_its_key(said):
  assert said["source"] == "donate_buffer at In[2]:2 (step)", said["source"]
  assert _cell_file(said["where"]) and said["where"].endswith(".py:2 (step)"), said["where"]
  assert "[donate_buffer at In[2]:2 (step)]" in said["plan"], said["plan"]
  for text in (said["plan"], said["html"]):
    assert "ipykernel" not in text, text


def test_a_copy_names_its_lines_by_their_cell_and_keeps_the_loop_line_as_its_key(said):
  assert said["copies"], said["copies_plan"]
  for copy in said["copies"]:
    assert copy["value"] == "cache (carry[0] of scan at In[3]:7 (decode))", copy
    assert "read at In[3]:4 (decode.<locals>.body)" in copy["reason"], copy
    assert "updated in place at In[3]:5 (decode.<locals>.body)" in copy["reason"], copy
    assert copy["lines"] == ["In[3]:4 (decode.<locals>.body)", "In[3]:5 (decode.<locals>.body)"]
    assert copy["how_often"] == "scan at In[3]:7 (decode) (8 iterations)", copy
    assert _cell_file(copy["loop"]) and copy["loop"].endswith(".py:7 (decode)"), copy
  assert "ipykernel" not in said["copies_plan"], said["copies_plan"]


def test_a_donation_error_names_both_lines_by_their_cell(said):
  assert (
    "a value given up by donate_buffer at In[4]:2 (sgd) is read again at In[4]:3 (sgd) (by mul)"
    in said["error"]
  ), said["error"]
