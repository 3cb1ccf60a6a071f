"""Starting JAX quietly where the CUDA plugin has nothing to say: no NVIDIA GPU on the machine.

The ``gpu-aot`` extra installs JAX's CUDA plugin (``jax-cuda12-plugin``, the kernels, and
``jax-cuda12-pjrt``) so H100 and B200 programs compile on any machine. On a machine without an
NVIDIA GPU it has nothing to run, yet it speaks twice:

* at ``import jax``, jaxlib loads the plugin's solver, PRNG and linalg kernels; each carries its own
  copy of XLA's CUDA runtime stub and its own absl logging, and registering its GPU code looks for
  ``libcudart`` and logs, at INFO and before any ``absl::InitializeLog()``, to file descriptor 2:
  "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR" and
  "I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used."
  (three times). No environment variable reaches those copies of absl (``TF_CPP_MIN_LOG_LEVEL``,
  ``ABSL_MIN_LOG_LEVEL``, ``GLOG_minloglevel`` and ``JAX_PLATFORMS=cpu`` leave them as they are).
* when JAX starts its backends, it loads the PJRT plugin's library, whose own stub logs the same
  line once more; and without ``jax_platforms`` the plugin checks the CUDA libraries, finds none
  and logs "Jax plugin configuration error" with a traceback; it then stays unregistered, and
  compile-only GPU targets fail.

``import_jax()`` imports JAX, and loads the PJRT plugin's library as JAX will, with file
descriptor 2 read through a pipe meanwhile: a thread forwards every line as it comes, in order,
except exactly those start-up lines; and it sets ``JAX_SKIP_CUDA_CONSTRAINTS_CHECK`` (JAX's own
switch for that check) unless already set. It
does either only on a machine where JAX itself sees no NVIDIA GPU (the device files JAX's
``hardware_utils.has_visible_nvidia_gpu`` looks for): there JAX never starts its CUDA backend, so
nothing true about a GPU is hidden; with a GPU, everything prints as JAX prints it.

donate's commands (``python -m donate``, ``python -m donate.profile``) and the test session start
JAX this way; ``import donate`` in a user's program changes nothing. Standard library only: this
runs before JAX is imported.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading

# The device files JAX's `hardware_utils.has_visible_nvidia_gpu` looks for (the GPU, the control
# device of Docker and Kubernetes, WSL2's): JAX starts its CUDA backend only when one exists.
NVIDIA_DEVICES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
# The CUDA plugin's kernels (as jaxlib.plugin_support names them) and its PJRT plugin.
PLUGIN_MODULES = (
  "jax_cuda12_plugin",
  "jax_cuda13_plugin",
  "jax_plugins.xla_cuda12",
  "jax_plugins.xla_cuda13",
)
SKIP_CHECK = "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"

# The start-up lines dropped, whole lines only: absl's notice, kept unless a stub line follows it.
ABSL_NOTICE = (
  b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
)
STUB_LINE = re.compile(
  rb"I\d{4} [\d:. ]+\d+ cudart_stub\.cc:\d+\] "
  rb"Could not find cuda drivers on your machine, GPU will not be used\.\r?\n"
)


def quiet_here() -> bool:
  """True on a machine without an NVIDIA GPU where JAX's CUDA plugin is installed."""
  if any(os.path.exists(device) for device in NVIDIA_DEVICES):
    return False
  return any(_installed(name) for name in PLUGIN_MODULES)


def _installed(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def started_as_command() -> bool:
  """True while `python -m donate...` locates its module (the only time `sys.argv[0]` is "-m")."""
  if sys.argv[:1] != ["-m"]:
    return False
  args = list(getattr(sys, "orig_argv", ()))[1:]
  for i, arg in enumerate(args):
    if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
      module = arg[2:] or (args[i + 1] if i + 1 < len(args) else "")
      return module == "donate" or module.startswith("donate.")
  return False


def import_jax() -> None:
  """Imports JAX; on a machine where `quiet_here()`, without the CUDA plugin's start-up lines."""
  if "jax" in sys.modules or not quiet_here():
    import jax  # noqa: F401

    return
  os.environ.setdefault(SKIP_CHECK, "1")
  with FilteredStderr():
    import jax  # noqa: F401

    _load_pjrt_plugin()


def _load_pjrt_plugin() -> None:
  """Loads the PJRT plugin's library, which JAX loads at every backend start where the plugin is
  installed (jax_platforms="cpu" too): its CUDA runtime stub logs the same line when it loads.
  Loaded once, here, the line falls in the filtered window; JAX's later load finds it loaded."""
  import ctypes

  for name in PLUGIN_MODULES:
    try:
      spec = importlib.util.find_spec(name) if name.startswith("jax_plugins.") else None
    except (ImportError, ValueError):
      continue
    for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
      library = os.path.join(folder, "xla_cuda_plugin.so")
      if os.path.exists(library):
        try:
          ctypes.CDLL(library)
        except OSError:
          pass


class FilteredStderr:
  """File descriptor 2 read through a pipe while the block runs: a thread forwards each line as it
  arrives, in order, to the real stderr, except the CUDA runtime stub's start-up lines (a partial
  last line is forwarded at the end). Does nothing when file descriptor 2 cannot be duplicated."""

  def __init__(self):
    self._saved: int | None = None
    self._thread: threading.Thread | None = None

  def __enter__(self):
    try:
      if sys.stderr is not None:
        sys.stderr.flush()
      saved = os.dup(2)
    except (OSError, ValueError):
      return self
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    self._saved = saved
    self._thread = threading.Thread(
      target=_forward, args=(read, saved), name="donate-stderr", daemon=True
    )
    self._thread.start()
    return self

  def __exit__(self, *exc):
    if self._saved is None or self._thread is None:
      return False
    try:
      if sys.stderr is not None:
        sys.stderr.flush()
    except (OSError, ValueError):
      pass
    os.dup2(self._saved, 2)  # the pipe's last writer closes: the thread reads to its end
    self._thread.join(timeout=10)
    if not self._thread.is_alive():
      os.close(self._saved)
    return False


def _forward(read: int, write: int) -> None:
  """Copies `read` to `write` by lines, but the stub's lines (and absl's notice just before one)."""
  pending = b""
  notice = b""  # absl's notice, held until the next line says whether it came with a stub line
  try:
    while chunk := os.read(read, 65536):
      *lines, pending = (pending + chunk).split(b"\n")
      kept = []
      for line in lines:
        line += b"\n"
        if STUB_LINE.fullmatch(line):
          notice = b""
          continue
        kept.append(notice)
        notice = b""
        if line == ABSL_NOTICE:
          notice = line
        else:
          kept.append(line)
      _write(write, b"".join(kept))
    _write(write, notice + pending)
  finally:
    os.close(read)


def _write(fd: int, data: bytes) -> None:
  while data:
    try:
      data = data[os.write(fd, data) :]
    except OSError:
      return


if started_as_command():  # imported first by donate/__init__.py, before anything imports JAX
  import_jax()
