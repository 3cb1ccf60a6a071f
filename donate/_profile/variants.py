"""The same program with a change, compiled and read: the one home of every measured remedy.

A `Program` is what a memory profile keeps of the profiled program to make it again: its
lowering, its trace (where at hand) and how to trace it again. `Program.measure(changes)`
applies every `Change` of a list (cumulatively: compiler options merged, donations joined, the
last checkpoint policy and batch size win), compiles the result for the profile's target and
reads its peak as the profile's own is read, and its FLOPs from XLA's `cost_analysis()`.
`advice`, `fitting.fit` and `fitting.largest_batch` are its clients; none builds a compile of
its own.

A checkpoint policy is applied where the user's code binds `jax.checkpoint` (or, for
`loop_policy`, where it binds `lax.scan`): the step is traced again with the change below the
user's code (`compat_remat.retracing`), so autodiff reads the new policy as it read the old.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np
from jax import tree_util

from donate._base import compat as _compat
from donate._base import compat_remat as _compat_remat
from donate._base.jaxprs import subs
from donate._profile import layers


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
  """One change to a program, in words (`change`), as the code or option to write (`how`), and
  as what `Program.measure` applies: compiler `options` (pairs), more `donate`d positional
  arguments, a `policy` for every `jax.checkpoint`, a `loop_policy` checkpointing every
  `lax.scan` body, a `call_policy` checkpointing every repeated layer call (`layers.calls`), a
  `batch` `(argnum, axis, size)`, `host` argument leaves and `(result, argument)` leaf pairs
  kept in host memory (`offload`)."""

  change: str
  how: str
  options: tuple[tuple[str, Any], ...] = ()
  donate: tuple[int, ...] = ()
  policy: Any = None
  loop_policy: Any = None
  batch: tuple[int, int, int] | None = None
  call_policy: Any = None
  host: tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None = None

  @property
  def retraces(self) -> bool:
    """Whether applying it traces the user's function again."""
    return (self.policy, self.loop_policy, self.batch, self.call_policy) != (None,) * 4


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
  """A compile of the program with changes: its peak (read as a profile's), the bytes it holds
  on the device (`needed_bytes`, as `MemoryProfile.fits` counts them) and its FLOPs (None where
  XLA's cost analysis gives none)."""

  peak_bytes: int
  needed_bytes: int
  flops: float | None
  host_bytes: int = 0  # in host memory spaces (`memory_analysis()`'s host fields): offload
  dot_flops: int | None = None  # the traced program's matmul FLOPs (`dot_flops`)


@dataclasses.dataclass(frozen=True, slots=True)
class Made:
  """A trace of the program: its `jax.stages.Traced` (None for a `donate.jit` program that
  plans its own lowering), its lowering, and argnums -> its lowering with more donated."""

  traced: Any
  lowered: Any
  lower_donating: Callable[[tuple[int, ...]], Any] | None = None


def _flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # a backend without a cost model
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return None if not cost or "flops" not in cost else float(cost["flops"])


def dot_flops(jaxpr, times: int = 1) -> int:
  """2 x the multiply-adds of every `dot_general` in an open jaxpr (a scan's body counted its
  length times; other sub-jaxprs once): the matmul FLOPs of the program as traced, recomputed
  residuals included.

  >>> import jax, jax.numpy as jnp
  >>> dot_flops(jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((2, 3)), jnp.ones((3, 4))).jaxpr)
  48
  """
  total = 0
  for e in jaxpr.eqns:
    if e.primitive.name == "dot_general":
      (contract, _), _ = e.params["dimension_numbers"]
      lhs = e.invars[0].aval.shape
      inner = int(np.prod([lhs[d] for d in contract], dtype=np.int64))
      total += 2 * times * int(np.prod(e.outvars[0].aval.shape, dtype=np.int64)) * inner
    n = times * int(e.params.get("length", 1)) if e.primitive.name == "scan" else times
    total += sum(dot_flops(sub.jaxpr, n) for sub in subs(e))
  return total


def _host(compiled) -> int:
  """Bytes the program keeps in host memory (`memory_analysis()`'s host fields; 0 without)."""
  stats = compiled.memory_analysis()
  fields = ("argument", "output", "temp")
  held = sum(getattr(stats, f"host_{f}_size_in_bytes", 0) or 0 for f in fields)
  return held - (getattr(stats, "host_alias_size_in_bytes", 0) or 0)


def _merged(changes) -> Change:
  options: dict = {}
  donate: set[int] = set()
  policy = loop_policy = batch = call_policy = host = None
  for c in changes:
    host = c.host if c.host is not None else host
    call_policy = c.call_policy if c.call_policy is not None else call_policy
    options.update(c.options)
    donate.update(c.donate)
    policy = c.policy if c.policy is not None else policy
    loop_policy = c.loop_policy if c.loop_policy is not None else loop_policy
    batch = c.batch if c.batch is not None else batch
  how = "; ".join(c.how for c in changes)
  donated = tuple(sorted(donate))
  return Change(
    "", how, tuple(options.items()), donated, policy, loop_policy, batch, call_policy, host
  )


def _retracing(merged: Change):
  """`compat_remat.retracing` with the checkpoint changes of `merged`."""
  calls = None if merged.call_policy is None else (merged.call_policy, layers.calls)
  return _compat_remat.retracing(merged.policy, merged.loop_policy, calls)


def batched(args: tuple, argnum: int, axis: int, size: int) -> tuple:
  """`args` as `jax.ShapeDtypeStruct`s (shardings kept) with the `axis` of argument `argnum`'s
  leaves set to `size`."""

  def spec(x, resize):
    shape = list(np.shape(x))
    if resize and len(shape) > axis:
      shape[axis] = size
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype, sharding=getattr(x, "sharding", None))

  return tuple(
    tree_util.tree_map(lambda x, n=n: spec(x, n == argnum), a) for n, a in enumerate(args)
  )


class Program:
  """How to compile the profiled program again with changes (see the module docstring).

  `compile(options)` and `donating(argnums)` are the earlier names of one-change measures: each
  returns the peak.
  """

  def __init__(
    self,
    made: Made,
    read: Callable[[Any, dict], tuple[int, int, Any]],
    options: dict | None = None,
    donated_argnums: tuple[int, ...] = (),
    retrace: Callable[[tuple, dict], Made] | None = None,
    args: tuple = (),
    kwargs: dict | None = None,
  ):
    self.made, self.read = made, read
    self.options = {k: v for k, v in (options or {}).items() if not k.startswith("xla_dump")}
    self.donated_argnums, self.retrace = donated_argnums, retrace
    self.args, self.kwargs = args, kwargs or {}
    self.compiles = 0  # how many compiles `measure` made
    self._cache: dict = {}
    self._outputs: dict = {}  # changes -> the outputs on the profile's arguments
    self._lock = threading.Lock()

  @property
  def can_donate(self) -> bool:
    return self.made.traced is not None or self.made.lower_donating is not None

  @property
  def can_retrace(self) -> bool:
    return self.retrace is not None

  def measure(self, changes=()) -> Measured:
    """The program compiled with every change of `changes` applied, read (cached per list)."""
    return self.measure_many((changes,))[0]

  def unmeasured(self, lists) -> int:
    """How many compiles `measure_many(lists)` would make (the lists not measured yet)."""
    with self._lock:
      return len({tuple(c) for c in lists} - self._cache.keys())

  def measure_many(self, lists, max_workers: int = 1, done=None) -> list[Measured]:
    """`measure` of each list of changes, in order. The lists not measured yet are lowered here
    one after the other (a retrace changes how JAX binds checkpoints process-wide) and compiled
    `max_workers` at a time in a thread pool, each lowered while the previous ones compile;
    `done()` is called after each compile."""
    keys = [tuple(c) for c in lists]
    with self._lock:
      todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
      if max_workers <= 1 or len(todo) <= 1:
        for key in todo:
          self._store(key, self._read(*self._lowering(key)))
          if done is not None:
            done()
      else:
        with ThreadPoolExecutor(min(max_workers, len(todo)), "donate-measure") as pool:
          futures = []
          for key in todo:
            futures.append(pool.submit(self._read, *self._lowering(key)))
            if done is not None:
              futures[-1].add_done_callback(lambda _: done())
          for key, future in zip(todo, futures):
            self._store(key, future.result())
      return [self._cache[k] for k in keys]

  def _lowering(self, key) -> tuple[Any, dict, int | None]:
    lowered, options, traced = self._lowered_with(key)
    return lowered, options, None if traced is None else dot_flops(traced.jaxpr.jaxpr)

  def _read(self, lowered, options: dict, dots: int | None) -> Measured:
    peak, needed, compiled = self.read(lowered, options)
    return Measured(peak, needed, _flops(compiled), _host(compiled), dots)

  def _store(self, key, measured: Measured) -> None:
    self._cache[key] = measured
    self.compiles += 1

  def flops_ratio(self, changes) -> float | None:
    """FLOPs of the program with `changes` over the original's: XLA's `cost_analysis()` where
    the target gives it (XLA:CPU), else the matmul FLOPs of the traced programs (`dot_flops`:
    compile-only GPU programs have no cost analysis); None when neither is known."""
    m, base = self.measure(changes), self.measure()
    for a, b in ((m.flops, base.flops), (m.dot_flops, base.dot_flops)):
      if a and b:
        return a / b
    return None

  @property
  def flops_from(self) -> str:
    """Where `flops_ratio` reads FLOPs, in words."""
    if self.measure().flops:
      return "XLA's cost analysis"
    return "the traced matmuls (the target has no cost analysis)"

  def lowered_with(self, changes) -> tuple[Any, dict]:
    """`(lowered, compiler options)` of the program with `changes` applied."""
    return self._lowered_with(changes)[:2]

  def _lowered_with(self, changes) -> tuple[Any, dict, Any]:
    merged = _merged(changes)
    options = {**self.options, **dict(merged.options)}
    if merged.host is not None and not merged.retraces:
      return self._on_host(self.made, merged), options, self.made.traced
    if not merged.retraces:
      return self._donating(self.made, merged.donate), options, self.made.traced
    if self.retrace is None:
      raise ValueError("the profile has no function and arguments to trace again")
    args = self.args
    if merged.batch is not None:
      args = batched(args, *merged.batch)
    with _retracing(merged):
      made = self.retrace(args, self.kwargs)
      if merged.host is not None:
        return self._on_host(made, merged), options, made.traced
      return self._donating(made, merged.donate), options, made.traced

  def _on_host(self, made: Made, merged: Change):
    """The lowering of `made` with `merged.host` kept in host memory (`offload`)."""
    from donate._profile import offload

    if made.traced is None:
      raise ValueError("the profile has no trace to place in host memory")
    traced = self._traced_donating(made, merged.donate)
    leaves = tree_util.tree_leaves((self.args, self.kwargs))
    default = jax.sharding.make_single_device_sharding(jax.devices()[0])

    def fallback(i: int):
      return getattr(leaves[i], "sharding", None) or default if i < len(leaves) else default

    host_in, pairs = merged.host or ((), ())
    return offload.lowered_on_host(traced, host_in, pairs, fallback)

  def _traced_donating(self, made: Made, argnums: tuple[int, ...]):
    """`made.traced` donating the positional arguments `argnums` too."""
    argnums = tuple(n for n in argnums if n not in self.donated_argnums)
    if not argnums:
      return made.traced
    starts = [0]
    for a in made.traced.args_info[0]:
      starts.append(starts[-1] + len(tree_util.tree_leaves(a)))
    leaves = {k for n in argnums for k in range(starts[n], starts[n + 1])}
    return _compat.traced_with_donation(made.traced, leaves)

  def _donating(self, made: Made, argnums: tuple[int, ...]):
    argnums = tuple(n for n in argnums if n not in self.donated_argnums)
    if not argnums:
      return made.lowered if made.lowered is not None else made.traced.lower()
    if made.traced is None:
      if made.lower_donating is None:
        raise ValueError("the profile has no trace to lower with more donations")
      return made.lower_donating(argnums)
    return self._traced_donating(made, argnums).lower()

  def compile(self, options: dict) -> int:
    """The peak with more compiler `options`."""
    return self.measure((Change("", "", tuple(options.items())),)).peak_bytes

  def donating(self, argnums: tuple[int, ...]) -> int:
    """The peak with the positional arguments `argnums` donated too."""
    return self.measure((Change("", "", donate=tuple(argnums)),)).peak_bytes

  def same_values(self, changes) -> str | None:
    """Runs the program with and without `changes` on the profile's own arguments and compares
    the outputs: "bitwise", "allclose (...)" or "differ (...)"; None where it cannot run them
    (abstract arguments, another backend's target, a `donate.jit` program). Nothing donated."""
    leaves = tree_util.tree_leaves((self.args, self.kwargs))
    if self.retrace is None or not leaves or not all(isinstance(x, jax.Array) for x in leaves):
      return None
    try:
      if any(d.platform != jax.default_backend() for x in leaves for d in x.devices()):
        return None
    except Exception:
      return None
    kept = tuple(dataclasses.replace(c, donate=()) for c in changes if c.batch is None)
    with self._lock:
      if () not in self._outputs:
        self._outputs[()] = self._run(())
      before = self._outputs[()]
    after = self._run(kept)
    return None if before is None or after is None else compare(before, after)

  def _run(self, changes) -> list | None:
    """The outputs of the program with `changes` (nothing donated) on the profile's arguments."""
    merged, retrace = _merged(changes), self.retrace
    if retrace is None:
      return None
    with _retracing(merged):
      traced = retrace(self.args, self.kwargs).traced
    if traced is None:
      return None
    traced = _compat.traced_without_donation(traced) or traced
    compiled = traced.lower().compile(compiler_options={**self.options, **dict(merged.options)})
    return tree_util.tree_leaves(compiled(*self.args, **self.kwargs))


def compare(before: list, after: list) -> str:
  """ "bitwise" when every leaf is equal bit for bit, else "allclose (max |diff| d)" or
  "differ (max |diff| d)"."""
  if len(before) != len(after):
    return "differ (another output structure)"
  a = [np.asarray(x) for x in before]
  b = [np.asarray(x) for x in after]
  if all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b)):
    return "bitwise"
  worst = max(
    (float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b)),
    default=0.0,
  )
  close = all(np.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True) for x, y in zip(a, b))
  return f"{'allclose' if close else 'differ'} (max |diff| {worst:.3g})"
