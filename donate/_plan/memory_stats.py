"""`MemoryStats`: the compiled program's own memory figures, as `Compiled.memory_analysis()` gives
them, under the package's names for byte counts (`<what>_bytes`)."""

from __future__ import annotations

import dataclasses

from donate._base.text import format_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryStats:
  """The compiled program's own memory figures (`Compiled.memory_analysis()`), in bytes.

  Each figure is XLA's `<what>_size_in_bytes` named `<what>_bytes`; the earlier names
  (`argument`, `output`, `alias`, `temp`, `generated_code`, `peak`) still read them.

  >>> import jax.numpy as jnp, donate
  >>> m = donate.jit(lambda a: a * 2, donate_argnums=0).plan(jnp.ones(256)).memory
  >>> m.argument_bytes, m.output_bytes, m.alias_bytes, m.temp_bytes, m.peak_bytes
  (1024, 1024, 1024, 0, 1024)
  """

  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  generated_code_bytes: int

  @property
  def peak_bytes(self) -> int:
    """Arguments + outputs - aliased + temporaries: what the step holds at once."""
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

  @classmethod
  def from_compiled(cls, compiled) -> MemoryStats | None:
    stats = compiled.memory_analysis()
    if stats is None:
      return None
    return cls(
      int(stats.argument_size_in_bytes),
      int(stats.output_size_in_bytes),
      int(stats.alias_size_in_bytes),
      int(stats.temp_size_in_bytes),
      int(stats.generated_code_size_in_bytes),
    )

  # The earlier names, kept so that code written for them runs unchanged.

  @property
  def argument(self) -> int:
    """The old name of `argument_bytes`."""
    return self.argument_bytes

  @property
  def output(self) -> int:
    """The old name of `output_bytes`."""
    return self.output_bytes

  @property
  def alias(self) -> int:
    """The old name of `alias_bytes`."""
    return self.alias_bytes

  @property
  def temp(self) -> int:
    """The old name of `temp_bytes`."""
    return self.temp_bytes

  @property
  def generated_code(self) -> int:
    """The old name of `generated_code_bytes`."""
    return self.generated_code_bytes

  @property
  def peak(self) -> int:
    """The old name of `peak_bytes`."""
    return self.peak_bytes


def text(m: MemoryStats) -> str:
  """The figures in words, as the plan prints them."""
  return (
    f"arguments {format_bytes(m.argument_bytes)}, outputs {format_bytes(m.output_bytes)}, "
    f"aliased {format_bytes(m.alias_bytes)}, temporaries {format_bytes(m.temp_bytes)}, "
    f"peak {format_bytes(m.peak_bytes)}"
  )
