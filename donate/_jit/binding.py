"""Binding a call as `jax.jit` does: static arguments out, dynamic leaves in, each leaf named.

`jax.jit` resolves `static_argnums`/`static_argnames` and `donate_argnums`/`donate_argnames`
through the function's signature when it is built; `Binding` takes those resolved tuples from it
(`_compat.jit_argnums`), so donate splits a call exactly where `jax.jit` does.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, NamedTuple

import jax
import numpy as np
from jax import tree_util

from donate._base import compat as _compat
from donate._base import text as _text
from donate._plan import donation_plan as _donation_plan
from donate._plan.decision_types import Kind, Request

# The kinds as module globals: reading an enum member through its class costs about 0.1 us on
# Python 3.11, and a wide pytree's every leaf asks.
DEVICE, ABSTRACT, REF, HOST = Kind.DEVICE, Kind.ABSTRACT, Kind.REF, Kind.HOST


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
  """One call split like `jax.jit` splits it.

  `leaves` are the dynamic leaves in `jax.jit`'s flat order (positional arguments, then keyword
  arguments by name); `key` identifies the call structure and static values.
  """

  leaves: list
  treedef: Any
  key: Any
  positions: tuple[int, ...]  # original position of each dynamic positional argument
  kwarg_names: tuple[str, ...]  # names of the dynamic keyword arguments, in flat order

  def without_leaves(self) -> Call:
    """The call's structure alone, its leaves let go (`dataclasses.replace` costs several times
    as much)."""
    return Call([None] * len(self.leaves), self.treedef, self.key, self.positions, self.kwarg_names)


class Binding:
  """The call structure of one `donate.jit` function.

  >>> import jax
  >>> b = Binding(lambda x, n, *, mode="add": x, jax.jit(lambda x, n, *, mode="add": x,
  ...             static_argnums=1, static_argnames="mode"))
  >>> call = b.bind((1.0, 2), {"mode": "mul"})
  >>> call.leaves, call.positions, b.paths(call)
  ([1.0], (0,), ['x'])
  """

  def __init__(self, fun, jitted):
    static_nums, static_names, donate_nums, donate_names = _compat.jit_argnums(jitted)
    self.static_nums = frozenset(static_nums)
    self.static_names = frozenset(static_names)
    self.donate_nums = frozenset(donate_nums)
    self.donate_names = frozenset(donate_names)
    self.has_static = bool(self.static_nums or self.static_names)
    self.names = ArgumentNames.read(fun)
    # what a call's paths and donated leaves depend on beside its structure (`structure`)
    self._key = (self.names, self.donate_nums, self.donate_names)

  def bind(self, args: tuple, kwargs: dict) -> Call:
    if not self.has_static:
      leaves, treedef = tree_util.tree_flatten((args, kwargs))
      return Call(leaves, treedef, treedef, tuple(range(len(args))), tuple(sorted(kwargs)))
    n = len(args)
    static_pos = {i + n if i < 0 else i for i in self.static_nums}
    positions = tuple(i for i in range(n) if i not in static_pos)
    dyn_args = tuple(args[i] for i in positions)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_names}
    static = tuple((i, args[i]) for i in sorted(static_pos) if 0 <= i < n) + tuple(
      (k, kwargs[k]) for k in sorted(kwargs) if k in self.static_names
    )
    leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
    return Call(leaves, treedef, (treedef, static), positions, tuple(sorted(dyn_kwargs)))

  def dynamic(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call's dynamic arguments, static ones left out (as a `jax.stages.Compiled` wants)."""
    if not self.has_static:
      return args, kwargs
    n = len(args)
    static_pos = {i + n if i < 0 else i for i in self.static_nums}
    return (
      tuple(a for i, a in enumerate(args) if i not in static_pos),
      {k: v for k, v in kwargs.items() if k not in self.static_names},
    )

  def bind_dynamic(self, args: tuple, kwargs: dict) -> Call:
    """A call of a compiled computation: every argument is dynamic (static ones are not passed)."""
    leaves, treedef = tree_util.tree_flatten((args, kwargs))
    return Call(leaves, treedef, treedef, tuple(range(len(args))), tuple(sorted(kwargs)))

  def paths(self, call: Call) -> list[str]:
    """Each leaf's path: the parameter name, then the key path inside it (`params['w']`).

    Each argument is rebuilt from the call's own leaves (never stand-ins: a pytree class may
    check its children when it is built, as JAX rebuilds it from tracers)."""
    return list(self.structure(call)[0])

  def donated_leaves(self, call: Call) -> dict[int, Request]:
    """Leaf index -> `Request.DONATE_ARGNUMS`/`DONATE_ARGNAMES` for the leaves `jax.jit` donates."""
    return dict(self.structure(call)[1])

  def structure(self, call: Call) -> tuple[tuple[str, ...], dict[int, Request]]:
    """`(paths, donated_leaves)` of the call's structure, read the first time it is met with
    the same parameter names and donated arguments (each step of a loop repeats them, and so
    do the fresh functions of one step; a wide pytree's cost milliseconds); not to be changed."""
    key = (call.treedef, call.positions, self._key)
    try:
      found = _STRUCTURES.get(key)
    except (TypeError, ValueError):  # a node's metadata that cannot be hashed or compared
      return self._read_structure(call)
    if found is None:
      found = self._read_structure(call)
      if len(_STRUCTURES) >= 256:  # a bound: a treedef keeps its nodes' metadata alive
        _STRUCTURES.clear()
      _STRUCTURES[key] = found
    return found

  def _read_structure(self, call: Call) -> tuple[tuple[str, ...], dict[int, Request]]:
    paths: list[str] = [""] * len(call.leaves)
    for name, start, stop, subtree in self._arguments(call):
      name = self.names.of(name)
      paths[start:stop] = [name + k for k in key_paths(subtree, call.leaves[start:stop])]
    donated = {}
    for name, start, stop, _ in self._arguments(call, donated=True):
      source = Request.DONATE_ARGNUMS if isinstance(name, int) else Request.DONATE_ARGNAMES
      donated.update(dict.fromkeys(range(start, stop), source))
    return tuple(paths), donated

  def _arguments(self, call: Call, donated: bool = False):
    """`(position or name, first leaf, end, treedef)` of each dynamic argument, read from the
    call's treedef alone (positional arguments, then keyword arguments by name); `donated`: only
    those `jax.jit` donates."""
    args_def, kwargs_def = call.treedef.children()
    start = 0
    for k, subtree in enumerate(args_def.children()):
      position = call.positions[k]
      stop = start + subtree.num_leaves
      if not donated or position in self.donate_nums:
        yield position, start, stop, subtree
      start = stop
    for name, subtree in zip(kwargs_def.node_data()[1], kwargs_def.children()):
      stop = start + subtree.num_leaves
      if not donated or name in self.donate_names:
        yield name, start, stop, subtree
      start = stop

  def rebuild(self, call: Call, args: tuple, kwargs: dict, leaves: list) -> tuple[tuple, dict]:
    """The call's (args, kwargs) with the dynamic leaves replaced, static arguments kept."""
    dyn_args, dyn_kwargs = tree_util.tree_unflatten(call.treedef, leaves)
    if not self.has_static:
      return tuple(dyn_args), dict(dyn_kwargs)
    new_args = list(args)
    for k, position in enumerate(call.positions):
      new_args[position] = dyn_args[k]
    new_kwargs = dict(kwargs)
    new_kwargs.update(dyn_kwargs)
    return tuple(new_args), new_kwargs


class ArgumentNames(NamedTuple):
  """How JAX names a call's arguments in `args_info` and its debug info: a positional parameter
  by its name, one taken by `*args` as `args[0]`, `args[1]`, ... (the first argument past the
  named ones is `args[0]`), a keyword taken by `**kw` as `kw['name']`; with no signature,
  `args[i]` by position and `kwargs['name']`.

  >>> import inspect
  >>> names = ArgumentNames.read(lambda state, *xs, **kw: 0)
  >>> names.of(0), names.of(1), names.of(2), names.of("state"), names.of("lr")
  ('state', 'xs[0]', 'xs[1]', 'state', "kw['lr']")
  >>> ArgumentNames.read(print).of(1), ArgumentNames.read(max).of("key")
  ('args[1]', "kwargs['key']")
  """

  positional: tuple[str, ...]
  keywords: frozenset[str]
  var_positional: str
  var_keyword: str | None

  @classmethod
  def read(cls, fun) -> ArgumentNames:
    """The names of `fun`'s parameters, as `inspect.signature` gives them."""
    try:
      params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
      return cls((), frozenset(), "args", "kwargs")
    kinds = {p.kind: p.name for p in params}
    positional = tuple(p.name for p in params if p.kind in _POSITIONAL)
    keywords = frozenset(p.name for p in params if p.kind not in _VARIADIC)
    var_positional = kinds.get(inspect.Parameter.VAR_POSITIONAL, "args")
    return cls(positional, keywords, var_positional, kinds.get(inspect.Parameter.VAR_KEYWORD))

  def of(self, name: int | str) -> str:
    """The name of the argument at this position, or passed by this keyword."""
    if isinstance(name, int):
      n = len(self.positional)
      return self.positional[name] if name < n else f"{self.var_positional}[{name - n}]"
    if name in self.keywords or self.var_keyword is None:
      return name
    return f"{self.var_keyword}[{name!r}]"


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)

_KEY_PATHS: dict[Any, tuple[str, ...]] = {}  # treedef -> its leaves' key paths, as text
_STRUCTURES: dict[tuple, tuple[tuple[str, ...], dict[int, Request]]] = {}  # `Binding.structure`


def key_paths(treedef, leaves) -> tuple[str, ...]:
  """The key path of each leaf of `treedef` as text (`['w'][0]`), rebuilt from `leaves` (the
  call's own values or avals, never stand-ins: a pytree class may check its children) the first
  time a structure is met; key paths depend on the structure alone, so they are kept by treedef
  (a wide pytree's paths cost milliseconds, and every signature of a step repeats them)."""
  try:
    found, cacheable = _KEY_PATHS.get(treedef), True
  except (TypeError, ValueError):  # a node's metadata that cannot be hashed or compared
    found, cacheable = None, False
  if found is None:
    flat = tree_util.tree_flatten_with_path(tree_util.tree_unflatten(treedef, leaves))[0]
    found = tuple(_text.key_path(kp) for kp, _ in flat)
    if cacheable:
      if len(_KEY_PATHS) >= 256:  # a bound: a treedef keeps its nodes' metadata alive
        _KEY_PATHS.clear()
      _KEY_PATHS[treedef] = found
  return found


def leaf_infos(paths: list[str], leaves: list) -> list[_donation_plan.LeafInfo]:
  """`leaf_info` of every leaf; the facts of a device array are read once per (type, shape, dtype,
  sharding) of the call (a wide pytree's thousands of leaves have a few of those)."""
  return _leaf_infos(paths, leaves, None)


def device_leaf_infos(paths: list[str], arrays: list[tuple]) -> list[_donation_plan.LeafInfo]:
  """`leaf_infos` of device arrays given as `(type, aval, sharding)`: what a plan made after the
  call reads of them (`_jit.quick` keeps these, not the arrays)."""
  return _leaf_infos(paths, None, arrays)


def _leaf_infos(paths, leaves, arrays) -> list[_donation_plan.LeafInfo]:
  seen: dict[tuple, tuple] = {}
  out = []
  for k, path in enumerate(paths):
    if arrays is not None:
      t, aval, sharding = arrays[k]
    else:
      x = leaves[k]
      t = type(x)
      if t not in _DEVICE_TYPES:
        out.append(leaf_info(path, x))
        continue
      aval, sharding = x.aval, x.sharding
    key = (t, aval.shape, aval.dtype, id(sharding))  # the leaf keeps `sharding` alive
    facts = seen.get(key)
    if facts is None:
      info = _device_info(path, t.__name__, aval, sharding)
      facts = seen[key] = (
        info.shape,
        info.dtype,
        info.nbytes,
        info.sharding,
        info.memory_kind,
        info.kind,
        info.type_name,
        info.sharding_obj,
        info.group_kind,
        info.memory_space,
      )
      out.append(info)
    else:
      out.append(_donation_plan.LeafInfo(path, *facts))
  return out


def leaf_info(path: str, x) -> _donation_plan.LeafInfo:
  """The planner's facts about one leaf: device buffer, abstract value, ref or host value."""
  abstract = False
  if _is_device_array(x):
    aval = x.aval if hasattr(x, "aval") else jax.typeof(x)
    return _device_info(path, type(x).__name__, aval, getattr(x, "sharding", None))
  if is_ref(x):
    kind = REF
  elif abstract := isinstance(x, (jax.ShapeDtypeStruct, jax.core.ShapedArray)):
    kind = ABSTRACT
  else:
    kind = HOST
  aval = x if abstract else jax.typeof(x)
  if not hasattr(aval, "shape"):  # a token or another value without a shape: never a buffer
    return _donation_plan.LeafInfo(
      path, (), type(aval).__name__, 0, "-", None, HOST, type(x).__name__
    )
  shape = tuple(aval.shape)
  dtype = _text.dtype_name(aval.dtype)
  nbytes = aval_nbytes(aval)
  concrete = kind != HOST and not isinstance(x, jax.core.Tracer)
  sharding = getattr(x, "sharding", None) if concrete else None
  memory_kind = getattr(sharding, "memory_kind", None)
  text = _text.sharding_str(sharding) if sharding is not None or kind == HOST else "-"
  return _donation_plan.LeafInfo(
    path, shape, dtype, nbytes, text, memory_kind, kind, type(x).__name__, sharding,
    memory_space=memory_space(aval),
  )  # fmt: skip


def _device_info(path: str, type_name: str, aval, sharding) -> _donation_plan.LeafInfo:
  """`leaf_info` of a device array of type `type_name`, read from its aval and sharding."""
  text = _text.sharding_str(sharding) if sharding is not None else "-"
  shape, dtype, nbytes = tuple(aval.shape), _text.dtype_name(aval.dtype), aval_nbytes(aval)
  return _donation_plan.LeafInfo(
    path, shape, dtype, nbytes, text, getattr(sharding, "memory_kind", None), DEVICE, type_name,
    sharding, memory_space=memory_space(aval),
  )  # fmt: skip


def memory_space(aval) -> str | None:
  """The memory space an aval is typed in when not the device's (`"Host"`: a value put in host
  memory), else None. JAX keys donations by the aval, memory space included."""
  name = getattr(getattr(aval, "memory_space", None), "name", None)
  return None if name in (None, "Device") else name


def _is_device_array(x) -> bool:
  """A concrete `jax.Array` that is not a ref, by its type once seen (`isinstance` against
  `jax.Array` and `jax.Ref` is slow, and a wide pytree asks thousands of times)."""
  t = type(x)
  if t in _DEVICE_TYPES:
    return True
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and not isinstance(x, jax.Ref):
    _DEVICE_TYPES.add(t)
    return True
  return False


_DEVICE_TYPES: set = set()  # concrete array types seen: never refs, tracers or abstract values


def repeats_an_array(binding: Binding, args: tuple, kwargs: dict) -> bool:
  """Whether one `jax.Array` is passed in two places of this call (what JAX rejects when one of
  them is donated); False for arguments that do not bind, and for a call passing an array an
  earlier call consumed (the error of `jax.jit`'s cached call for it stands).

  >>> import jax.numpy as jnp
  >>> f, x, y = (lambda a, b: a), jnp.zeros(2), jnp.ones(2)
  >>> b = Binding(f, jax.jit(f))
  >>> repeats_an_array(b, (x, {"y": x}), {}), repeats_an_array(b, (x, x + 1), {})
  (True, False)
  >>> y.delete()
  >>> repeats_an_array(b, (y, {"y": y}), {})
  False
  """
  try:
    leaves = binding.bind(args, kwargs).leaves
  except (TypeError, ValueError):
    return False
  if any(_is_device_array(x) and x.is_deleted() for x in leaves):
    return False
  arrays = [id(x) for x in leaves if isinstance(x, jax.Array)]
  return len(set(arrays)) < len(arrays)


def is_ref(x) -> bool:
  """A `jax.Ref` (or a tracer of one) or its abstract stand-in, `ShapeDtypeStruct(is_ref=True)`.

  >>> import jax.numpy as jnp
  >>> is_ref(jax.new_ref(jnp.zeros(2))), is_ref(jnp.zeros(2))
  (True, False)
  >>> is_ref(jax.ShapeDtypeStruct((2,), "float32", is_ref=True))
  True
  """
  if isinstance(x, jax.Ref):
    return True
  if isinstance(x, jax.ShapeDtypeStruct):
    return getattr(x, "is_ref", False) is True
  return isinstance(x, jax.core.Tracer) and hasattr(jax.typeof(x), "inner_aval")


def meta_key(x) -> tuple:
  """What, beyond the traced avals, decides a leaf's plan and lowering (as `jax.jit`'s MetaTy)."""
  if _is_device_array(x):
    return (DEVICE, x.sharding, getattr(x, "_committed", True), _compat.layout_key(x))
  if isinstance(x, jax.Ref):
    return (REF, x.sharding, getattr(x, "_committed", True), getattr(x, "format", None))
  if isinstance(x, (jax.ShapeDtypeStruct, jax.core.ShapedArray)):
    return (REF if is_ref(x) else ABSTRACT, getattr(x, "sharding", None))
  return (HOST, type(x))


def signature_key(x) -> tuple:
  """A leaf's part of a call's key (its aval and `meta_key`), as `jax.jit`'s dispatch keys it; a
  concrete array's aval and sharding by identity (their `__hash__` and `__eq__` run Python), so
  whoever keeps the key keeps those objects (`held`): no other object takes their ids."""
  if _is_device_array(x):
    return (id(x.aval), id(x.sharding), getattr(x, "_committed", True), _compat.layout_key(x))
  try:
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
  except TypeError:  # not a JAX type: tracing raises jax.jit's own error
    aval = None
  return (aval, meta_key(x))


def held(leaves) -> tuple:
  """What `signature_key` identifies by identity, to keep alive beside a key."""
  return tuple((x.aval, x.sharding) for x in leaves if _is_device_array(x))


def aval_nbytes(aval):
  """Bytes of an array-like value with `shape` and `dtype` (extended dtypes by their itemsize).

  An int, or under shape-polymorphic export (`jax.export.symbolic_shape`) an expression of the
  dimension variables, as JAX's own `aval.size` is.

  >>> aval_nbytes(jax.ShapeDtypeStruct((2, 3), "float32"))
  24
  >>> b, = jax.export.symbolic_shape("b")
  >>> aval_nbytes(jax.ShapeDtypeStruct((b, 3), "float32"))
  12*b
  """
  itemsize = int(getattr(aval.dtype, "itemsize", 0) or 0)
  size = math.prod(aval.shape)
  if type(size) is int:  # the common case, before the slower check against numpy's integers
    return size * itemsize
  return (int(size) if isinstance(size, np.integer) else size) * itemsize
