"""`python -m donate.profile [options] script.py [args...]` (or `-m package.module`): the memory
report of every program a script compiles, without editing the script.

The script runs unchanged (its output, traceback and exit status are its own); XLA dumps the
buffer assignment of every program it compiles, and when the script ends a summary with a
verdict per program (largest peak first, trivial programs folded) goes to stderr, and
`index.html`, one page and one JSON per program into `--out` (default `donate-profile`).
`--device h100` says whether each fits, `--advice` measures the remedies (one compile each),
`--fit DEVICE` what to change for the largest program to fit, `--compare DIR` what grew against
an earlier run's folder. `python -m donate.profile --help` lists them. See
`docs/memory_profile.md`.

>>> from donate import profile
>>> profile.main([])  # no script: the usage, status 2
2
"""

from __future__ import annotations

import shutil
import sys
import tempfile


def _parse(argv: list[str]):
  """The parsed options, or the exit status argparse gave (`--help`: 0, a bad option: 2)."""
  from donate._profile import script

  try:
    options = script.parser().parse_args(argv)
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else 2
  if options.module is not None and not options.module:
    print("donate.profile: -m needs a module name", file=sys.stderr)
    return 2
  return options


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default `sys.argv[1:]`); returns the script's exit status
  (2 with one line on stderr, and nothing written, when the script or module is missing).

  Args:
    argv: `[options] script.py [args...]` or `[options] -m package.module [args...]`.
  """
  from donate._profile import record, script

  options = _parse(list(sys.argv[1:] if argv is None else argv))
  if isinstance(options, int):
    return options
  module = options.module[0] if options.module else None
  path = None if module is not None else options.script
  if path is None and module is None:
    print(script.parser().format_usage().rstrip(), file=sys.stderr)
    return 2
  if options.device is not None and _bad_device(options.device):
    return 2
  missing = script.missing(path, module)
  if missing is not None:
    print(missing, file=sys.stderr)
    return 2
  argv_of_script = list(options.module) if module is not None else [path, *options.args]
  folder = tempfile.mkdtemp(prefix="donate-profile-dump-")
  try:
    script.dump_everything(folder)
    record.install()
    status = script.run(path, module, argv_of_script)
    sys.stdout.flush()
    script.report(script.profiles(folder), options)
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  return status


def _bad_device(device: str) -> bool:
  from donate._profile import limits

  try:
    limits.usable(int(device) if device.isdigit() else device)
  except (KeyError, ValueError):
    print(f"donate.profile: --device {device!r}: give h100, b200 or a byte count", file=sys.stderr)
    return True
  return False


if __name__ == "__main__":
  sys.exit(main())
