"""How a `donate.jit` program reaches its memory profile: the `__donate_program__` protocol.

A `donate.jit` stage (`Traced`, `Lowered`, `Compiled`) answers `__donate_program__()` with a
`Source`: what the profile needs to read its program and name it in the user's terms. The
profile never looks inside the stage; the stage never imports the profile's internals.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class Source:
  """One `donate.jit` program, as its memory profile reads it."""

  name: str  # the user's function's name
  signature: inspect.Signature | None  # its parameters (for donate_argnums advice)
  plan: Any  # its DonationPlan: parameters named by the leaves' paths, outputs by the plan's
  in_paths: tuple[str, ...]  # the lowered module's parameters as the user's leaf paths
  lowered: Any  # its jax.stages.Lowered (compiled again with XLA's dump where needed)
  compiled: Any = None  # its jax.stages.Compiled, read as it is where it carries its assignment
  compiler_options: dict | None = None  # the options it was compiled with
  lower_without_donation: Callable[[], Any] | None = None  # the saving's baseline, if at hand
  traced: Any = None  # the jax.stages.Traced of jax.jit's own lowering, when that runs it
  # for advice, where `traced` is None: argnums -> the program lowered with those donated too
  lower_donating: Callable[[tuple[int, ...]], Any] | None = None
  donated_argnums: tuple[int, ...] = ()  # the positional arguments it donates every leaf of


@runtime_checkable
class DonateProgram(Protocol):
  """A `donate.jit` stage: it names its program for the profile."""

  def __donate_program__(self) -> Source: ...
