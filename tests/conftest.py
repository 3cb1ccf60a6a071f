"""Shared fixtures."""

import pytest

import donate

# The two-process and patched workers are scripts a test runs (`python _x_worker.py ...`), with no
# doctests: collecting them would import every framework they patch for nothing.
collect_ignore_glob = ["_*_worker.py"]


@pytest.fixture
def no_symmetric_requirements():
  """No `donate.requires_symmetric` registration before or after the test (the registry is
  process-wide)."""
  donate.symm.clear_requirements()
  yield
  donate.symm.clear_requirements()
