"""XLA:GPU settings that place the annotated collectives in collective memory, per compile.

What XLA:GPU offers (checked on jaxlib 0.10.2 and 0.12.0.1 by compiling for an abstract H100):

* per compile, by collective kind: ``xla_gpu_all_gather_mode``, ``xla_gpu_collective_permute_mode``
  and ``xla_gpu_ragged_all_to_all_mode`` accept ``COLLECTIVES_SYMMETRIC_MEMORY``; that places
  every collective *of that kind* in the program (the backend config of each says
  ``"collectives_mode":"COLLECTIVES_SYMMETRIC_MEMORY"``);
* per compile, all or nothing: ``xla_gpu_enable_nccl_user_buffers`` places the buffers of *every*
  collective (``gpu_compile_options``); all-reduce, reduce-scatter and all-to-all have no per-kind
  mode. XLA's buffer assigner then colours buffers used by collectives with memory space 1
  (``kCollectiveMemorySpaceColor``), allocated by ``ncclMemAlloc`` from the collective allocator
  and registered with NCCL (user-buffer registration, zero-copy collectives); XLA documents that
  the allocator's ``collective_memory_size`` must then be large enough for peak collective memory
  (JAX sets it from ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB``, see ``donate._symm.size``).
  With ``xla_gpu_experimental_enable_nccl_symmetric_buffers`` as well, collective thunks register
  those buffers as NCCL symmetric windows (``use_symmetric_buffer``), which NCCL >= 2.27 uses for
  its low-latency symmetric kernels; turned on for CUDA only (we have no evidence that RCCL
  supports symmetric windows, so ROCm gets user buffers only). Neither is passed for CPU or TPU,
  which have no collective memory space;
* per process, by kind, size and dtype (jaxlib 0.12 only; jaxlib 0.10.2 aborts the process on the
  unknown flag):
  ``XLA_FLAGS=--xla_enable_nccl_symmetric_buffers_for_collectives=Op[:max_bytes[:dtype]],...``.
  It is a repeated message field of XLA's ``DebugOptions``, which ``compiler_options`` refuse
  ("not a valid message value"), and XLA reads ``XLA_FLAGS`` once, when JAX starts its first
  backend: set later it is silently ignored. ``configure`` sets it, and refuses when it is too late.

``target_platform`` finds the platform a program compiles for from its shardings;
``placement_policy`` picks the narrowest of these settings for the program's annotations and says
which un-annotated collectives get placed too, and why.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jaxlib

from donate._base import compat as _compat
from donate._base.errors import DonationError, message

GPU_PLATFORMS = frozenset({"cuda", "rocm", "gpu"})
"""Platform names for which collective memory exists."""

SYMMETRIC = "COLLECTIVES_SYMMETRIC_MEMORY"
FLAG = "--xla_enable_nccl_symmetric_buffers_for_collectives"

KIND_OF_PRIMITIVE = {
  "psum": "all-reduce",
  "psum_invariant": "all-reduce",
  "psum2": "all-reduce",
  "pmax": "all-reduce",
  "pmin": "all-reduce",
  "pmean": "all-reduce",
  "all_gather": "all-gather",
  "all_gather_invariant": "all-gather",
  "reduce_scatter": "reduce-scatter",
  "psum_scatter": "reduce-scatter",
  "ppermute": "collective-permute",
  "all_to_all": "all-to-all",
  "ragged_all_to_all": "ragged-all-to-all",
}
"""The HLO collective each JAX collective primitive lowers to."""

MODE_OPTIONS = {
  "all-gather": "xla_gpu_all_gather_mode",
  "collective-permute": "xla_gpu_collective_permute_mode",
  "ragged-all-to-all": "xla_gpu_ragged_all_to_all_mode",
}
"""Per-compile options that place every collective of one kind in collective memory."""

SPEC_OPS = {
  "AllReduce": "all-reduce",
  "AllGather": "all-gather",
  "ReduceScatter": "reduce-scatter",
  "AllToAll": "all-to-all",
  "CollectivePermute": "collective-permute",
  "RaggedAllToAll": "ragged-all-to-all",
}
"""Op names of the process-wide spec, and the HLO collective each selects."""


@dataclasses.dataclass(frozen=True, slots=True)
class SpecEntry:
  """One ``Op[:max_bytes[:dtype]]`` entry of the process-wide spec."""

  op: str
  max_bytes: int | None = None
  dtype: str | None = None

  @property
  def kind(self) -> str:
    return SPEC_OPS[self.op]

  def matches(self, kind: str, nbytes: int, dtype: str) -> bool:
    return (
      kind == self.kind
      and (self.max_bytes is None or nbytes <= self.max_bytes)
      and (self.dtype is None or self.dtype.lower() == dtype.lower())
    )

  def __str__(self) -> str:
    parts = [self.op] + ([str(self.max_bytes)] if self.max_bytes is not None else [])
    return ":".join(parts + ([self.dtype] if self.dtype else []))


def parse_spec(text: str) -> tuple[SpecEntry, ...]:
  """Parses ``"AllReduce:8192:F32,AllGather"`` into entries.

  >>> [str(e) for e in parse_spec("AllReduce:8192:F32, allgather")]
  ['AllReduce:8192:F32', 'AllGather']
  """
  out = []
  lower = {k.lower(): k for k in SPEC_OPS}
  for item in filter(None, (s.strip() for s in str(text).split(","))):
    op, *rest = item.split(":")
    if op.lower() not in lower or len(rest) > 2 or (rest and not rest[0].isdigit()):
      raise DonationError(
        message(
          f"bad collective-memory spec entry {item!r}",
          expected="Op[:max_bytes[:dtype]] with Op one of " + ", ".join(SPEC_OPS),
          got=repr(item),
          fix='e.g. "AllReduce:8388608:F32"',
        )
      )
    out.append(
      SpecEntry(
        lower[op.lower()],
        int(rest[0]) if rest else None,
        rest[1].upper() if len(rest) > 1 else None,
      )
    )
  return tuple(out)


def process_spec() -> tuple[SpecEntry, ...]:
  """The process-wide spec in ``XLA_FLAGS`` now (what XLA read, if it was set before JAX started).

  >>> isinstance(process_spec(), tuple)
  True
  """
  found = re.findall(FLAG + r"=(\S+)", os.environ.get("XLA_FLAGS", ""))
  return parse_spec(found[-1]) if found else ()


def spec_supported(version: str | None = None) -> bool:
  """True if jaxlib ``version`` (default: installed)'s XLA knows the process-wide flag (>= 0.12).

  Checked: jaxlib 0.12.0.1 knows it; jaxlib 0.10.2 aborts the process at start-up on it.

  >>> spec_supported("0.10.2"), spec_supported("0.12.0.1")
  (False, True)
  """
  version = jaxlib.__version__ if version is None else version
  return tuple(int(p) for p in version.split(".")[:2]) >= (0, 12)


def require_spec_support(version: str) -> None:
  """Raises if jaxlib ``version`` has no process-wide per-collective flag."""
  if not spec_supported(version):
    raise DonationError(
      message(
        f"jaxlib {version} has no per-collective collective-memory flag",
        expected=f"jaxlib >= 0.12 for {FLAG}",
        got=version,
        fix="upgrade jax/jaxlib, or let the compile options place every collective (user buffers)",
      )
    )


def configure(*collectives: str) -> tuple[SpecEntry, ...]:
  """Sets the process-wide spec that places matching collectives in collective memory.

  Call it before JAX starts any backend (before the first array exists). See
  ``donate.symm.configure`` for the user-facing description.
  """
  entries = parse_spec(",".join(collectives))
  if _compat.backends_are_initialized():
    raise DonationError(
      message(
        "donate.symm.configure came too late: JAX has started its backends, and XLA has read "
        "XLA_FLAGS already (a later change is silently ignored)",
        expected="a call before the first array or jit",
        got="initialised backends",
        fix="call donate.symm.configure(...) right after import donate, or set "
        f"XLA_FLAGS={FLAG}={','.join(map(str, entries))} in the environment",
      )
    )
  require_spec_support(jaxlib.__version__)
  os.environ["XLA_FLAGS"] = flags_with_spec(os.environ.get("XLA_FLAGS", ""), entries)
  return entries


def flags_with_spec(xla_flags: str, entries) -> str:
  """``xla_flags`` with its process-wide spec replaced by ``entries`` (removed if there are none).

  >>> flags_with_spec(f"--a=1 {FLAG}=AllGather", parse_spec("AllReduce:64"))
  '--a=1 --xla_enable_nccl_symmetric_buffers_for_collectives=AllReduce:64'
  >>> flags_with_spec(f"{FLAG}=AllGather --a=1", ())
  '--a=1'
  """
  flags = re.sub(FLAG + r"=\S+", "", xla_flags).split()
  if entries:
    flags.append(f"{FLAG}={','.join(map(str, entries))}")
  return " ".join(flags)


def gpu_compile_options(platform: str, comm_buffers) -> dict[str, str | bool | int]:
  """Returns the XLA compile options that place every collective in collective memory.

  Args:
    platform: a JAX platform name (``jax.devices()[0].platform`` or a backend name).
    comm_buffers: the program's comm buffers (anything with a length, e.g. from
      ``comm_buffers``); no buffers means no options.

  Returns:
    A dict for ``jax.jit(..., compiler_options=...)``; empty for CPU and TPU.

  >>> gpu_compile_options("cuda", ["buffer"])
  {'xla_gpu_enable_nccl_user_buffers': True,
   'xla_gpu_experimental_enable_nccl_symmetric_buffers': True}
  >>> gpu_compile_options("cpu", ["buffer"])
  {}
  """
  platform = str(platform).lower()
  if platform not in GPU_PLATFORMS or not len(comm_buffers):
    return {}
  options: dict[str, str | bool | int] = {"xla_gpu_enable_nccl_user_buffers": True}
  if platform != "rocm":
    options["xla_gpu_experimental_enable_nccl_symmetric_buffers"] = True
  return options


def target_platform(shardings, default_backend: str) -> str:
  """The platform a program compiles for, from its arguments' and outputs' shardings.

  Args:
    shardings: ``jax.sharding.Sharding`` objects (or None, skipped) of concrete and abstract
      arguments, ``in_shardings`` and ``out_shardings``. Shardings over abstract meshes (no
      devices) are skipped.
    default_backend: the platform when no sharding names devices (``jax.default_backend()``).

  Returns:
    ``"cuda"`` for NVIDIA GPUs (compile-only topology devices report platform ``"gpu"`` and an
    NVIDIA ``device_kind``), ``"rocm"`` for AMD GPUs, else the devices' platform (``"cpu"``,
    ``"tpu"``). A GPU among several platforms wins.

  >>> import jax
  >>> target_platform([None, jax.sharding.make_single_device_sharding(jax.devices()[0])], "gpu")
  'cpu'
  >>> target_platform([], "cpu")
  'cpu'
  """
  found, seen = [], set()
  for sharding in shardings:
    if sharding is None or id(sharding) in seen:  # each object once: leaves share a few
      continue
    seen.add(id(sharding))
    try:
      devices = sharding.device_set
    except (ValueError, AttributeError, RuntimeError):  # abstract mesh: no devices
      devices = ()
    found += [_device_platform(d) for d in devices]
  if not found:
    return _device_platform(None, default_backend)
  gpus = [p for p in found if p in GPU_PLATFORMS]
  return gpus[0] if gpus else found[0]


def _device_platform(device, platform: str | None = None) -> str:
  platform = str(platform if device is None else device.platform).lower()
  if platform != "gpu":
    return platform
  text = (
    getattr(device, "device_kind", "")
    + " "
    + getattr(getattr(device, "client", None), "platform_version", "")
  ).lower()
  if "nvidia" in text or "cuda" in text:
    return "cuda"
  if "amd" in text or "rocm" in text or "instinct" in text:
    return "rocm"
  return "cuda" if device is None else "gpu"


def annotated_kinds(comm_buffers) -> tuple[tuple[str, ...], bool]:
  """HLO kinds of the collectives the annotated buffers feed, and whether some kind is unknown."""
  kinds, unknown = [], False
  for buf in comm_buffers:
    for name in getattr(buf, "collectives", ()):
      kind = KIND_OF_PRIMITIVE.get(name)
      if kind is None:
        unknown = unknown or name not in ("pbroadcast",)
      elif kind not in kinds:
        kinds.append(kind)
  return tuple(kinds), unknown


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementPolicy:
  """How one compile places the annotated collectives, and what else gets placed with them.

  Attributes:
    platform: the target platform.
    options: the per-compile ``compiler_options`` to add.
    routes: (collective kind, how it is placed) for each annotated kind.
    placed_too: sentences naming un-annotated collectives that are placed as well, and why.
    process: the process-wide spec entries in force (read from ``XLA_FLAGS``).
  """

  platform: str
  options: dict
  routes: tuple[tuple[str, str], ...]
  placed_too: tuple[str, ...]
  process: tuple[SpecEntry, ...]

  def route(self, kind: str) -> str | None:
    return dict(self.routes).get(kind)


def _all_or_nothing(platform, comm_buffers, kinds, unknown, process) -> PlacementPolicy:
  options = gpu_compile_options(platform, comm_buffers)
  route = "xla_gpu_enable_nccl_user_buffers (every collective of the program)"
  stuck = [k for k in kinds if k not in MODE_OPTIONS and not any(e.kind == k for e in process)]
  why = (
    f"XLA has no per-compile option that places only the annotated {', '.join(stuck)}"
    if stuck
    else "an annotated value feeds a collective of unknown kind"
  )
  hint = (
    "; donate.symm.configure(...) before JAX starts places them selectively"
    if spec_supported()
    else f" (jaxlib {jaxlib.__version__} has no per-collective flag)"
  )
  return PlacementPolicy(
    platform,
    options,
    tuple((k, route) for k in kinds),
    (f"every un-annotated collective is placed too: {why}{hint}",),
    process,
  )


def placement_policy(platform: str, comm_buffers, *, enabled: bool = True) -> PlacementPolicy:
  """Chooses the compile options that place exactly the annotated collectives where XLA allows.

  Args:
    platform: the target platform (``target_platform``).
    comm_buffers: the program's comm buffers (``donate.symm.comm_buffers``).
    enabled: False turns placement off (no options).

  Returns:
    A ``PlacementPolicy``; its ``options`` are empty off GPUs, without annotations, or disabled.

  >>> import jax, jax.numpy as jnp, donate
  >>> step = lambda v: jax.lax.all_gather(donate.with_symmetric(v * 2, "i"), "i")
  >>> bufs = donate.symm.comm_buffers(jax.make_jaxpr(step, axis_env=[("i", 1)])(jnp.ones(2)))
  >>> placement_policy("cuda", bufs).options
  {'xla_gpu_all_gather_mode': 'COLLECTIVES_SYMMETRIC_MEMORY'}
  >>> placement_policy("cuda", bufs).placed_too
  ('every un-annotated all-gather of the program is placed too: ...',)
  >>> placement_policy("cpu", bufs).options
  {}
  """
  platform, process = str(platform).lower(), process_spec()
  kinds, unknown = annotated_kinds(comm_buffers)
  if (
    not enabled or platform not in GPU_PLATFORMS or not len(comm_buffers) or not (kinds or unknown)
  ):
    return PlacementPolicy(platform, {}, (), (), process)
  by_process = {e.kind for e in process}
  if (
    unknown
    or platform != "cuda"
    or any(k not in MODE_OPTIONS and k not in by_process for k in kinds)
  ):
    return _all_or_nothing(platform, comm_buffers, kinds, unknown, process)
  options, routes, too = {}, [], []
  for kind in kinds:
    if kind in by_process:
      spec = ",".join(str(e) for e in process if e.kind == kind)
      routes.append((kind, f"process-wide {FLAG[2:]}={spec}"))
      too.append(
        f"every {kind} matching {spec} (op, size, dtype) is placed, annotated or not, "
        "in every program of the process"
      )
    else:
      options[MODE_OPTIONS[kind]] = SYMMETRIC
      routes.append((kind, f"{MODE_OPTIONS[kind]}={SYMMETRIC} (every {kind} of the program)"))
      too.append(
        f"every un-annotated {kind} of the program is placed too: the mode option "
        f"applies to all {kind}s, XLA has no per-instruction switch"
      )
  return PlacementPolicy(platform, options, tuple(routes), tuple(too), process)


def compile_options_for(platform: str, comm_buffers, *, enabled: bool = True) -> dict:
  """The per-compile options that place the annotated collectives (see ``placement_policy``).

  >>> compile_options_for("cpu", ["buffer"])
  {}
  """
  return dict(placement_policy(platform, comm_buffers, enabled=enabled).options)
