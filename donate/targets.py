"""Abstract GPU meshes for ahead-of-time work: compile real H100/B200 programs on any machine.

With the ``gpu-aot`` extra (``pip install "jax-donate[gpu-aot]"``: ``jax-cuda12-plugin`` and
``jax-cuda12-pjrt`` at the installed jaxlib's version; no NVIDIA driver or CUDA libraries needed),
JAX can build the real GPU executable on a CPU-only machine. ``gpu_mesh("h100", 8)`` returns a
``jax.sharding.Mesh`` over 8 compile-only H100 devices; shard ``jax.ShapeDtypeStruct`` arguments
on it and ``jax.jit(f).lower(*args).compile()`` gives XLA:GPU's compiled program (its HLO, memory
spaces, buffer assignment and aliases), which nothing can run here.

>>> from donate import targets
>>> targets.gpu_names()
('b200', 'h100')
>>> print(targets.target_config("b200").splitlines()[-1])
device_description_str: "NVIDIA B200"
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
from collections.abc import Sequence

import jax
import jaxlib

from donate._base.errors import DonationError, message
from donate._xla.gpu_targets import SPECS
from donate._xla.gpu_targets import GpuSpec as GpuSpec

__all__ = [
  "GpuSpec",
  "available",
  "gpu_mesh",
  "gpu_names",
  "gpu_spec",
  "gpu_topology",
  "target_config",
]

_PLUGIN = "jax-cuda12-plugin"
_INSTALL = (
  f'pip install "jax-donate[gpu-aot]" (or: pip install "jax[cuda12-local]=={jax.__version__}")'
)


def gpu_names() -> tuple[str, ...]:
  """Returns the short names of the GPUs this package has target configs for.

  >>> gpu_names()
  ('b200', 'h100')
  """
  return tuple(sorted(SPECS))


def gpu_spec(name: str) -> GpuSpec:
  """Returns the figures of GPU ``name`` (case-insensitive).

  Raises:
    DonationError: unknown name (the message lists the known ones).

  >>> gpu_spec("B200").core_count
  148
  """
  spec = SPECS.get(str(name).lower())
  if spec is None:
    raise DonationError(
      message(
        f"no GPU target named {name!r}", expected="one of " + ", ".join(gpu_names()), got=repr(name)
      )
    )
  return spec


def target_config(name: str) -> str:
  """Returns the ``GpuTargetConfigProto`` text of GPU ``name``, for ``get_topology_desc``.

  >>> "core_count: 132" in target_config("h100")
  True
  """
  return gpu_spec(name).text()


def _plugin_version() -> str | None:
  try:
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
      return None
    return importlib.metadata.version(_PLUGIN)
  except (ImportError, importlib.metadata.PackageNotFoundError):
    return None


def available() -> bool:
  """True if the CUDA plugin matching the installed jaxlib is installed (GPU programs compile).

  >>> isinstance(available(), bool)
  True
  """
  return _plugin_version() == jaxlib.__version__


def _check_plugin(version: str | None) -> None:
  """Raises unless ``version`` (the installed plugin's, or None) is the jaxlib version."""
  if version == jaxlib.__version__:
    return
  got = "not installed" if version is None else f"{_PLUGIN} {version}"
  raise DonationError(
    message(
      "compiling for a GPU target needs the CUDA plugin at the jaxlib version",
      expected=f"{_PLUGIN} and jax-cuda12-pjrt {jaxlib.__version__}",
      got=got,
      fix=_INSTALL,
    )
  )


def _topology_string(num_devices: int) -> str:
  if num_devices <= 8:
    return f"1x1x{num_devices}"
  if num_devices % 8:
    raise DonationError(
      message(
        "a multi-host GPU topology needs whole hosts",
        expected="1 to 8 devices, or a multiple of 8",
        got=str(num_devices),
      )
    )
  return f"1x{num_devices // 8}x8"


@functools.cache
def gpu_topology(name: str, num_devices: int = 8):
  """Returns a compile-only topology of ``num_devices`` GPUs ``name`` (8 per host).

  Args:
    name: a name from ``gpu_names()``.
    num_devices: how many GPUs (1 to 8 on one host, or a multiple of 8).

  Returns:
    A ``jax.experimental.topologies.TopologyDescription``; its ``devices`` compile but never run.

  Raises:
    DonationError: unknown GPU, bad count, or the CUDA plugin is missing (the message says what
      to install).
  """
  from jax.experimental import topologies

  spec = gpu_spec(name)
  if not isinstance(num_devices, int) or num_devices < 1:
    raise DonationError(
      message("gpu_topology needs a device count", expected="a positive int", got=repr(num_devices))
    )
  topology = _topology_string(num_devices)
  _check_plugin(_plugin_version())
  try:
    return topologies.get_topology_desc(
      spec.name, "cuda", target_config=spec.text(), topology=topology
    )
  except NotImplementedError as e:  # the plugin found no CUDA libraries and did not register
    _raise_unregistered(e)


def _raise_unregistered(error: Exception):
  raise DonationError(
    message(
      "the CUDA plugin is installed but did not register with JAX (without jax_platforms it "
      "checks for CUDA libraries, and this machine has none)",
      got=str(error),
      fix='call jax.config.update("jax_platforms", "cpu") (or set JAX_PLATFORMS=cpu) before '
      "JAX starts its backends; compile-only GPU targets work with it",
    )
  ) from None


def gpu_mesh(
  name: str,
  num_devices: int = 8,
  axis_names: Sequence[str] = ("x",),
  *,
  shape: Sequence[int] | None = None,
) -> jax.sharding.Mesh:
  """Returns a mesh of ``num_devices`` compile-only GPUs ``name``, for ahead-of-time compiles.

  Args:
    name: a name from ``gpu_names()`` (``"h100"``, ``"b200"``).
    num_devices: how many GPUs.
    axis_names: the mesh axis names.
    shape: the mesh shape (default: all devices on the one axis); its product is ``num_devices``.

  Returns:
    A ``jax.sharding.Mesh`` whose devices report ``platform == "gpu"`` and the GPU's
    ``device_kind``. Shard ``jax.ShapeDtypeStruct`` arguments on it and compile with ``jax.jit``.

  Raises:
    DonationError: as ``gpu_topology``, or a shape that does not match the device count.

  >>> import donate
  >>> try:  # without the plugin: the error names what to install
  ...   kind = gpu_mesh("h100", 8, ("dp", "tp"), shape=(2, 4)).devices.flat[0].device_kind
  ... except donate.DonationError as e:
  ...   kind = "NVIDIA H100 80GB HBM3" if "gpu-aot" in str(e) else str(e)
  >>> kind
  'NVIDIA H100 80GB HBM3'
  """
  axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
  shape = (num_devices,) if shape is None and len(axis_names) == 1 else shape
  if shape is None or len(shape) != len(axis_names) or math.prod(shape) != num_devices:
    raise DonationError(
      message(
        "gpu_mesh needs one size per axis name, multiplying to the device count",
        expected=f"{len(axis_names)} sizes with product {num_devices}",
        got="no shape" if shape is None else repr(tuple(shape)),
      )
    )
  from jax.experimental import topologies

  return topologies.make_mesh(gpu_topology(name, num_devices), tuple(shape), axis_names)
