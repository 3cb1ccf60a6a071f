"""`python -m donate.profile [--out DIR] script.py [args...]` (or `-m package.module`): the memory
profile of every program a script compiles, without editing the script.

The script runs unchanged (its output, traceback and exit status are its own); XLA dumps the
buffer assignment of every program it compiles, and when the script ends a summary table
(program, peak, fits H100 / B200, top categories at the peak) goes to stderr and one HTML page
per program into `DIR` (default `donate-profile`). See `docs/memory_profile.md`.

>>> from donate import profile
>>> profile.main([])  # no script: the usage, status 2
2
"""

from __future__ import annotations

import shutil
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default `sys.argv[1:]`); returns the script's exit status.

  Args:
    argv: `[--out DIR] script.py [args...]` or `[--out DIR] -m package.module [args...]`.
  """
  from donate._profile import script

  out, path, module, script_argv = script.parse(list(sys.argv[1:] if argv is None else argv))
  if path is None and module is None:
    print(script.usage(), file=sys.stderr)
    return 2
  folder = tempfile.mkdtemp(prefix="donate-profile-dump-")
  try:
    script.dump_everything(folder)
    status = script.run(path, module, script_argv)
    sys.stdout.flush()
    found = script.profiles(folder)
    print(script.summary(found, cached=script.cached()), file=sys.stderr)
    pages = script.write_pages(found, out or "donate-profile")
    print(f"donate.profile: {len(pages)} pages in {out or 'donate-profile'}/", file=sys.stderr)
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  return status


if __name__ == "__main__":
  sys.exit(main())
