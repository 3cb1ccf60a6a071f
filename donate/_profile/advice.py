"""What would lower a profile's peak, measured: the program compiled with each candidate change.

`advise(profile)` compiles the profiled program once per candidate and reads each compile's peak
as the profile's own is read (`api.peak_of`):

- donating what `could_donate` names (the argnums to write), where the profile has the traced
  program (`Program.donating`);
- XLA options that move the peak on the program's backend, passed per compile through
  `compiler_options` (`OPTIONS`: each is a field of XLA's `DebugOptions`, accepted by jaxlib
  0.10 and 0.12 for CPU programs and for H100 programs compiled ahead of time);
- where activations are at the peak, the source lines whose saved values a `jax.checkpoint`
  policy would recompute instead, with their bytes at the peak: stated, not compiled (it is a
  code change), `peak_bytes` None.

Nothing is compiled before `advice()` is called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from donate._base.text import format_bytes

# backend -> (change in words, option, value): XLA DebugOptions that move the peak.
OPTIONS = {
  "cpu": (
    (
      "schedule for memory, not concurrency",
      "xla_cpu_scheduler_type",
      "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED",
    ),
  ),
  "gpu": (
    (
      "turn off the latency-hiding scheduler (it keeps more buffers live to overlap communication)",
      "xla_gpu_enable_latency_hiding_scheduler",
      False,
    ),
    ("turn on the latency-hiding scheduler", "xla_gpu_enable_latency_hiding_scheduler", True),
    (
      "rematerialize earlier: XLA's memory limit at 80% of the device, not 95%",
      "xla_gpu_memory_limit_slop_factor",
      80,
    ),
  ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Advice:
  """One candidate change and its measured peak.

  Attributes:
    change: the change in words.
    how: the keyword, compiler option or code to write.
    peak_bytes: the peak of the program compiled with the change (None: stated, not compiled).
    saving_bytes: the profile's `peak_bytes` minus `peak_bytes` (for a stated change: the bytes
      at the peak it concerns).
  """

  change: str
  how: str
  peak_bytes: int | None
  saving_bytes: int

  @property
  def measured(self) -> bool:
    return self.peak_bytes is not None

  def __str__(self) -> str:
    if self.peak_bytes is None:
      return f"{self.change}: {format_bytes(self.saving_bytes)} at the peak (stated) - {self.how}"
    peak, saving = format_bytes(self.peak_bytes), self.saving_bytes
    if saving > 0:
      effect = f"lowers the peak to {peak} ({format_bytes(saving)} saved)"
    elif saving == 0:
      effect = f"leaves the peak at {peak}"
    else:
      effect = f"raises the peak to {peak} ({format_bytes(-saving)} more)"
    return f"{self.change}: {effect}, measured - {self.how}"


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
  """How to compile the profiled program again: `compile(options)` with more compiler options,
  `donating(argnums)` (None where the trace is not at hand) with more inputs donated; each
  returns the peak, read as the profile's own."""

  compile: Callable[[dict], int]
  donating: Callable[[tuple[int, ...]], int] | None = None
  donated_argnums: tuple[int, ...] = ()  # what it donates already (the keyword keeps them)


def _checkpoint_lines(profile) -> list[Advice]:
  lines = [r for r in profile.by_line() if r.category == "activations"]
  acts = sum(g.total_bytes for g in profile.by_category() if g.key == "activations")
  if not lines or acts * 4 < profile.peak_bytes:  # activations do not dominate the peak
    return []
  return [
    Advice(
      f"recompute {r} in the backward pass instead of saving it",
      "jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable) around "
      f"the code at {r.source} (or a policy that saves only dots: "
      "dots_with_no_batch_dims_saveable)",
      None,
      r.total_bytes,
    )
    for r in lines[:3]
  ]


def _wanted(candidates, change: str, how: str) -> bool:
  return candidates is None or any(c in (change, how) or c in how for c in candidates)


def advise(profile, candidates=None) -> tuple[Advice, ...]:
  """The measured advice of `profile` (see the module docstring); `candidates` limits the
  compiled ones to those whose `change` or `how` it names.

  Raises:
    DonationError: the profile has no program to compile again (a `jax.stages.Compiled` alone).
  """
  from donate._profile import errors

  program = profile.program
  if program is None:
    errors.no_program_for_advice()
  found = []
  argnums = tuple(sorted({s.argnum for s in profile.could_donate if s.argnum is not None}))
  if argnums and program.donating is not None:
    every = tuple(sorted(set(argnums) | set(program.donated_argnums)))
    how = "donate_argnums=" + (str(every[0]) if len(every) == 1 else str(every))
    if _wanted(candidates, "donate", how):
      peak = program.donating(argnums)
      found.append(
        Advice(
          "donate " + ", ".join(s.path for s in profile.could_donate),
          how,
          peak,
          profile.peak_bytes - peak,
        )
      )
  for change, option, value in OPTIONS.get(profile.platform, ()):
    how = f"compiler_options={{{option!r}: {value!r}}}"
    if _wanted(candidates, change, how):
      peak = program.compile({option: value})
      found.append(Advice(change, how, peak, profile.peak_bytes - peak))
  return tuple(found) + tuple(_checkpoint_lines(profile))
