"""For `python -m donate.profile --advice`: the jitted functions a script calls and the shapes it
calls them with, so that each program the run profiled can be compiled again with a remedy.

XLA's dump of a run has the programs, not the functions that made them; to measure a remedy
(donating an argument, a compiler option) the profile needs the traced function. `install()`
makes `jax.jit` (as the script, flax's `nnx.jit` and equinox's `filter_jit` call it) return the
same jitted function behind a thin wrapper that notes the abstract arguments (shapes, dtypes,
shardings) of the first calls; after the run, `profile_like(p)` profiles the noted call whose
program peaks as `p` does, with `donate.memory_profile`, which keeps the program for `advice()`.
Without `--advice` nothing is installed.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_MOST = 4  # calls noted per jitted function
# (jitted, abstract args, abstract kwargs, abstract outputs)
_noted: list[tuple[Any, tuple, dict, Any]] = []


class _Traced(Exception):
  """A call made while tracing an outer function (its arguments are tracers): not noted."""


def _abstract(x):
  import jax

  if isinstance(x, jax.core.Tracer):
    raise _Traced
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)
  return x


def _outputs(out):
  """`out` with its arrays as `jax.ShapeDtypeStruct`s (the tree and its nodes kept: flax nnx's
  `NodeStates` carry the graph definition that names their leaves)."""
  import jax

  try:
    return jax.tree.map(_abstract, out)
  except _Traced:
    return None


class _Noted:
  """A jitted function that notes its first calls' abstract arguments."""

  def __init__(self, jitted):
    self._jitted, self._calls = jitted, 0
    functools.update_wrapper(self, jitted)

  def __call__(self, *args, **kwargs):
    spec = None
    if self._calls < _MOST:
      import jax

      try:
        spec = jax.tree.map(_abstract, (args, kwargs))
      except _Traced:
        spec = None
    out = self._jitted(*args, **kwargs)
    if spec is not None:
      self._calls += 1
      _noted.append((self._jitted, *spec, _outputs(out)))
    return out

  def __getattr__(self, name):
    return getattr(self._jitted, name)

  def __get__(self, obj, objtype=None):
    return self if obj is None else functools.partial(self, obj)


def install() -> None:
  """Makes `jax.jit` note the calls of what it returns (see the module docstring)."""
  import jax

  real = jax.jit

  @functools.wraps(real)
  def jit(fun=None, *args, **kwargs):
    if fun is None:
      return lambda f: jit(f, *args, **kwargs)
    return _Noted(real(fun, *args, **kwargs))

  jax.jit = jit


def profile_like(p):
  """The profile, with its program for `advice()`, of a noted call whose function has `p`'s name
  and whose program peaks as `p` does; None when no noted call does (one compile per candidate
  with that name, each read once)."""
  from donate._profile.api import memory_profile

  for jitted, args, kwargs, _ in _noted:
    name = getattr(jitted, "__name__", None)
    if name != p.function:
      continue
    try:
      found = memory_profile(jitted, *args, **kwargs)
    except Exception:  # noqa: BLE001 - a call the script made that no longer traces alone
      continue
    if found.peak_bytes == p.peak_bytes:
      return rename(found, names())
  return None


def _graph_path(path) -> str:
  return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def _graph_names(name: str, value) -> dict[str, str]:
  """For a flax nnx graph node's flat state (`nnx.jit` passes each one as a `NodeStates`: its
  graph definition and a flat list of leaves, which JAX names `model.states[0][5]`), its leaves
  by their graph paths (`model.conv1.kernel`, `optimizer.opt_state[0].mu.conv1.kernel`)."""
  import sys

  graphlib = sys.modules.get("flax.nnx.graphlib")
  states = getattr(value, "states", None)
  if graphlib is None or type(value).__name__ != "NodeStates" or not states or len(states) != 1:
    return {}
  try:
    node = graphlib.unflatten(value.graphdef, states[0])
    paths = list(graphlib.flatten(node)[1].paths)
  except Exception:  # noqa: BLE001 - another flax: JAX's positional names stay
    return {}
  if len(paths) != len(states[0]):
    return {}
  return {f"{name}.states[0][{k}]": name + _graph_path(path) for k, path in enumerate(paths)}


def _nnx_outputs(jitted, params: list[str], out) -> dict[str, str]:
  """Under `nnx.jit` the program returns `(args, kwargs, out)`: each graph node argument's state
  after the step (a `NodeStates`, as it came in), then what the user's function returns. JAX
  names their leaves `out[0][0].states[0][5]` (the command line's dump: `out[14]`, the position);
  their names as the user's: the node's graph paths (`model.linear1.kernel`, the new value of
  that leaf), and `out` for what the function returns (`out[1]` for its second leaf path)."""
  from jax import tree_util

  inner = getattr(jitted, "__wrapped__", None)
  if type(inner).__name__ != "JitFn" or not (isinstance(out, tuple) and len(out) == 3):
    return {}
  args, kwargs, returned = out
  if not isinstance(args, tuple) or not isinstance(kwargs, dict):
    return {}
  tops = [(params[i] if i < len(params) else f"args[{i}]", x) for i, x in enumerate(args)]
  graph: dict[str, str] = {}
  for name, value in [*tops, *kwargs.items(), ("out", returned)]:
    graph.update(_graph_names(str(name), value))
  found = {}
  for k, (path, _) in enumerate(tree_util.tree_flatten_with_path(out)[0]):
    head = getattr(path[0], "idx", None)
    if head == 0 and len(path) > 1:
      i = getattr(path[1], "idx", 0)
      mine = tops[i][0] + tree_util.keystr(path[2:])
    elif head == 1 and len(path) > 1:
      mine = str(getattr(path[1], "key", "kwargs")) + tree_util.keystr(path[2:])
    else:
      mine = "out" + tree_util.keystr(path[1:])
    found[f"out[{k}]"] = found["out" + tree_util.keystr(path)] = graph.get(mine, mine)
  return found


def _equinox_names(bound: dict) -> dict[str, str]:
  """Under `eqx.filter_jit` JAX names leaves `dynamic_nodonate['first'][0]`: the first argument's
  array leaves and the rest's, flattened, their tree kept static. Their names as the user's
  function's parameters and fields (`model.hidden.weight`, `opt_state[0].mu.head.bias`)."""
  import inspect

  from jax import tree_util

  static: Any = bound.get("static")
  if set(bound) != {"dynamic_donate", "dynamic_nodonate", "static"} or len(static or ()) != 3:
    return {}
  (fun_leaves, _), first, rest = static
  fun = next((f for f in fun_leaves if callable(f)), None)
  try:
    params = list(inspect.signature(fun).parameters) if fun is not None else []
  except (TypeError, ValueError):
    params = []

  def paths(treedef) -> list[str]:
    tree = tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    return [tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(tree)[0]]

  def rest_name(path: str) -> str:
    head, _, tail = path[1:].partition("]")  # "[0][1].mu" -> rest args; "[1]['lr']" -> kwargs
    if head == "0" and tail.startswith("["):
      k, _, more = tail[1:].partition("]")
      name = params[int(k) + 1] if int(k) + 1 < len(params) else f"args[{int(k) + 1}]"
      return name + more
    return tail.lstrip("[").replace("']", "", 1).strip("'") if head == "1" else path

  first_name = params[0] if params else "args[0]"
  found = {}
  for where in ("dynamic_donate", "dynamic_nodonate"):
    for k, path in enumerate(paths(first[1])):
      found[f"{where}['first'][{k}]"] = first_name + path
    for k, path in enumerate(paths(rest[1])):
      found[f"{where}['rest'][{k}]"] = rest_name(path)
  return found


def _equinox_outputs(bound: dict, out) -> dict[str, str]:
  """Under `eqx.filter_jit` the program returns `(marker, dynamic_out, Static(static_out))`: a
  marker, then the array leaves of what the user's function returns (its tree kept, the rest
  None), which JAX names `out[1][0].hidden.weight` (the command line's dump: `out[1]`, the
  position). Their names as the user's code sees the value it gets back: `out[0].hidden.weight`
  for `return model, opt_state, loss`, `out['loss']` for a dict, `out` for one array."""
  from jax import tree_util

  if set(bound) != {"dynamic_donate", "dynamic_nodonate", "static"}:
    return {}
  if not (isinstance(out, tuple) and len(out) == 3):
    return {}
  found = {}
  for k, (path, _) in enumerate(tree_util.tree_flatten_with_path(out)[0]):
    head = getattr(path[0], "idx", None)
    mine = "out" + tree_util.keystr(path[1:]) if head == 1 else "eqx.filter_jit's marker"
    found[f"out[{k}]"] = found["out" + tree_util.keystr(path)] = mine
  return found


def names() -> dict[str, dict[str, str]]:
  """Per jitted function's name, the user's names of the leaves JAX names by position, from the
  noted calls: flax nnx graph paths under `nnx.jit` for its arguments (`_graph_names`) and its
  outputs (`_nnx_outputs`), equinox fields under `eqx.filter_jit` for its arguments
  (`_equinox_names`) and its outputs (`_equinox_outputs`)."""
  import inspect

  found: dict[str, dict[str, str]] = {}
  for jitted, args, kwargs, out in _noted:
    try:
      signature = inspect.signature(jitted)
      bound = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
      continue
    mine = found.setdefault(getattr(jitted, "__name__", "?"), {})
    for name, value in bound.items():
      mine.update(_graph_names(name, value))
    try:
      mine.update(_nnx_outputs(jitted, list(signature.parameters), out))
    except Exception:  # noqa: BLE001 - another flax: JAX's positional names stay
      pass
    try:
      mine.update(_equinox_names(bound))
      mine.update(_equinox_outputs(bound, out))
    except Exception:  # noqa: BLE001 - another equinox: JAX's positional names stay
      pass
  return found


_EQUINOX = re.compile(r"dynamic_(?:no)?donate\['(first|rest)'\]")


def _equinox_keyword(could_donate) -> str | None:
  """What an `eqx.filter_jit` user writes to donate what `could_donate` names (JAX's names of
  its leaves, `dynamic_nodonate['first'][0]`): `donate="all"` where a leaf of the first argument
  is among them, else `donate="all-except-first"`; None outside `eqx.filter_jit`."""
  found = {m.group(1) for s in could_donate if (m := _EQUINOX.match(s.path))}
  if not found:
    return None
  return f'eqx.filter_jit(donate="{"all" if "first" in found else "all-except-first"}")'


def rename(p, names: dict[str, dict[str, str]]):
  """`p` with the paths of its arguments, outputs, suggestions and donations in the user's
  `names` of its function (`names()`), and what to write to donate under `eqx.filter_jit` in its
  terms (`_equinox_keyword`)."""
  import dataclasses

  mine = names.get(p.function, {})
  keyword = _equinox_keyword(p.could_donate)
  if not mine and keyword is None:
    return p

  def fix(items):
    out = []
    for x in items:
      change = {k: mine[v] for k in ("path", "output") if (v := getattr(x, k, None)) in mine}
      out.append(dataclasses.replace(x, **change) if change else x)
    return tuple(out)

  could = fix(p.could_donate)
  if keyword is not None:
    could = tuple(dataclasses.replace(s, how=keyword) for s in could)
  return dataclasses.replace(
    p, at_peak=fix(p.at_peak), could_donate=could, shadowed=fix(p.shadowed)
  )
