"""The keywords of one `donate.jit` function, validated once and shared by everything it makes."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from donate._base import compat as _compat
from donate._base import errors as _errors


@dataclasses.dataclass(frozen=True, eq=False)
class Options:
  """`donate.jit`'s own keywords and the `jax.jit` keywords it passes through.

  Attributes:
    donate_argnums, donate_argnames: as the user gave them (jax.jit resolves them).
    strict: as the user gave it; `strict_unusable` and `strict_copies` are what it means.
    adopt_inner: donate what a plain inner `jax.jit(donate_argnums=...)` donates.
    copy_threshold: the smallest copy the plan and `Compiled.copies()` report, in bytes.
    symmetric_placement: compile GPU targets with collective-memory placement for marked values.
    jit_kwargs: every other `jax.jit` keyword.
    patched: made while `jax.jit` is `donate.jit` (the global patch): called inside another
      trace, it runs as the `jax.jit` it may stand for (a framework's), its donation ignored
      there as `jax.jit` ignores it, rather than as an inner `donate.jit`, which is honoured.

  >>> Options(strict="copies").strict_copies, Options().keep_unused
  (True, False)
  """

  donate_argnums: Any = None
  donate_argnames: Any = None
  strict: Any = False
  adopt_inner: bool = False
  copy_threshold: int = 65536
  symmetric_placement: bool = True
  jit_kwargs: dict = dataclasses.field(default_factory=dict)
  patched: bool = False
  strict_unusable: bool = dataclasses.field(init=False)
  strict_copies: bool = dataclasses.field(init=False)

  def __post_init__(self):
    unusable, copies = _strict_modes(self.strict)
    object.__setattr__(self, "strict_unusable", unusable)
    object.__setattr__(self, "strict_copies", copies)
    object.__setattr__(self, "adopt_inner", bool(self.adopt_inner))
    object.__setattr__(self, "copy_threshold", int(self.copy_threshold))
    object.__setattr__(self, "symmetric_placement", bool(self.symmetric_placement))
    object.__setattr__(self, "jit_kwargs", dict(self.jit_kwargs or {}))

  @property
  def keep_unused(self) -> bool:
    return bool(self.jit_kwargs.get("keep_unused", False))

  def keywords(self) -> dict:
    """The keywords of `donate.jit` that make this function again (for pickling)."""
    return dict(
      self.jit_kwargs,
      donate_argnums=self.donate_argnums,
      donate_argnames=self.donate_argnames,
      strict=self.strict,
      adopt_inner_donation=self.adopt_inner,
      copy_threshold=self.copy_threshold,
      symmetric_placement=self.symmetric_placement,
    )

  def with_leading_argument(self) -> Options:
    """The options of `(extra, *args) -> fun(*args)`: every argument number moves up by one.

    >>> o = Options(donate_argnums=(0, -1), jit_kwargs={"static_argnums": 1})
    >>> o.with_leading_argument().donate_argnums, o.with_leading_argument().jit_kwargs
    ((1, -1), {'static_argnums': (2,)})
    """
    kwargs = dict(self.jit_kwargs)
    if kwargs.get("static_argnums") is not None:
      kwargs["static_argnums"] = _shift(kwargs["static_argnums"])
    in_sh = kwargs.get("in_shardings")
    if in_sh is not None:
      kwargs["in_shardings"] = (None, *in_sh) if isinstance(in_sh, (tuple, list)) else in_sh
    return dataclasses.replace(self, donate_argnums=_shift(self.donate_argnums), jit_kwargs=kwargs)


def _shift(nums):
  if nums is None:
    return None
  nums = (nums,) if isinstance(nums, int) else tuple(nums)
  return tuple(n + 1 if n >= 0 else n for n in nums)


def _strict_modes(strict) -> tuple[bool, bool]:
  """`strict` as (unusable donations raise, copies of donated buffers raise)."""
  modes = {strict} if isinstance(strict, (bool, str)) else set(strict)
  unknown = modes - {True, False, "unusable", "copies"}
  if unknown:
    raise _errors.DonationError(
      _errors.message(
        "donate.jit: unknown strict mode",
        expected="True, False, \"unusable\", \"copies\" or a tuple of the last two",
        got=repr(strict),
        fix="pass strict=True or strict=\"copies\"",
      )
    )
  return bool(modes & {True, "unusable"}), "copies" in modes


def keyword_error(name: str, fun, error: Exception, jit_kwargs: dict) -> Exception:
  """`jax.jit`'s error for a bad argument number or name, as a DonationError of the same type
  naming the function and its parameters; any other keyword error (a keyword `jax.jit` does not
  have, a bad value of another keyword) is `jax.jit`'s own, unchanged: a `jax.jit` of the
  function without the argument numbers and names raises it too."""
  others = {k: v for k, v in jit_kwargs.items() if k not in ("static_argnums", "static_argnames")}
  try:
    _compat.jax_jit(fun, **others)
  except (ValueError, TypeError):
    return error
  try:
    params = ", ".join(inspect.signature(fun).parameters)
  except (TypeError, ValueError):
    params = "unknown"
  cls = _errors.DonationTypeError if isinstance(error, TypeError) else _errors.DonationError
  return cls(
    _errors.message(
      f"donate.jit of {name}: {str(error).rstrip('.')}",
      expected=f"arguments of {name}({params})",
      fix="name parameters that exist in donate_argnums/donate_argnames and static_argnums/"
      "static_argnames, and never the same one in both",
    )
  )
