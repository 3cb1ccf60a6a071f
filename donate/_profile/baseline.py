"""What the donations saved at the peak: the same program compiled again without them.

A profile knows its own peak only. Whether the donations lowered it is measured: the program is
lowered again from its trace with no donated input (the same jaxpr, shardings, layouts and
compiler options; `_compat.traced_without_donation`), compiled, and its peak read as the
profile's own is (`api.measured`). XLA often reuses buffers without a donation too: an SGD step
peaks as high either way.

A `Baseline` says how to get that program: `lower()` gives its `jax.stages.Lowered` (None: the
program donates nothing, so it is its own baseline), or `lower` is None and `why` says what is
missing (a `jax.stages.Compiled` or `Lowered` alone keeps no trace to lower again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from donate._base import compat as _compat

COMPILED_ALONE = (
  "a jax.stages.Compiled keeps no traced program to compile again without its "
  "donations (profile the function with its arguments)"
)
LOWERED_ALONE = (
  "a jax.stages.Lowered keeps no traced program to compile again without its "
  "donations (profile the function with its arguments)"
)
NO_TRACE = "the function has no trace() to compile it again without its donations"


@dataclasses.dataclass(frozen=True, slots=True)
class Baseline:
  """How to lower a profiled program again without its donations, or why it cannot be."""

  lower: Callable[[], object] | None = None
  why: str = ""


def of_traced(traced) -> Baseline:
  """The baseline of a `jax.stages.Traced` (a `jax.jit` function's `trace(*args)`)."""
  if not isinstance(traced, jax.stages.Traced):
    return Baseline(None, NO_TRACE)

  return Baseline(lambda: _lowered_without_donation(traced))


def _lowered_without_donation(traced):
  """`traced` lowered with no donated input; None when it donates nothing."""
  twin = _compat.traced_without_donation(traced)
  return None if twin is None else twin.lower()
