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

import argparse
import glob
import importlib.util
import os
import runpy
import sys
import traceback

_SUFFIX = "after_optimizations-buffer-assignment.txt"


DEVICES = "h100, b200 or a byte count"


def parser() -> argparse.ArgumentParser:
  """The command line of `python -m donate.profile`.

  >>> a = parser().parse_args(["--device", "h100", "--top", "3", "train.py", "--steps", "3"])
  >>> a.script, a.args, a.device, a.top, a.module
  ('train.py', ['--steps', '3'], 'h100', 3, None)
  >>> parser().parse_args(["-m", "pkg.train", "-x"]).module
  ['pkg.train', '-x']
  """
  p = argparse.ArgumentParser(
    prog="python -m donate.profile",
    usage="python -m donate.profile [options] (script.py | -m package.module) [args ...]",
    description="Runs a script unchanged and reports the memory of every program it compiles: "
    "a summary with a verdict on stderr, an index page and one page per program in --out.",
  )
  p.add_argument(
    "--out",
    metavar="DIR",
    default="donate-profile",
    help="where the pages and their JSON go (default: donate-profile)",
  )
  p.add_argument("--device", metavar="DEVICE", help=f"say whether each program fits: {DEVICES}")
  p.add_argument(
    "--advice",
    action="store_true",
    help="measure what would lower each shown "
    "program's peak: one compile per remedy (the count is printed first)",
  )
  p.add_argument(
    "--fit",
    metavar="DEVICE",
    help=f"what to change for the top program to fit {DEVICES} (profile.fit)",
  )
  p.add_argument("--compare", metavar="DIR", help="what grew against an earlier run's --out")
  p.add_argument("--top", metavar="N", type=int, default=10, help="programs shown (default 10)")
  p.add_argument(
    "--min-share",
    metavar="FRACTION",
    type=float,
    default=0.01,
    help="programs whose peak is under this share of the largest are folded (default 0.01)",
  )
  p.add_argument(
    "-m",
    dest="module",
    nargs=argparse.REMAINDER,
    metavar="package.module ...",
    help="run a module as python -m does",
  )
  p.add_argument("script", nargs="?", help="the script to run, as python runs it")
  p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
  return p


def missing(script: str | None, module: str | None) -> str | None:
  """The one line that says the script or module to run is not there, else None (looks, imports
  nothing but a dotted module's parent packages)."""
  if module is not None:
    try:
      found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
      found = None
    return None if found is not None else f"donate.profile: no module named {module!r}"
  if script is not None and not os.path.isfile(script):
    return f"donate.profile: no script {script!r} (from {os.getcwd()})"
  return None


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


def _advice(found: list, shown: list) -> dict:
  """Measured advice per program shown (by position in `found`), from the call `record` noted;
  what was measured and what was not goes to stderr first."""
  from donate._profile import record

  out, unmeasured = {}, []
  position = {id(p): k for k, p in enumerate(found)}
  print(
    f"donate.profile: --advice: measuring the remedies of {len(shown)} programs: per program, one "
    "compile to profile its call again, then one per remedy",
    file=sys.stderr,
  )
  for p in shown:
    like = record.profile_like(p)
    if like is None:
      unmeasured.append(p.function)
      continue
    out[position[id(p)]] = like.advice()
    compiles = sum(1 for a in out[position[id(p)]] if a.peak_bytes is not None)
    print(
      f"donate.profile: {p.function}: {compiles + 1} compiles measured its remedies",
      file=sys.stderr,
    )
  if unmeasured:
    print(
      f"donate.profile: remedies not measured for {', '.join(dict.fromkeys(unmeasured))}: "
      "no jitted call of the script made them (an operation run eagerly, or a call that does "
      "not trace again alone)",
      file=sys.stderr,
    )
  return out


def _fit(found: list, shown: list, device) -> dict:
  """`profile.fit(device)` of the largest program (from the noted call where there is one)."""
  from donate._profile import record

  if not shown:
    return {}
  p = shown[0]
  like = record.profile_like(p) or p
  fit = like.fit(device)
  print(f"donate.profile: {p.function}: {fit}", file=sys.stderr)
  return {found.index(p): fit}


def report(found: list, options) -> str:
  """Prints the summary (and the comparison with `--compare`) to stderr and writes the pages;
  the index page's path."""
  from donate._profile import pages, record
  from donate._profile import report as _report

  names = record.names()
  found = [record.rename(p, names) for p in found]
  device = _device(options.device)
  shown, _ = _report.ranked(found, options.top, options.min_share)
  advice = _advice(found, shown) if options.advice else None
  fits = _fit(found, shown, _device(options.fit)) if options.fit else None
  print(
    _report.summary(found, device, advice, options.top, options.min_share, cached=cached()),
    file=sys.stderr,
  )
  compared = ""
  if options.compare:
    if os.path.isdir(options.compare):
      compared = _report.compare(
        [_report.record(p) for p in found], _report.load(options.compare), options.top
      )
    else:
      compared = f"donate.profile: --compare {options.compare!r}: no such folder"
    print(compared, file=sys.stderr)
  index = pages.write(
    found, options.out, device, advice, fits, options.top, options.min_share, compared
  )
  print(f"donate.profile: {index} ({len(found)} program pages beside it)", file=sys.stderr)
  return index


def _device(device: str | None):
  return int(device) if device is not None and device.isdigit() else device
