"""Shared fixtures."""

import pytest

import donate


@pytest.fixture
def no_symmetric_requirements():
  """No `donate.requires_symmetric` registration before or after the test (the registry is
  process-wide)."""
  donate.symm.clear_requirements()
  yield
  donate.symm.clear_requirements()
