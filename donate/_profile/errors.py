"""The errors of `donate.memory_profile` (listed in docs/errors.md)."""

from __future__ import annotations

from donate._base.errors import DonationError, message
from donate._xla.gpu_targets import SPECS


def unknown_device(device):
  """`profile.fits(device)` with a device that is neither a known GPU nor a byte count."""
  raise DonationError(
    message(
      "fits needs a device",
      expected="one of " + ", ".join(sorted(SPECS)) + " or a byte count > 0",
      got=repr(device),
    )
  )


def no_buffer_assignment(obj, missing: str):
  """A compiled object whose buffer assignment cannot be read (`missing` says what is not there)."""
  raise DonationError(
    message(
      f"memory_profile reads XLA's buffer assignment of a compiled program, and {missing}",
      got=type(obj).__name__,
      fix="pass the jax.jit or donate.jit function with its arguments "
      "(donate.memory_profile(f, *args)) or its Lowered: they are compiled with XLA's dump of the "
      "buffer assignment (a donate.jit Compiled keeps its Lowered and does the same)",
    )
  )


def not_a_jitted_function(obj):
  """`memory_profile(f)` where `f` cannot be lowered."""
  raise DonationError(
    message(
      "memory_profile needs a compiled step",
      expected="a jax.jit or donate.jit function (with its arguments), a Lowered or a Compiled",
      got=type(obj).__name__,
      fix="wrap the function: donate.memory_profile(jax.jit(f), *args)",
    )
  )


def no_program_for_advice():
  """`profile.advice()` on a profile of a `jax.stages.Compiled` alone."""
  raise DonationError(
    message(
      "advice() compiles the profiled program again with each candidate change, and this "
      "profile has no program to compile (it was read from a jax.stages.Compiled alone)",
      expected="a profile of a jax.jit or donate.jit function with its arguments, or of a Lowered",
      got="a profile of a Compiled",
      fix="donate.memory_profile(f, *args).advice()",
    )
  )


def an_array(obj):
  """`memory_profile(x)` with an array where the function goes."""
  raise DonationError(
    message(
      "memory_profile needs a compiled step first, then its arguments",
      expected="a jax.jit or donate.jit function (with its arguments), a Lowered or a Compiled",
      got=f"an array {obj.dtype}{list(obj.shape)}",
      fix="pass the function, then the arrays: donate.memory_profile(jax.jit(step), x)",
    )
  )
