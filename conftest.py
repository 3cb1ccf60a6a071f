"""Test setup, before JAX initialises its backends: eight virtual CPU devices, and CPU as the only
runtime platform (the CUDA plugin, installed by the test extra for ahead-of-time GPU compiles, then
skips its search for CUDA libraries; compile-only H100/B200 targets still work), and JAX imported
without the plugin's start-up lines where no NVIDIA GPU is. Before donate is
imported: every signature `donate._jit.quick` routes is checked against the full planner's
(`DONATE_CHECK_QUICK`; the test processes a test starts inherit it)."""

import importlib.util
import os
import pathlib

os.environ.setdefault("DONATE_CHECK_QUICK", "1")


def _import_jax():
  """Imports JAX as donate's commands do (donate/_base/startup.py): on a machine without an NVIDIA
  GPU, without the CUDA plugin's start-up lines. The module is loaded by its path because importing
  it through the package would import donate, and with it JAX, first."""
  path = pathlib.Path(importlib.util.find_spec("donate").origin).parent / "_base" / "startup.py"
  spec = importlib.util.spec_from_file_location("_donate_startup", path)
  startup = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(startup)
  startup.import_jax()


_import_jax()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_platforms", "cpu")


def pytest_configure(config):
  """The `slow` marker: notebooks, subprocesses, the documentation site, property tests and
  compiles for many targets. `pytest -m "not slow"` runs the rest, the unit tests, in about a
  minute; the README's test command runs everything."""
  config.addinivalue_line("markers", "slow: a test that runs long (excluded by -m 'not slow')")
