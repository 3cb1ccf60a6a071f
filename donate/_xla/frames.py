"""The user's own frame of an HLO instruction's stack: JAX records the whole Python stack of each
instruction (HLO's `StackFrames` table: a location and the caller's frame), innermost first, with
JAX's own frames left out; its innermost frame is often a framework's (`flax/linen/linear.py`)
where the user's line is the call site in their model, further out.

>>> locations = {1: "/usr/lib/python3/site-packages/flax/linen/linear.py:287 (__call__)",
...              2: "/home/me/gpt.py:31 (__call__)"}
>>> user_frames({1: "{file_location_id=1 parent_frame_id=3}",
...              2: "{file_location_id=2 parent_frame_id=1}"}, locations)
{1: 2, 2: 2}

XLA prints a frame's `parent_frame_id` one past the table's id of its caller (0, printed 1, is no
caller): above, frame 1's caller is frame 2, the outermost. The library's line, shown second, is
the innermost frame where that is an installed package's (`library_frames`, `package_line`):

>>> library_frames({1: "{file_location_id=1 parent_frame_id=3}",
...                 2: "{file_location_id=2 parent_frame_id=1}"}, locations)
{1: 1}
>>> package_line(locations[1])
'flax/linen/linear.py:287'
"""

from __future__ import annotations

import re
import sysconfig

_FIELD = re.compile(r"(\w+)=(\d+)")
_DEPTH = 64
_STDLIB = sysconfig.get_paths()["stdlib"]


def is_library(where: str) -> bool:
  """Whether a `file:line` is in an installed package or Python's standard library (a frozen
  module's too: `<frozen runpy>`, under `python -m`).

  >>> is_library("<frozen runpy>:88"), is_library("/home/me/gpt.py:31"), is_library("In[2]:17")
  (True, False, False)
  """
  path = where.rsplit(":", 1)[0]
  return (
    "site-packages/" in path or "dist-packages/" in path or path.startswith((_STDLIB, "<frozen "))
  )


def package_line(where: str) -> str:
  """A library's `file:line` from its package on (`flax/linen/linear.py:287`), the function
  left out; the standard library's from its folder on.

  >>> package_line("<frozen runpy>:88 (_run_code)")
  '<frozen runpy>:88'
  """
  where = where.partition(" (")[0]
  for folder in ("site-packages/", "dist-packages/", _STDLIB.rstrip("/") + "/"):
    if folder in where:
      return where.rsplit(folder, 1)[1]
  return where


def shown(where: str | None) -> str | None:
  """`where` as a report shows it: a library's line from its package on (`package_line`), any
  other line as it is.

  >>> shown("/usr/lib/python3/site-packages/flax/nnx/nn/linear.py:422"), shown("In[6]:33")
  ('flax/nnx/nn/linear.py:422', 'In[6]:33')
  """
  return package_line(where) if where and is_library(where) else where


def short(where: str | None) -> str | None:
  """`where` as a label: a library's line from its package on, any other file's by its name.

  >>> short("/home/me/src/gpt.py:24"), short("/x/site-packages/flax/linen/linear.py:287")
  ('gpt.py:24', 'flax/linen/linear.py:287')
  """
  if not where or is_library(where):
    return shown(where)
  path, sep, line = where.partition(" (")[0].rpartition(":")
  return f"{path.rsplit('/', 1)[-1]}:{line}" if sep and path else where


def library_frames(frames: dict[int, str], locations: dict[int, str]) -> dict[int, int]:
  """For each frame id of HLO's `StackFrames` table whose own (innermost) location is in an
  installed package, that location: the library's line, beside the user's (`user_frames`)."""
  found = {}
  for k, text in frames.items():
    own = dict(_FIELD.findall(text)).get("file_location_id")
    if own is not None and is_library(locations.get(int(own), "")):
      found[k] = int(own)
  return found


def user_frames(frames: dict[int, str], locations: dict[int, str]) -> dict[int, int]:
  """For each frame id of HLO's `StackFrames` table (`{file_location_id=L parent_frame_id=P}`),
  the location of its first frame outside installed packages (walking to the callers, each
  printed one past its id), else its own location."""
  fields = {k: {a: int(b) for a, b in _FIELD.findall(text)} for k, text in frames.items()}
  found = {}
  for k, f in fields.items():
    own, frame = f.get("file_location_id", -1), k
    for _ in range(_DEPTH):
      f2 = fields.get(frame)
      if f2 is None:
        break
      loc = f2.get("file_location_id", -1)
      if not is_library(locations.get(loc, "")):
        own = loc
        break
      parent = f2.get("parent_frame_id", 0) - 1
      if parent <= 0 or parent == frame:
        break
      frame = parent
    found[k] = own
  return found
