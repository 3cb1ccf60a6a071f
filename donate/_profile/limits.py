"""What JAX's allocator gives a program on a device, and whether a program fits in it.

A program never has the whole card. JAX's GPU client (jaxlib's `xla_client.
generate_pjrt_gpu_plugin_options`, jaxlib 0.10 and 0.12) reads, when the backend starts:

- `XLA_PYTHON_CLIENT_ALLOCATOR`: `"platform"` allocates each buffer from CUDA on demand (the
  whole card is the limit); `"default"`, `"bfc"`, `"cuda_async"` and `"vmm"` take a fraction;
- `XLA_CLIENT_MEM_FRACTION`, or the deprecated `XLA_PYTHON_CLIENT_MEM_FRACTION` (both set is an
  error JAX raises): that fraction, else XLA's default, 0.75 (`GpuAllocatorConfig`);
- `XLA_PYTHON_CLIENT_PREALLOCATE=false`: the pool grows on demand, up to the same limit (XLA's
  `CreateBFCAllocator` sizes it `total_memory * memory_fraction` either way: "will use up to").

`usable(device)` reads them as the installed JAX does (or takes an explicit fraction).
"""

from __future__ import annotations

import dataclasses
import os

from donate._base.text import format_bytes
from donate._xla.gpu_targets import SPECS

DEFAULT_FRACTION = 0.75  # XLA's GpuAllocatorConfig.memory_fraction
GIVEN = "the bytes given"


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
  """The bytes a program may use on a device, and why (`why`: which setting decided it)."""

  device: str
  card_bytes: int
  usable_bytes: int
  why: str

  def __str__(self) -> str:
    """ "59.3 GiB usable on an H100 at JAX's default 75%", or "1.0 GiB given"."""
    if self.why == GIVEN:
      return f"{format_bytes(self.usable_bytes)} given"
    usable = format_bytes(self.usable_bytes)
    return f"{usable} usable on {_article(self.device)} {self.device} {self.why}"


def usable(device, fraction: float | None = None, environ=None) -> Limit:
  """The bytes JAX's allocator gives a program on `device` (a GPU name or a byte count).

  Args:
    device: `"h100"`, `"b200"` (`donate.targets.gpu_names()`) or a byte count (taken as it is).
    fraction: the share of the card to use, instead of what the environment says.
    environ: the environment to read (default `os.environ`).

  Raises:
    KeyError: an unknown device.
    ValueError: both memory-fraction variables set (JAX's GPU client raises it too).

  >>> limit = usable("h100", environ={})
  >>> limit.usable_bytes == int(limit.card_bytes * 0.75), limit.why
  (True, "at JAX's default 75%")
  >>> usable("h100", environ={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}).why
  'the whole card (XLA_PYTHON_CLIENT_ALLOCATOR=platform)'
  """
  env = os.environ if environ is None else environ
  if isinstance(device, int) and not isinstance(device, bool) and device > 0:
    return Limit(format_bytes(device), device, device, GIVEN)
  spec = SPECS.get(str(device).lower())
  if spec is None:
    raise KeyError(device)
  card = spec.device_memory_bytes
  if fraction is not None:
    return Limit(
      spec.name.upper(), card, int(card * fraction), f"at the fraction given, {fraction:.0%}"
    )
  if env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower() == "platform":
    return Limit(
      spec.name.upper(), card, card, "the whole card (XLA_PYTHON_CLIENT_ALLOCATOR=platform)"
    )
  new, old = env.get("XLA_CLIENT_MEM_FRACTION", ""), env.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
  if new and old:
    raise ValueError("XLA_CLIENT_MEM_FRACTION is set together with XLA_PYTHON_CLIENT_MEM_FRACTION")
  name = "XLA_CLIENT_MEM_FRACTION" if new else "XLA_PYTHON_CLIENT_MEM_FRACTION"
  grows = env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "") in ("false", "False", "0")
  pool = ", grown on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false)" if grows else ""
  if new or old:
    share = float(new or old)
    return Limit(spec.name.upper(), card, int(card * share), f"at {name}={new or old}{pool}")
  return Limit(spec.name.upper(), card, int(card * DEFAULT_FRACTION), f"at JAX's default 75%{pool}")


def _article(name: str) -> str:
  return "an" if name[:1].lower() in "aefhilmnorsx" else "a"


@dataclasses.dataclass(frozen=True, slots=True)
class Fit:
  """Whether a program's memory fits what JAX's allocator gives it on a device; truthy when it
  does.

  `needed_bytes` is what the program holds on the device while it runs (arguments + outputs -
  aliased + temporaries + constants); `usable_bytes` what the allocator gives a program there
  (`why` says which setting decided it); `capacity_bytes` the whole card; `headroom_bytes` is
  usable minus needed (negative: missing).
  """

  device: str
  capacity_bytes: int
  needed_bytes: int
  usable_bytes: int = -1  # -1: the whole card
  why: str = "the whole card"

  def __post_init__(self):
    if self.usable_bytes < 0:
      object.__setattr__(self, "usable_bytes", self.capacity_bytes)

  @property
  def headroom_bytes(self) -> int:
    """The usable bytes left when the program runs (negative: missing)."""
    return self.usable_bytes - self.needed_bytes

  def __bool__(self) -> bool:
    return self.needed_bytes <= self.usable_bytes

  def __str__(self) -> str:
    verdict = "fits" if self else "does not fit"
    if self.why == GIVEN:
      where, usable = f"in {format_bytes(self.usable_bytes)}", "the bytes given"
    else:
      where = f"{_article(self.device)} {self.device}"
      usable = f"{format_bytes(self.usable_bytes)} usable {self.why}"
    return (
      f"{verdict} {where}: needs {format_bytes(self.needed_bytes)} of {usable} "
      f"(headroom {format_bytes(self.headroom_bytes)})"
    )

  @property
  def capacity(self) -> int:
    """The old name of `capacity_bytes`."""
    return self.capacity_bytes

  @property
  def needed(self) -> int:
    """The old name of `needed_bytes`."""
    return self.needed_bytes

  @property
  def headroom(self) -> int:
    """The old name of `headroom_bytes`."""
    return self.headroom_bytes


def fit(needed_bytes: int, device, fraction: float | None = None, environ=None) -> Fit:
  """`Fit` of `needed_bytes` on `device` (see `usable`).

  >>> str(fit(50 << 30, "h100", environ={}))
  "fits an H100: needs 50.0 GiB of 59.3 GiB usable at JAX's default 75% (headroom 9.3 GiB)"
  """
  limit = usable(device, fraction, environ)
  return Fit(limit.device, limit.card_bytes, needed_bytes, limit.usable_bytes, limit.why)
