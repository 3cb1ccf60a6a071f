"""GPU target descriptions for compiling without a GPU: the figures of each GPU, as XLA wants them.

A compile-only GPU client (``jax.experimental.topologies.get_topology_desc(..., "cuda",
target_config=TEXT)``) needs a ``GpuTargetConfigProto`` in text form. The figures below are those
XLA publishes for each GPU in ``xla/backends/gpu/target_config/specs/<name>.txtpb`` (Apache-2.0),
reduced to the fields that both jaxlib 0.10.2 and jaxlib 0.12.0.1 parse: jaxlib 0.10.2 rejects the
whole config if it has a field it does not know (``collective_memory_granularity``,
``scalar_unit_description`` and others added later), so only the device-info fields the compiler
reads for code generation and cost models are kept.

>>> spec = SPECS["h100"]
>>> spec.core_count, spec.compute_capability, spec.device_memory_bytes // 2**30
(132, (9, 0), 79)
>>> print(spec.text().splitlines()[6])
  core_count: 132
"""

from __future__ import annotations

import dataclasses

# Per-block and per-core limits shared by Hopper (sm_90) and Blackwell (sm_100) in XLA's specs.
_COMMON_LIMITS = (
  ("threads_per_block_limit", 1024),
  ("threads_per_warp", 32),
  ("shared_memory_per_block", 49152),
  ("shared_memory_per_core", 233472),
  ("threads_per_core_limit", 2048),
)
_BLOCK_LIMITS = (
  ("fpus_per_core", 128),
  ("block_dim_limit_x", 2147483647),
  ("block_dim_limit_y", 65535),
  ("block_dim_limit_z", 65535),
)
_REGISTERS = (("registers_per_core_limit", 65536), ("registers_per_block_limit", 65536))
_SHARED_OPTIN = 232448


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSpec:
  """One GPU model's figures, as published in XLA's target-config spec files.

  Attributes:
    name: the short name used by ``donate.targets`` (``"h100"``, ``"b200"``).
    description: the device description string (what ``device.device_kind`` reports).
    core_count: streaming multiprocessors.
    compute_capability: (major, minor); the "a" feature set (sm_90a, sm_100a) is selected too.
    memory_bandwidth: bytes per second.
    l2_cache_bytes: bytes of L2 cache (XLA's `l2_cache_size`).
    clock_rate_ghz: SM clock.
    device_memory_bytes: bytes of device memory (XLA's `device_memory_size`).
    dnn_version: cuDNN (major, minor, patch) the spec names.
    source: the spec file in XLA's repository the figures come from.
  """

  name: str
  description: str
  core_count: int
  compute_capability: tuple[int, int]
  memory_bandwidth: int
  l2_cache_bytes: int
  clock_rate_ghz: float
  device_memory_bytes: int
  dnn_version: tuple[int, int, int]
  source: str

  @property
  def l2_cache_size(self) -> int:
    """The old name of `l2_cache_bytes`."""
    return self.l2_cache_bytes

  @property
  def device_memory_size(self) -> int:
    """The old name of `device_memory_bytes`."""
    return self.device_memory_bytes

  def text(self) -> str:
    """The ``GpuTargetConfigProto`` text for ``get_topology_desc(target_config=...)``."""
    info = [
      *_COMMON_LIMITS,
      ("core_count", self.core_count),
      *_BLOCK_LIMITS,
      ("memory_bandwidth", self.memory_bandwidth),
      ("l2_cache_size", self.l2_cache_bytes),
      ("clock_rate_ghz", self.clock_rate_ghz),
      ("device_memory_size", self.device_memory_bytes),
      ("shared_memory_per_block_optin", _SHARED_OPTIN),
    ]
    major, minor = self.compute_capability
    capability = f"    major: {major}\n" + (f"    minor: {minor}\n" if minor else "")
    lines = [
      "gpu_device_info {",
      *(f"  {k}: {v}" for k, v in info),
      "  cuda_compute_capability {",
      capability + "    feature_extension: ACCELERATED_FEATURES",
      "  }",
      *(f"  {k}: {v}" for k, v in _REGISTERS),
      "}",
      'platform_name: "CUDA"',
      "dnn_version_info {",
    ]
    lines += [f"  {k}: {v}" for k, v in zip(("major", "minor", "patch"), self.dnn_version) if v]
    lines += ["}", f'device_description_str: "{self.description}"']
    return "\n".join(lines) + "\n"


SPECS = {
  "h100": GpuSpec(
    name="h100",
    description="NVIDIA H100 80GB HBM3",
    core_count=132,
    compute_capability=(9, 0),
    memory_bandwidth=3352320000000,
    l2_cache_bytes=52428800,
    clock_rate_ghz=1.98,
    device_memory_bytes=84942979072,
    dnn_version=(8, 9, 4),
    source="xla/backends/gpu/target_config/specs/h100_sxm.txtpb",
  ),
  "b200": GpuSpec(
    name="b200",
    description="NVIDIA B200",
    core_count=148,
    compute_capability=(10, 0),
    memory_bandwidth=7672320000000,
    l2_cache_bytes=132644864,
    clock_rate_ghz=1.965,
    device_memory_bytes=191514411008,
    dnn_version=(9, 7, 0),
    source="xla/backends/gpu/target_config/specs/b200.txtpb",
  ),
}
"""The GPUs ``donate.targets`` can compile for, by short name."""
