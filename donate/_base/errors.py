"""The library's one exception family and its warning classes.

Every message has one shape: what went wrong, which leaf (by pytree path), what was expected and
what was received, and how to fix it.

`DonationError` is the family and a `ValueError` (what `jax.jit` raises for most misuse, and what
every donate-only misuse raises). Where `jax.jit` raises another built-in type for the same
mistake, the raise site uses the member that is also that type, so code written against `jax.jit`
keeps catching it: `DonationTypeError`, and `DonationRuntimeError` (the same buffer donated twice in
one call: `jax.jit` reports it from the runtime as a `RuntimeError`).
"""

from __future__ import annotations

import jax

from donate._base.text import notebook_cells

JAX_UNUSABLE_PREFIX = "Some donated buffers were not usable:"
"""How `jax.jit`'s own warning starts; donate's starts the same way, so filters keep working."""


class DonationError(ValueError):
  """Raised for misuse of donation, aliasing or symmetric-memory annotations.

  Raised before anything is executed, so every input is still alive when it is seen. Each
  instance is also the built-in exception type `jax.jit` raises for the same mistake.

  >>> import donate
  >>> from donate._base import errors as _errors
  >>> issubclass(donate.DonationError, ValueError)
  True
  >>> issubclass(_errors.DonationRuntimeError, (donate.DonationError, RuntimeError))
  True
  """


class DonationTypeError(DonationError, TypeError):
  """A `DonationError` that is a `TypeError`."""


class DonationRuntimeError(DonationError, jax.errors.JaxRuntimeError):
  """A `DonationError` that is also `jax.errors.JaxRuntimeError` (a `RuntimeError`): what
  `jax.jit` raises when one buffer is donated and passed again in the same call (its cached calls
  raise a `ValueError` for it, which this is too)."""

  def __init__(self, message: str):
    super().__init__(message)
    self._error_message = message  # JaxRuntimeError's own str() reads it


class UnusableDonationWarning(UserWarning):
  """Warned (outside strict mode) when a requested donation cannot be used.

  The text starts with `jax.jit`'s own sentence, "Some donated buffers were not usable:", so
  existing `warnings.filterwarnings(..., message="Some donated buffers were not usable")` filters
  keep working; it then names each leaf by its pytree path with its shape, dtype, sharding and
  memory kind, the nearest output and the field that differs.

  >>> import donate
  >>> issubclass(donate.UnusableDonationWarning, UserWarning)
  True
  """


class SymmetricMemoryWarning(UserWarning):
  """Warned (outside strict mode) when an annotated value did not land in collective memory.

  ``donate.jit`` warns it after compiling for a GPU target, one warning per such value, naming the
  collective and the reason (``PlacementReport.check``); the over-allocation and unused-mark notes
  of ``donate._symm.trace.comm_buffer_report`` use it too when asked to warn.

  >>> import donate
  >>> issubclass(donate.SymmetricMemoryWarning, UserWarning)
  True
  """


def message(
  what: str,
  *,
  path: str | None = None,
  expected: str | None = None,
  got: str | None = None,
  fix: str | None = None,
) -> str:
  """Builds a message in the library's one shape (in a notebook, source lines name their cell:
  `In[3]:17`).

  >>> message("cannot donate", path="params['w']", expected="an array", got="int",
  ...         fix="pass an array")
  "donate: cannot donate at params['w']: expected an array, got int. Fix: pass an array."
  """
  text = f"donate: {what}"
  if path is not None:
    text += f" at {path}"
  if expected is not None and got is not None:
    text += f": expected {expected}, got {got}"
  elif expected is not None:
    text += f": expected {expected}"
  elif got is not None:
    text += f": got {got}"
  text += "."
  if fix:
    text += f" Fix: {fix}."
  return notebook_cells(text)
