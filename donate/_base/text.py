"""Text shared by every report (plans, copy records, the demo, the planner): sizes in bytes,
shapes, dtypes and shardings, and source lines in a notebook's cells."""

from __future__ import annotations

import numbers
import re
import sys


def is_symbolic(n) -> bool:
  """Whether a dimension, size or byte count is an expression of dimension variables
  (`jax.export.symbolic_shape`) rather than a number.

  >>> import jax
  >>> b, = jax.export.symbolic_shape("b")
  >>> is_symbolic(4 * b), is_symbolic(16)
  (True, False)
  """
  return not isinstance(n, numbers.Integral)


def format_bytes(n) -> str:
  """`n` bytes in the largest binary unit it reaches, one decimal.

  A symbolic count (an expression of `jax.export.symbolic_shape` dimensions) is shown as that
  expression, in parentheses when it is a sum.

  >>> format_bytes(512), format_bytes(65536), format_bytes(3 << 29), format_bytes(-(1 << 20))
  ('512 B', '64.0 KiB', '1.5 GiB', '-1.0 MiB')
  >>> import jax
  >>> a, b = jax.export.symbolic_shape("a, b")
  >>> format_bytes(4 * a * b), format_bytes(4 * b + 16)
  ('4*a*b B', '(4*b + 16) B')
  """
  if is_symbolic(n):
    text = str(n)
    return f"({text}) B" if " " in text else f"{text} B"
  for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if abs(n) >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"


def shape_text(shape) -> str:
  return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def sharding_text(sharding) -> str:
  return sharding_str(sharding) if sharding is not None else "unknown"


def dtype_name(dtype) -> str:
  """`str(dtype)`, remembered: numpy spells a dtype slowly, and a wide pytree asks thousands of
  times for the same few.

  >>> import numpy as np
  >>> dtype_name(np.dtype("float32")), dtype_name(np.dtype("float32"))
  ('float32', 'float32')
  """
  try:
    return _DTYPE_NAMES[dtype]
  except KeyError:
    name = _DTYPE_NAMES[dtype] = str(dtype)
    return name
  except TypeError:  # not hashable
    return str(dtype)


_DTYPE_NAMES: dict = {}


def sharding_str(sharding) -> str:
  """A compact name for a sharding: `cpu:0`, `P('x', None)`, `host` (remembered per sharding:
  every leaf of a wide pytree usually has one of a few).

  >>> import jax
  >>> sharding_str(jax.sharding.make_single_device_sharding(jax.devices()[0]))
  'cpu:0'
  """
  if sharding is None:
    return "host"
  global _LAST_SHARDING
  last = _LAST_SHARDING  # one (sharding, text) pair, replaced whole: safe across threads
  if last[0] is sharding:  # the leaves of one pytree usually share one sharding object
    return last[1]
  try:
    text = _SHARDING_NAMES[sharding]
    _LAST_SHARDING = (sharding, text)
    return text
  except (KeyError, TypeError):
    pass
  text = _sharding_str(sharding)
  try:
    if len(_SHARDING_NAMES) > 4096:
      _SHARDING_NAMES.clear()
    _SHARDING_NAMES[sharding] = text
  except TypeError:  # not hashable
    pass
  return text


_SHARDING_NAMES: dict = {}
_LAST_SHARDING: tuple = (None, "")


def _sharding_str(sharding) -> str:
  spec = getattr(sharding, "spec", None)
  if spec is not None:  # str() spells unreduced / reduced axes too
    text = str(spec)
    text = "P" + text[len("PartitionSpec") :] if text.startswith("PartitionSpec") else text
    text = text[:-2] + ")" if text.endswith(",)") else text  # P('x',) reads P('x')
  else:
    try:
      devices = sharding.device_set
    except Exception:  # an abstract mesh has no devices
      devices = None
    if devices is not None and len(devices) == 1:
      d = next(iter(devices))
      text = f"{d.platform}:{d.id}"
    else:
      text = type(sharding).__name__
  kind = getattr(sharding, "memory_kind", None)
  if kind not in (None, "device"):
    text += f"@{kind}"
  return text


def key_path(path) -> str:
  """A leaf's key path as JAX names it in `args_info` and its debug info: `keystr`, with a child
  of a pytree node registered without keys (`tree_util.register_pytree_node`, as
  `jax.example_libraries.optimizers.OptimizerState`) by its index, `[0]`, not keystr's
  `[<flat index 0>]`.

  >>> from jax import tree_util
  >>> key_path((tree_util.DictKey("w"), tree_util.FlattenedIndexKey(0)))
  "['w'][0]"
  """
  text = "".join(map(str, path))  # keystr, without its overhead
  return _FLAT_INDEX.sub(r"\1", text) if "<flat index " in text else text


_FLAT_INDEX = re.compile(r"<flat index ([^>]+)>")  # as JAX's linear_util cleans it


def notebook_cell(where: str) -> str:
  """`file:line` (or `file:line (function)`) with a Jupyter cell's temporary file named as IPython
  names the cell: `In[3]:17`. Elsewhere (no IPython shell running, or a file that is not a cell's)
  `where` is returned as is.

  >>> notebook_cell("train.py:12 (step)")
  'train.py:12 (step)'
  """
  named = _cell_namer()
  file, sep, _ = where.partition(" (")[0].rpartition(":")
  label = named(file) if named is not None and sep else None
  return f"{label[1]}:{where[len(file) + 1 :]}" if label else where


def notebook_cells(text: str) -> str:
  """`text` with every `file:line` in it that is a Jupyter cell's temporary file named as IPython
  names the cell (`In[3]:17`), as `notebook_cell` names one. For the words a user reads (a plan's
  reasons and notes, a copy's explanation, an error): the source lines the library matches against
  the compiled program's metadata keep the file's own name.

  >>> notebook_cells("given up at train.py:12 (step), read at train.py:14 (step)")
  'given up at train.py:12 (step), read at train.py:14 (step)'
  """
  named = _cell_namer()
  if named is None or ":" not in text:
    return text

  def one(found: re.Match) -> str:
    label = named(found.group(1))
    return f"{label[1]}:{found.group(2)}" if label else found.group(0)

  return _FILE_LINE.sub(one, text)


# A file name (a Windows drive letter allowed) and a line number: `/tmp/ipykernel_7/12.py:17`.
_FILE_LINE = re.compile(r"((?:[A-Za-z]:)?[^\s:()\[\],;'\"]+):(\d+)")


def _cell_namer():
  """The running IPython shell's `compile.format_code_name` (a cell's file -> `("Cell",
  "In[3]")`, None for any other file), or None outside IPython."""
  ipython = sys.modules.get("IPython")
  shell = ipython.get_ipython() if ipython is not None else None
  return getattr(getattr(shell, "compile", None), "format_code_name", None)
