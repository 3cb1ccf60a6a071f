"""What would lower a profile's peak, measured: the program compiled with each candidate change.

`advise(profile)` lists the candidate changes (`changes`) and measures each on the profile's
target through `variants.Program.measure` (one compile per candidate, read as the profile's
own peak is read, FLOPs from XLA's cost analysis):

- donating what `could_donate` names (the argnums to write), where the profile has the traced
  program;
- XLA options that move the peak on the program's backend, passed per compile through
  `compiler_options` (`OPTIONS`: each is a field of XLA's `DebugOptions`, accepted by jaxlib
  0.10 and 0.12 for CPU programs and for H100 programs compiled ahead of time);
- checkpoint policies (`remat.changes`): every checkpoint's policy replaced by JAX's named
  ones, or, where the code has none, each layer loop's body checkpointed; where none of these
  can be compiled (a `Lowered` or `donate.jit` stage alone, layers unrolled rather than looped),
  the source lines whose saved values a policy would recompute are stated, `peak_bytes` None;
- the optimizer state kept in host memory (`offload`), where JAX can express it for the
  target; elsewhere (XLA:CPU, compile-only GPU devices) it is named with why it was not
  measured (`offload.unsupported`) and the state's bytes.

Nothing is compiled before `advice()` is called.
"""

from __future__ import annotations

import dataclasses

from donate._base.text import format_bytes
from donate._profile import offload, remat, schedule
from donate._profile.variants import Change, Program

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
    flops_ratio: XLA's FLOPs of the changed program over the original's (None: not measured).
    same_values: the changed program's outputs against the original's on the profile's
      arguments ("bitwise", "allclose (...)", "differ (...)"; None: not checked).
    host_bytes: what the changed program keeps in host memory (offload), beside `peak_bytes`.
  """

  change: str
  how: str
  peak_bytes: int | None
  saving_bytes: int
  flops_ratio: float | None = None
  same_values: str | None = None
  host_bytes: int = 0

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
    flops = "" if self.flops_ratio is None else f", {self.flops_ratio:.2f}x the FLOPs"
    if self.host_bytes:
      flops += f", {format_bytes(self.host_bytes)} in host memory"
    return f"{self.change}: {effect}{flops}, measured - {self.how}"


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
  return candidates is None or any(c in change or c in how for c in candidates)


def changes(profile, candidates=None) -> tuple[Change, ...]:
  """The candidate changes of `profile` that `candidates` names (all when None): donation, XLA
  options, checkpoint policies (see the module docstring). Compiles nothing."""
  program = profile.program
  found = []
  argnums = tuple(sorted({s.argnum for s in profile.could_donate if s.argnum is not None}))
  if argnums and program.can_donate:
    every = tuple(sorted(set(argnums) | set(program.donated_argnums)))
    how = "donate_argnums=" + (str(every[0]) if len(every) == 1 else str(every))
    own = {s.how for s in profile.could_donate if s.how is not None}
    how = own.pop() if len(own) == 1 else how  # the user's framework's keyword
    words = "donate " + ", ".join(s.path for s in profile.could_donate)
    found.append(Change(words, how, donate=argnums))
  for change, option, value in OPTIONS.get(profile.platform, ()):
    how = f"compiler_options={{{option!r}: {value!r}}}"
    found.append(Change(change, how, ((option, value),)))
  traced = program.made.traced
  if program.can_retrace and traced is not None:
    found += remat.changes(traced.jaxpr, profile.platform)
  host = offload.placement(profile) if profile.platform == "gpu" else None
  if host is not None and offload.unsupported(profile) is None:
    words = f"keep the optimizer state in host memory; {offload.CAVEAT}"
    found.append(Change(words, offload.HOW, host=host))
  return tuple(c for c in found if _wanted(candidates, c.change, c.how))


def _not_measured(profile, candidates) -> list[Advice]:
  """The remedies named, not measured, on this target (`offload.unsupported`)."""
  if offload.placement(profile) is None or (why := offload.unsupported(profile)) is None:
    return []
  state = sum(
    e.nbytes for e in profile.at_peak if e.kind == "argument" and e.category == "optimizer state"
  )
  words = f"keep the optimizer state in host memory ({why})"
  if not _wanted(candidates, words, offload.HOW):
    return []
  return [Advice(words, offload.HOW, None, state)]


def advise(
  profile,
  candidates=None,
  check_values: bool = True,
  progress: bool | None = None,
  max_workers: int | None = None,
) -> tuple[Advice, ...]:
  """The measured advice of `profile` (see the module docstring); `candidates` limits the
  compiled ones to those whose `change` or `how` it names. `check_values`: run each checkpoint
  change on the profile's own arguments against the original (where they are concrete arrays
  on this machine's backend) and record the comparison. The compiles are announced on stderr
  and run `max_workers` at a time, with a bar on a terminal (`progress`: see `schedule`).

  Raises:
    DonationError: the profile has no program to compile again (a `jax.stages.Compiled` alone).
  """
  from donate._profile import errors

  program = profile.program
  if program is None:
    errors.no_program_for_advice()
  assert isinstance(program, Program)
  found = []
  candidates_found = changes(profile, candidates)
  if candidates_found:
    lists = [(), *((c,) for c in candidates_found)]
    schedule.measure(program, lists, "advice", profile.platform, progress, max_workers)
  for c in candidates_found:
    m = program.measure((c,))
    ratio = program.flops_ratio((c,))
    same = program.same_values((c,)) if check_values and c.retraces else None
    found.append(
      Advice(
        c.change, c.how, m.peak_bytes, profile.peak_bytes - m.peak_bytes, ratio, same, m.host_bytes
      )
    )
  measured_remat = any(c.retraces for c in candidates_found)
  stated = () if measured_remat else _checkpoint_lines(profile)
  return tuple(found) + tuple(stated) + tuple(_not_measured(profile, candidates))
