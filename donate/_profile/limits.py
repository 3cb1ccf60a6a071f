"""What JAX's allocator gives a program on a device, and whether a program fits in it.

A program never has the whole card. JAX's GPU client (jaxlib's `xla_client.
generate_pjrt_gpu_plugin_options`, jaxlib 0.10 and 0.12) reads, when the backend starts:

- `XLA_PYTHON_CLIENT_ALLOCATOR`: `"platform"` allocates each buffer from CUDA on demand (the
  whole card is the limit); `"default"`, `"bfc"`, `"cuda_async"` and `"vmm"` take a fraction;
- `XLA_CLIENT_MEM_FRACTION`, or the deprecated `XLA_PYTHON_CLIENT_MEM_FRACTION` (both set is an
  error JAX raises): that fraction, else XLA's default, 0.75 (`GpuAllocatorConfig`);
- `XLA_PYTHON_CLIENT_PREALLOCATE=false`: the pool grows on demand, up to the same limit (XLA's
  `CreateBFCAllocator` sizes it `total_memory * memory_fraction` either way: "will use up to").

`usable(device)` reads them as the installed JAX does (or takes an explicit fraction). Both
jaxlibs pass the fraction as a number (`memory_fraction`), which XLA takes as a fixed cap: the
"0.75+" policy of jaxlib 0.12's GPU plugin (preallocate 75%, let ordinary buffers grow to the whole
card: its `memory_fraction_policy` option, `xla/pjrt/gpu/allocator_config.h`) is not reachable
from JAX's environment variables, so it is not a limit here.

Collective memory (memory space 1: the NCCL user and symmetric buffers XLA colors
`kCollective`) has a region of its own (`collective(device)`), as XLA's GPU client
(`xla/pjrt/gpu/se_gpu_pjrt_client.cc`, `gpu_helpers.cc`: `CreateCollectiveBFCAllocator`, in the
CUDA plugins of jaxlib 0.10.2 and 0.12) builds it:

- `XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB` (jaxlib's `collective_memory_size`, in MiB):
  preallocated, that size;
- else it grows on demand up to `total_memory * (1 - memory_fraction)`: the 25% JAX leaves;
- `XLA_PYTHON_CLIENT_ALLOCATOR=platform`: no collective allocator ("Collective memory will not
  be allocated"); collective buffers come from CUDA like the rest, up to the whole card;
- jaxlib 0.12 with `--xla_gpu_enable_allocator_spatial_partitioning` (on by default: its
  XLA's dumped `compile_options.textproto` lists it `true` with no flag given; off with
  `=false` in XLA_FLAGS) and a preallocated BFC pool: one pool serves both, default buffers from
  its low end and collective ones from its high end, so collective bytes count against the usable
  limit with the rest (the flag does not exist in jaxlib 0.10.2).

`fit(..., collective_bytes=...)` checks a program's collective-memory peak against that region
and its other bytes against the usable limit, and says which limits it used.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax

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


SPATIAL_FLAG = "xla_gpu_enable_allocator_spatial_partitioning"


@dataclasses.dataclass(frozen=True, slots=True)
class Region:
  """Where collective memory comes from on a device: a region of its own of `usable_bytes`, or
  (`shared`) the pool of the usable limit, counted with the other buffers; `why` says which
  setting decided it."""

  usable_bytes: int
  shared: bool
  why: str


def _xla_flag(env, name: str) -> str | None:
  """The value of `--name` in `XLA_FLAGS` (the last one given; "true" for a bare flag)."""
  found = re.findall(rf"--{name}(?:=(\S*))?(?:\s|$)", env.get("XLA_FLAGS", ""))
  return (found[-1] or "true") if found else None


def collective(device, fraction: float | None = None, environ=None, version=None) -> Region:
  """The region collective memory has on `device` (see the module docstring), for the installed
  JAX (`version`: `(major, minor)` to read another's policy).

  >>> h100 = usable("h100", environ={}).card_bytes
  >>> r = collective("h100", environ={}, version=(0, 10))
  >>> r.shared, r.usable_bytes == h100 - usable("h100", environ={}).usable_bytes, r.why
  (False, True, 'its own, grown on demand up to the 25% of the card JAX leaves')
  """
  env = os.environ if environ is None else environ
  limit = usable(device, fraction, env)
  if limit.why == GIVEN:
    return Region(limit.usable_bytes, True, "counted with the bytes given")
  allocator = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
  if allocator == "platform":
    why = "from CUDA like the rest, up to the whole card (no collective allocator under "
    return Region(limit.card_bytes, True, why + "XLA_PYTHON_CLIENT_ALLOCATOR=platform)")
  version = tuple(jax.__version_info__[:2]) if version is None else tuple(version)
  preallocate = env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "") not in ("false", "False", "0")
  spatial = _xla_flag(env, SPATIAL_FLAG) or "true"  # XLA's default in jaxlib 0.12
  if (
    version >= (0, 12)
    and allocator in ("default", "bfc")
    and preallocate
    and spatial.lower() not in ("false", "0")
  ):
    return Region(limit.usable_bytes, True, f"one pool with the other buffers (--{SPATIAL_FLAG})")
  size = env.get("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "")
  if size:
    why = f"its own, preallocated (XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB={size})"
    return Region(int(size) << 20, False, why)
  left = limit.card_bytes - limit.usable_bytes
  share = f"{left / limit.card_bytes:.0%}"
  return Region(left, False, f"its own, grown on demand up to the {share} of the card JAX leaves")


def _article(name: str) -> str:
  return "an" if name[:1].lower() in "aefhilmnorsx" else "a"


@dataclasses.dataclass(frozen=True, slots=True)
class Fit:
  """Whether a program's memory fits what JAX's allocator gives it on a device; truthy when it
  does.

  `needed_bytes` is what the program holds on the device while it runs (arguments + outputs -
  aliased + temporaries + constants); `usable_bytes` what the allocator gives a program there
  (`why` says which setting decided it); `capacity_bytes` the whole card; `headroom_bytes` is
  usable minus needed (negative: missing). `collective_bytes` is the program's collective-memory
  peak: checked against its own region (`collective_usable_bytes`, `collective_why`) and then
  not part of `needed_bytes`, or counted in `needed_bytes` where it shares the pool
  (`collective_usable_bytes` -1).
  """

  device: str
  capacity_bytes: int
  needed_bytes: int
  usable_bytes: int = -1  # -1: the whole card
  why: str = "the whole card"
  collective_bytes: int = 0  # the program's collective-memory peak
  collective_usable_bytes: int = -1  # its own region; -1: counted in `needed_bytes`
  collective_why: str = ""

  def __post_init__(self):
    if self.usable_bytes < 0:
      object.__setattr__(self, "usable_bytes", self.capacity_bytes)

  @property
  def headroom_bytes(self) -> int:
    """The usable bytes left when the program runs (negative: missing)."""
    return self.usable_bytes - self.needed_bytes

  @property
  def collective_fits(self) -> bool:
    """Whether the collective-memory peak fits its region (True where it shares the pool)."""
    return self.collective_usable_bytes < 0 or self.collective_bytes <= self.collective_usable_bytes

  def __bool__(self) -> bool:
    return self.needed_bytes <= self.usable_bytes and self.collective_fits

  def __str__(self) -> str:
    verdict = "fits" if self else "does not fit"
    if self.why == GIVEN:
      where, usable = f"in {format_bytes(self.usable_bytes)}", "the bytes given"
    else:
      where = f"{_article(self.device)} {self.device}"
      usable = f"{format_bytes(self.usable_bytes)} usable {self.why}"
    text = (
      f"{verdict} {where}: needs {format_bytes(self.needed_bytes)} of {usable} "
      f"(headroom {format_bytes(self.headroom_bytes)})"
    )
    if not self.collective_bytes:
      return text
    held = format_bytes(self.collective_bytes)
    if self.collective_usable_bytes < 0:
      return f"{text}; collective memory {held}, counted with it: {self.collective_why}"
    region = format_bytes(self.collective_usable_bytes)
    verdict = "fits" if self.collective_fits else "does not fit"
    return (
      f"{text}; collective memory {held} {verdict} its region of {region}: {self.collective_why}"
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


def fit(
  needed_bytes: int,
  device,
  fraction: float | None = None,
  environ=None,
  collective_bytes: int = 0,
  version=None,
) -> Fit:
  """`Fit` of `needed_bytes` on `device` (see `usable`), of which `collective_bytes` are in
  collective memory (checked against its region, `collective`, for JAX `version`).

  >>> str(fit(50 << 30, "h100", environ={}))
  "fits an H100: needs 50.0 GiB of 59.3 GiB usable at JAX's default 75% (headroom 9.3 GiB)"
  >>> env = {"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "512"}
  >>> f = fit(50 << 30, "h100", environ=env, collective_bytes=1 << 30, version=(0, 10))
  >>> bool(f), f.needed_bytes == 49 << 30, f.collective_usable_bytes == 512 << 20
  (False, True, True)
  """
  limit = usable(device, fraction, environ)
  args = (limit.device, limit.card_bytes, needed_bytes, limit.usable_bytes, limit.why)
  if not collective_bytes:
    return Fit(*args)
  region = collective(device, fraction, environ, version)
  if region.shared:
    return Fit(*args, collective_bytes, -1, region.why)
  own = (limit.device, limit.card_bytes, needed_bytes - collective_bytes, *args[3:])
  return Fit(*own, collective_bytes, region.usable_bytes, region.why)
