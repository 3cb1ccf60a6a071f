"""Test setup, before JAX initialises its backends: eight virtual CPU devices, and CPU as the only
runtime platform (the CUDA plugin, installed by the test extra for ahead-of-time GPU compiles, then
skips its search for CUDA libraries; compile-only H100/B200 targets still work). Before donate is
imported: every signature `donate._jit.quick` routes is checked against the full planner's
(`DONATE_CHECK_QUICK`; the test processes a test starts inherit it)."""

import os

os.environ.setdefault("DONATE_CHECK_QUICK", "1")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_platforms", "cpu")


def pytest_configure(config):
  """The `slow` marker: notebooks, subprocesses, the documentation site, property tests and
  compiles for many targets. `pytest -m "not slow"` runs the rest, the unit tests, in about a
  minute; the README's test command runs everything."""
  config.addinivalue_line("markers", "slow: a test that runs long (excluded by -m 'not slow')")
