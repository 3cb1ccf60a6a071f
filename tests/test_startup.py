"""donate's commands start JAX without the CUDA plugin's start-up lines where no NVIDIA GPU is
(donate/_base/startup.py), and forward everything else written to stderr meanwhile, in order."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from donate import targets
from donate._base import startup

REPO = pathlib.Path(__file__).resolve().parent.parent
STUB = (
  b"I0000 00:00:1765000000.123456   4242 cudart_stub.cc:31] Could not find cuda drivers on your "
  b"machine, GPU will not be used.\n"
)
NO_GPU = not any(os.path.exists(d) for d in startup.NVIDIA_DEVICES)


def test_the_filter_drops_the_stub_lines_and_forwards_the_rest_in_order(capfd):
  with startup.FilteredStderr():
    for data in (startup.ABSL_NOTICE, STUB, b"first\n", STUB, startup.ABSL_NOTICE, b"sec",
                 b"ond\n", STUB.replace(b"cudart_stub", b"cuda_dnn"), b"no newline at the end"):
      os.write(2, data)
  err = capfd.readouterr().err
  # absl's notice goes with the stub line after it; before any other line it stays.
  assert err == (
    "first\n" + startup.ABSL_NOTICE.decode() + "second\n"
    + STUB.replace(b"cudart_stub", b"cuda_dnn").decode() + "no newline at the end"
  ), err
  os.write(2, b"after\n")
  assert capfd.readouterr().err == "after\n"  # file descriptor 2 is the real stderr again


def test_only_python_m_donate_counts_as_a_command(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["-m"])
  for orig, expected in (
    (["python", "-m", "donate.profile", "train.py"], True),
    (["python", "-X", "dev", "-mdonate"], True),
    (["python", "-m", "donated"], False),
    (["python", "-m", "pytest", "-m", "donate"], False),
  ):
    monkeypatch.setattr(sys, "orig_argv", orig)
    assert startup.started_as_command() == expected, orig
  monkeypatch.setattr(sys, "argv", ["train.py"])
  monkeypatch.setattr(sys, "orig_argv", ["python", "train.py"])
  assert not startup.started_as_command()


def _env():
  """This environment without what the test session sets for JAX: a user's shell."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", startup.SKIP_CHECK)}
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
  return env


def _run(*args, cwd):
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(),
                        cwd=cwd, timeout=600)


# What JAX prints about CUDA at start-up on a machine without a GPU, when nothing filters it.
CUDA_START_UP = ("cudart_stub", "could not find cuda drivers", "absl::initializelog",
                 "plugin configuration error", "unable to load cuda")


@pytest.mark.slow
@pytest.mark.skipif(not NO_GPU, reason="an NVIDIA GPU is visible: JAX's CUDA lines are real")
def test_the_profile_command_says_nothing_about_cuda_and_gpu_targets_compile(tmp_path):
  helped = _run("-m", "donate.profile", "--help", cwd=tmp_path)
  assert helped.returncode == 0 and "usage" in helped.stdout
  assert "cuda" not in helped.stderr.lower(), helped.stderr
  script = tmp_path / "train.py"
  script.write_text(textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from donate import targets
    print("sum", float(jax.jit(lambda x: (x * 2).sum())(jnp.ones(8))))
    if targets.available():  # the plugin registered without jax_platforms: H100 programs compile
      x = jax.ShapeDtypeStruct((256, 256), jnp.float32,
                               sharding=NamedSharding(targets.gpu_mesh("h100", 1), PartitionSpec()))
      compiled = jax.jit(lambda a: jnp.tanh(a @ a)).lower(x).compile()
      print("h100:", compiled.input_shardings[0][0].mesh.devices.flat[0].device_kind)
  """))
  ran = _run("-m", "donate.profile", "--out", str(tmp_path / "out"), str(script), cwd=tmp_path)
  assert ran.returncode == 0, ran.stderr
  assert "sum 16.0" in ran.stdout
  if targets.available():
    assert "h100: NVIDIA H100" in ran.stdout, ran.stdout
  said = ran.stderr.lower()
  assert not [line for line in CUDA_START_UP if line in said], ran.stderr
