"""`python -m donate.profile [--out DIR] script.py [args...]`: profile every program a script
compiles, without editing it.

XLA writes the buffer assignment and live ranges of every module it compiles when `XLA_FLAGS`
holds `--xla_dump_to` (read when the first backend starts, so set before the script runs). The
script runs unchanged as `__main__` (`runpy`), with its own arguments, output and exit status; JAX's
persistent compilation cache is turned off for the run (a program read from it is not compiled,
so XLA would write nothing). When it ends, each dumped module is profiled as `memory_profile`
profiles a compile (`profiles`), a summary table goes to stderr (`summary`) and one HTML page per
program into `--out`.
"""

from __future__ import annotations

import glob
import html
import os
import re
import runpy
import sys
import traceback

from donate._base.text import format_bytes

_SUFFIX = "after_optimizations-buffer-assignment.txt"


def usage() -> str:
  return (
    "usage: python -m donate.profile [--out DIR] script.py [args...]\n"
    "       python -m donate.profile [--out DIR] -m package.module [args...]"
  )


def parse(argv: list[str]) -> tuple[str | None, str | None, str | None, list[str]]:
  """(out, script, module, script's argv) from the command line; (None, None, None, []) when it
  names no script.

  >>> parse(["--out", "d", "train.py", "--steps", "3"])
  ('d', 'train.py', None, ['train.py', '--steps', '3'])
  >>> parse(["-m", "pkg.train", "-x"])
  (None, None, 'pkg.train', ['pkg.train', '-x'])
  """
  out, k = None, 0
  while k < len(argv) and argv[k] in ("--out", "-o"):
    out, k = (argv[k + 1] if k + 1 < len(argv) else None), k + 2
  if k < len(argv) and argv[k].startswith("--out="):
    out, k = argv[k].split("=", 1)[1], k + 1
  if k >= len(argv):
    return None, None, None, []
  if argv[k] == "-m" and k + 1 < len(argv):
    return out, None, argv[k + 1], argv[k + 1 :]
  return out, argv[k], None, argv[k:]


_CACHE_HITS = "/jax/compilation_cache/cache_hits"
_cached: list[str] = []  # one entry per program JAX read from its persistent cache in this run


def dump_everything(folder: str) -> None:
  """Makes XLA dump every module it compiles into `folder` and turns JAX's persistent cache off
  (in this process, whose `jax` is imported already, so the environment variable alone comes too
  late, and in its children); a program read from the cache all the same (a script that turns it
  back on) is counted (`cached`)."""
  import jax

  flags = os.environ.get("XLA_FLAGS", "")
  os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={folder} --xla_dump_hlo_as_text".strip()
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  jax.config.update("jax_enable_compilation_cache", False)
  jax.monitoring.register_event_listener(_count_cache_hit)


def _count_cache_hit(event: str, **kwargs) -> None:
  if event == _CACHE_HITS:
    _cached.append(event)


def cached() -> int:
  """How many programs JAX read from its persistent compilation cache since `dump_everything`:
  they were not compiled, so XLA dumped nothing for them."""
  return len(_cached)


def run(script: str | None, module: str | None, argv: list[str]) -> int:
  """Runs the script as `__main__` with `argv`; its exit status (1 and its traceback on stderr
  when it raises)."""
  sys.argv = list(argv)
  try:
    if module is not None:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif script is not None:
      sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
      runpy.run_path(script, run_name="__main__")
  except SystemExit as e:
    code = e.code
    if code is None or isinstance(code, int):
      return code or 0
    print(code, file=sys.stderr)
    return 1
  except BaseException as e:  # the script's own traceback, as Python would print it
    tb = e.__traceback__
    while tb is not None and (
      tb.tb_frame.f_code.co_filename == __file__
      or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
      tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)
    return 1
  return 0


def profiles(folder: str) -> list:
  """A `MemoryProfile` of every module XLA dumped in `folder`, in compile order."""
  from donate._profile import reading
  from donate._profile.assemble import assemble
  from donate._xla import hlo as _hlo

  found = []
  for assignment in sorted(glob.glob(os.path.join(folder, f"*{_SUFFIX}"))):
    ranges = assignment[: -len("buffer-assignment.txt")] + "live-range.txt"
    if not os.path.exists(ranges):
      continue
    dump = reading.read_files(assignment, ranges)
    if dump.hlo_text is None:
      continue
    module = _hlo.parse_module(dump.hlo_text)
    name = module.name.removeprefix("jit_")
    found.append(assemble(dump, module, None, function=name, platform=dump.platform))
  return found


def summary(found: list, width: int = 100, cached: int = 0) -> str:
  """The table: program, peak, fits H100 / B200, the top categories at the peak; `cached`
  programs read from JAX's persistent compilation cache are counted, not profiled.

  >>> print(summary([], cached=2))
  donate.profile: 0 compiled programs
  2 programs read from JAX's persistent compilation cache: not compiled, not profiled
  program                            peak  H100 B200  top categories at the peak
  ------------------------------------------------------------------------------
  """
  head = f"{'program':<28} {'peak':>10}  {'H100':<4} {'B200':<4}  top categories at the peak"
  lines = [f"donate.profile: {len(found)} compiled programs"]
  if cached:
    lines.append(
      f"{cached} program{'s' if cached > 1 else ''} read from JAX's persistent compilation cache: "
      "not compiled, not profiled"
    )
  lines += [head, "-" * len(head)]
  for p in sorted(found, key=lambda p: -p.peak_bytes)[:30]:
    fits = ["yes" if p.fits(d) else "no" for d in ("h100", "b200")]
    name = p.function if len(p.function) <= 28 else p.function[:27] + "…"
    row = f"{name:<28} {format_bytes(p.peak_bytes):>10}  {fits[0]:<4} {fits[1]:<4}  "
    lines.append((row + _top(p, width - len(row)))[:width])
  if len(found) > 30:
    lines.append(f"({len(found) - 30} smaller programs)")
  return "\n".join(lines)


def _top(profile, room: int) -> str:
  """The largest categories at the peak (up to three) that fit whole in `room` characters (the
  first always)."""
  top = ""
  for g in profile.by_category()[:3]:
    part = f"{g.key} {format_bytes(g.total_bytes)}"
    if top and len(top) + 2 + len(part) > room:
      break
    top = f"{top}, {part}" if top else part
  return top


def write_pages(found: list, out: str) -> list[str]:
  """One HTML page per program in `out` (`NN_name.html`); their paths."""
  os.makedirs(out, exist_ok=True)
  paths = []
  for k, p in enumerate(found):
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", p.function)[:80]
    path = os.path.join(out, f"{k:03d}_{name}.html")
    with open(path, "w", encoding="utf-8") as fh:
      fh.write(
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(p.function)}</title>"
        f"{p._repr_html_()}<pre>{html.escape(str(p))}</pre>"
      )
    paths.append(path)
  return paths
