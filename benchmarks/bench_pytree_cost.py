"""What donate.jit costs on wide pytrees: fresh `lower()`, first call and cached call against
`jax.jit`'s, on both of donate's paths.

A dict of N float32[64] leaves, all donated, each output computed from one input (`x * 2 + 1`),
for N = 10, 100, 1000, 10000. On the "native" path output k is computed from input k (the pairs
first come, first served gives: `jax.jit`'s own program runs); on the "re-paired" path output k is
computed from input N-1-k, so donate pairs every leaf otherwise than `jax.jit` (with
`copy_threshold=0`: these 256-byte leaves are under the default 64 KiB) and runs the gate's own
lowering with its aliases set. The "reversed-small" path is the re-paired step at the default
`copy_threshold`: outputs that do not mirror the inputs (a step returning `grads, new_params`, a
reordered optimizer state), leaves under 64 KiB, where `jax.jit`'s own first-come program runs
(the path most small-leaf pytrees take). `--paths re-paired-64k` (not run by default) is the
same step on float32[16384] leaves (64 KiB each) at the default `copy_threshold`: the re-pairing
donate makes on its own, where `jax.jit`'s first-come program copies every leaf. The cached call
times a loop of calls that feed each call's result to the next (1000 calls up to 100 leaves, 200
up to 1000, 20 at 10,000). Every
sample builds fresh functions (no cache helps either side) and runs one of each back to back,
`jax.jit` first ("in order") or donate.jit first ("swapped"); the table gives the median ratio
over the pairs. Each sample starts after
`gc.collect()`, so a full collection that the previous sample's garbage made due (about 50 ms at
1000 leaves, and it falls on whichever side comes second) does not decide the ratio; collections
a sample's own allocations trigger are timed with it. A second table times donate's own
work (planning, `_signature.prepare`, and reading the compiled program back,
`_compiled.realize`) within the first call of a 24-layer transformer training step (unscanned:
one parameter and one momentum leaf per weight). Last, a cached call of a step with a host
callback (no C++ entry can run it). `--lower-pairs P` times `lower()` alone instead, over P
pairs whose order alternates (the median difference and ratio of each size and path: a noisy
machine needs a few hundred pairs to tell 5% from 10% at 10 leaves). `--pairs P --rounds R`
times every size and path over P interleaved pairs of fresh functions (`lower()`, first call)
and R interleaved rounds of two warm ones (cached call), with the ratios' quartiles (each row
printed to stderr as it is measured), then the 10-leaf native cached call split: donate.jit's,
its C++ dispatch alone, and `jax.jit`'s behind one Python frame (`frame_share`). Run:
  python benchmarks/bench_pytree_cost.py [--sizes 10,100,1000,10000] [--repeats 7] [--layers 24]
      [--paths native,re-paired,reversed-small[,re-paired-64k]] [--lower-pairs 201]
      [--pairs 101 --rounds 201 [--min-pairs 5] [--rounds-10000 R]]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import donate
from donate import _demo
from donate._jit import compiled as _compiled
from donate._jit import signature as _signature


def _step_factory(shift: float, repaired: bool = False):
  if not repaired:
    def step(params):
      return {k: v * 2.0 + shift for k, v in params.items()}
  else:
    def step(params):
      keys = sorted(params)
      return {k: params[j] * 2.0 + shift for k, j in zip(keys, reversed(keys))}
  return step


# path -> (donate.jit's extra keywords, elements per float32 leaf). "re-paired-64k": leaves of
# 64 KiB, at the default copy_threshold: the pairing donate makes on its own (opt-in, --paths).
PATHS = {
  "native": ({}, 64),
  "re-paired": ({"copy_threshold": 0}, 64),
  "re-paired-64k": ({}, 16384),
  "reversed-small": ({}, 64),
}
DEFAULT_PATHS = ("native", "re-paired", "reversed-small")


def _jit_for(jit, path: str):
  extra = PATHS[path][0] if jit is donate.jit else {}
  return lambda fun, **kw: jit(fun, **kw, **extra)


def _params(n: int, size: int = 64) -> dict:
  return {f"w{i:05d}": jnp.full((size,), float(i)) for i in range(n)}


def _cached_calls(n: int) -> int:
  """Calls timed per cached-call sample: 1000 up to 100 leaves (a call is 30-160 us there, and
  200 of them, 6 ms, swing by several percent from one sample to the next), 200 up to 1000
  leaves, else 20 (a sample of 10,000 leaves is then about a second)."""
  return 1000 if n <= 100 else 200 if n <= 1000 else 20


def _once(jit, n: int, what: str, shift: float, path: str) -> float:
  g = _jit_for(jit, path)(_step_factory(shift, path != "native"), donate_argnums=0)
  params = _params(n, PATHS[path][1])
  jax.block_until_ready(params)
  if what == "cached call":
    for _ in range(20):
      params = g(params)
    jax.block_until_ready(params)
  gc.collect()  # every sample starts from the same heap: no collection the other side left due
  t0 = time.perf_counter()
  if what == "lower()":
    g.lower(params)
  elif what == "first call":
    jax.block_until_ready(g(params))
  else:
    for _ in range(_cached_calls(n)):
      params = g(params)
    jax.block_until_ready(params)
    return (time.perf_counter() - t0) / _cached_calls(n)
  return time.perf_counter() - t0


def measure(n: int, what: str, repeats: int, path: str = "native") -> dict[str, float]:
  """Median ratio donate/jax over `repeats` pairs, for each order, and the median times."""
  ratios = {"in order": [], "swapped": []}
  ours, theirs = [], []
  for k in range(repeats):
    for order in ratios:
      first, second = (jax.jit, donate.jit) if order == "in order" else (donate.jit, jax.jit)
      t1 = _once(first, n, what, 2.0 * k + 0.25, path)
      t2 = _once(second, n, what, 2.0 * k + 0.75, path)
      t_jax, t_ours = (t1, t2) if first is jax.jit else (t2, t1)
      ratios[order].append(t_ours / t_jax)
      ours.append(t_ours)
      theirs.append(t_jax)
  return {"donate ms": statistics.median(ours) * 1e3, "jax ms": statistics.median(theirs) * 1e3,
          **{o: statistics.median(r) for o, r in ratios.items()}}


def table(sizes, repeats: int, paths=DEFAULT_PATHS) -> str:
  head = ("leaves", "path", "stage", "donate.jit ms", "jax.jit ms", "ratio in order",
          "ratio swapped")
  rows = []
  for n in sizes:
    for path in paths:
      for what in ("lower()", "first call", "cached call"):
        m = measure(n, what, repeats if n < 10_000 else max(3, repeats // 2), path)
        digits = 3 if what == "cached call" else 1
        rows.append((str(n), path, what, f"{m['donate ms']:.{digits}f}",
                     f"{m['jax ms']:.{digits}f}", f"{m['in order']:.2f}x", f"{m['swapped']:.2f}x"))
  widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
  line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
  return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                    *map(line, rows)])


def _transformer(layers: int, d: int = 128, ff: int = 512, heads: int = 4):
  """Parameters, momentum and a batch of a pre-norm transformer, and its SGD-momentum step."""
  keys = iter(jax.random.split(jax.random.key(0), 6 * layers + 2))
  dense = lambda m, n: jax.random.normal(next(keys), (m, n)) / m ** 0.5
  params = {"embed": dense(256, d), "layers": [
      {"wq": dense(d, d), "wk": dense(d, d), "wv": dense(d, d), "wo": dense(d, d),
       "w1": dense(d, ff), "w2": dense(ff, d), "ln1": jnp.ones(d), "ln2": jnp.ones(d)}
      for _ in range(layers)]}
  momentum = jax.tree.map(jnp.zeros_like, params)
  tokens = jax.random.randint(next(keys), (8, 64), 0, 256)

  def norm(x, g):
    return g * (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)

  def loss(p, tokens):
    x = p["embed"][tokens]
    for layer in p["layers"]:
      h = norm(x, layer["ln1"])
      q, k, v = (jnp.reshape(h @ layer[w], (*h.shape[:2], heads, -1)) for w in ("wq", "wk", "wv"))
      att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5, axis=-1)
      x = x + jnp.reshape(jnp.einsum("bhqk,bkhd->bqhd", att, v), x.shape) @ layer["wo"]
      x = x + jax.nn.gelu(norm(x, layer["ln2"]) @ layer["w1"]) @ layer["w2"]
    logits = x @ p["embed"].T
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  def step(p, m, tokens):
    g = jax.grad(loss)(p, tokens)
    m = jax.tree.map(lambda m, g: 0.9 * m + g, m, g)
    return jax.tree.map(lambda p, m: p - 1e-3 * m, p, m), m

  return step, params, momentum, tokens


def own_share(layers: int, repeats: int) -> str:
  """donate's planning and reading of the compiled program, within the first call."""
  spent = {"plan": 0.0, "read back": 0.0}

  def timed(fun, key):
    def wrapper(*args, **kwargs):
      t0 = time.perf_counter()
      try:
        return fun(*args, **kwargs)
      finally:
        spent[key] += time.perf_counter() - t0
    return wrapper

  prepare, realize = _signature.prepare, _compiled.realize
  _signature.prepare, _compiled.realize = timed(prepare, "plan"), timed(realize, "read back")
  rows = []
  try:
    for _ in range(repeats):
      spent.update({"plan": 0.0, "read back": 0.0})
      step, params, momentum, tokens = _transformer(layers)
      t0 = time.perf_counter()
      jax.block_until_ready(donate.jit(step, donate_argnums=(0, 1))(params, momentum, tokens))
      total = time.perf_counter() - t0
      rows.append((total, spent["plan"], spent["read back"]))
  finally:
    _signature.prepare, _compiled.realize = prepare, realize
  total, plan, back = (statistics.median(r[k] for r in rows) for k in range(3))
  leaves = 2 * len(jax.tree.leaves(_transformer(layers)[1]))
  return (f"{layers}-layer transformer training step ({leaves} donated leaves), first call, "
          f"median of {repeats}: {total * 1e3:.0f} ms; planning {plan * 1e3:.1f} ms "
          f"({plan / total:.1%}), reading the compiled program {back * 1e3:.1f} ms "
          f"({back / total:.1%}); together {(plan + back) / total:.1%}")


def _alternating(funs: dict, state: dict, rounds: int, calls: int) -> dict[str, float]:
  """Median seconds a cached call of each of `funs`, each fed its own result (`state`), over
  `rounds` rounds of `calls` calls that alternate the functions."""
  times: dict[str, list[float]] = {k: [] for k in funs}
  for _ in range(rounds):
    for k, g in funs.items():
      p = jax.block_until_ready(state[k])
      t0 = time.perf_counter()
      for _ in range(calls):
        p = g(p)
      state[k] = jax.block_until_ready(p)
      times[k].append((time.perf_counter() - t0) / calls)
  return {k: statistics.median(v) for k, v in times.items()}


def host_callback_call(n: int = 10, rounds: int = 15, calls: int = 100) -> str:
  """A cached call of a step with a host callback: no C++ entry can run it, so `jax.jit` runs it
  from Python, and donate finds its program again by the call's key. Rounds alternate the two."""
  def step(params):
    jax.debug.callback(lambda: None)
    return {k: v * 2.0 + 1.0 for k, v in params.items()}

  funs = {"jax": jax.jit(step, donate_argnums=0), "donate": donate.jit(step, donate_argnums=0)}
  state = {k: _params(n) for k in funs}
  for k, g in funs.items():
    for _ in range(10):
      state[k] = g(state[k])
  times = _alternating(funs, state, rounds, calls)
  ours, theirs = times["donate"], times["jax"]
  return (f"cached call of a {n}-leaf step with a host callback, median of {rounds} rounds of "
          f"{calls}: donate.jit {ours * 1e6:.1f} us, jax.jit {theirs * 1e6:.1f} us "
          f"({ours / theirs:.2f}x)")


def in_place_program_call(n: int = 10, rounds: int = 40, calls: int = 1000, size: int = 64) -> str:
  """The re-paired cached call of `n` leaves, split into program and dispatch: `jax.jit`'s own in-place
  program (outputs in input order) against its copying one (the re-paired step, first come, first
  served), and donate's in-place program of the re-paired step through donate's dispatch, on
  float32[size] leaves. Rounds alternate the four."""
  funs = {
    "jax.jit native (in place)": jax.jit(_step_factory(0.5), donate_argnums=0),
    "jax.jit re-paired step (copies)": jax.jit(_step_factory(0.5, True), donate_argnums=0),
    "donate.jit re-paired (in place)": donate.jit(
      _step_factory(0.5, True), donate_argnums=0, copy_threshold=0
    ),
    "donate.jit native (in place)": donate.jit(_step_factory(0.5), donate_argnums=0),
  }
  state = {k: _params(n, size) for k in funs}
  for k, g in funs.items():
    for _ in range(50):
      state[k] = g(state[k])
  times = _alternating(funs, state, rounds, calls)
  cells = ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in times.items())
  return (f"cached call of a {n}-leaf step (float32[{size}] leaves), median of {rounds} rounds "
          f"of {calls}: {cells}")


def _paired(n: int, what: str, pairs: int, path: str, warmup: int = 3) -> tuple[list, list]:
  """`pairs` pairs of fresh-function samples of `what` (`lower()` or the first call), after
  `warmup` pairs, the order alternating: `jax.jit`'s and donate's seconds, pair by pair."""
  theirs, ours = [], []
  for k in range(-warmup, pairs):
    t_ours = None if k % 2 else _once(donate.jit, n, what, k + 0.75, path)
    t_jax = _once(jax.jit, n, what, k + 0.25, path)
    if t_ours is None:
      t_ours = _once(donate.jit, n, what, k + 0.75, path)
    if k >= 0:
      theirs.append(t_jax), ours.append(t_ours)
  return theirs, ours


def _interleaved(funs: dict, state: dict, rounds: int, calls: int) -> dict:
  """Seconds a cached call of each of `funs` (each fed its own result, `state`), round by round:
  `rounds` rounds of `calls` calls, the functions' order reversed every other round, each
  sample after `gc.collect()`."""
  times: dict = {k: [] for k in funs}
  for r in range(rounds):
    for k in list(funs) if r % 2 else list(funs)[::-1]:
      p, g = jax.block_until_ready(state[k]), funs[k]
      gc.collect()
      t0 = time.perf_counter()
      for _ in range(calls):
        p = g(p)
      state[k] = jax.block_until_ready(p)
      times[k].append((time.perf_counter() - t0) / calls)
  return times


def _warm(funs: dict, n: int, size: int) -> dict:
  """Fresh parameters for each of `funs`, after 20 calls of it."""
  state = {k: _params(n, size) for k in funs}
  for k, g in funs.items():
    for _ in range(20):
      state[k] = g(state[k])
  return state


def _order(donate_first: bool) -> tuple:
  """The order in which a run makes, compiles and feeds its two sides."""
  return (donate.jit, jax.jit) if donate_first else (jax.jit, donate.jit)


def _cached_rounds(
  n: int, rounds: int, path: str, donated=0, donate_first=False
) -> tuple[list, list]:
  """One warm function of each, `rounds` interleaved rounds of `_cached_calls(n)` calls:
  `jax.jit`'s and donate's seconds a call, round by round. Both functions are made, compiled and
  given their parameters in one order, `jax.jit`'s first unless `donate_first`."""
  funs = {
    jit: _jit_for(jit, path)(_step_factory(0.5, path != "native"), donate_argnums=donated)
    for jit in _order(donate_first)
  }
  times = _interleaved(funs, _warm(funs, n, PATHS[path][1]), rounds, _cached_calls(n))
  return times[jax.jit], times[donate.jit]


CALLS = ("jax.jit", "donate.jit", "its dispatch alone", "jax.jit behind one frame")


def call_variants(n: int, path: str = "native", donate_first: bool = False) -> dict:
  """The `n`-leaf step of `path` (donated) called four ways (`CALLS`), each compiled: `jax.jit`'s
  call; donate.jit's (its C++ dispatch behind the `__call__` property and the one frame that
  names an array passed twice); that dispatch called directly; `jax.jit`'s behind one Python
  frame of the same form as donate's. `jax.jit`'s is made and compiled first unless
  `donate_first`."""
  step = _step_factory(0.5, path != "native")
  made = {jit: _jit_for(jit, path)(step, donate_argnums=0) for jit in _order(donate_first)}
  for g in made.values():  # each compiled; donate's call is then the checked one
    g(_params(n, PATHS[path][1]))
  jitted, ours = made[jax.jit], made[donate.jit]

  def one_frame(*args, **kwargs):
    try:
      return jitted(*args, **kwargs)
    except BaseException:
      raise

  return dict(zip(CALLS, (jitted, ours, ours._dispatch, one_frame)))


def frame_share(n: int, rounds: int) -> str:
  """The cached call of the `n`-leaf native step split (`call_variants`), each way against
  `jax.jit`'s own call in the same rounds."""
  funs = call_variants(n)
  times = _interleaved(funs, _warm(funs, n, 64), rounds, _cached_calls(n))
  cells = []
  for k in CALLS[1:]:
    ratios = [o / t for o, t in zip(times[k], times["jax.jit"])]
    q1, q3 = _quartiles(ratios)
    cells.append(f"{k} {statistics.median(ratios):.3f}x ({q1:.2f}-{q3:.2f})")
  return (f"Cached call of the {n}-leaf native step, {rounds} rounds: `jax.jit` "
          f"{statistics.median(times['jax.jit']) * 1e6:.1f} us; " + ", ".join(cells))


def _quartiles(values: list[float]) -> tuple[float, float]:
  v = sorted(values)
  return v[int(0.25 * (len(v) - 1))], v[int(0.75 * (len(v) - 1))]


def _cell(theirs: list, ours: list, unit: float, digits: int) -> str:
  """`jax.jit`'s median time, then the median ratio of the pairs with its quartiles."""
  ratios = [o / t for o, t in zip(ours, theirs)]
  q1, q3 = _quartiles(ratios)
  return (f"{statistics.median(theirs) * unit:.{digits}f} | {statistics.median(ratios):.3f}x "
          f"({q1:.2f}-{q3:.2f})")


def paired_table(
  sizes, pairs: int, rounds: int, paths=DEFAULT_PATHS, min_pairs: int = 5, rounds_10000: int = 0
) -> str:
  """Every size and path: `lower()` and the first call over interleaved pairs of fresh functions
  (`pairs` up to 100 leaves, a fifth of it at 1000, a tenth at 10,000; at least `min_pairs`: a
  first call of 10,000 leaves whose program copies every buffer compiles for minutes; no warm-up
  pairs at 10,000), and the cached call over `rounds` interleaved rounds of two warm functions
  (`rounds_10000` at 10,000 when given). Each cell: `jax.jit`'s median time, then the median of
  the pairs' (rounds') ratios with their quartiles."""
  rows = []
  for n in sizes:
    p = pairs if n <= 100 else max(min_pairs, pairs // (5 if n <= 1000 else 10))
    r = rounds_10000 if n >= 10_000 and rounds_10000 else rounds
    for path in paths:
      warmup = 3 if n < 10_000 else 0  # a pair there is seconds to minutes; smaller sizes warmed
      cells = [
        _cell(*_paired(n, what, p, path, warmup), 1e3, 1) for what in ("lower()", "first call")
      ]
      cells.append(_cell(*_cached_rounds(n, r, path), 1e6, 1))
      rows.append(f"| {n} | {path} | {p} / {r} | " + " | ".join(cells) + " |")
      print(rows[-1], file=sys.stderr, flush=True)  # progress: a row of 10,000 leaves is minutes
  jax_us, ratio = _cell(*_cached_rounds(10, rounds, "native", donated=None), 1e6, 1).split(" | ")
  undonated = (f"Cached call of the 10-leaf native step donating nothing (no frame of donate's "
               f"before the dispatch), {rounds} rounds: `jax.jit` {jax_us} us, ratio {ratio}")
  head = ("| leaves | path | pairs / rounds | `jax.jit` `lower()` ms | ratio | `jax.jit` first "
          "call ms | ratio | `jax.jit` cached call us | ratio |")
  title = (f"Interleaved pairs of fresh functions (`lower()`, first call) and {rounds} "
           f"interleaved rounds of warm ones (cached call); ratio: median (quartiles)")
  frame = frame_share(10, rounds)
  table = [title, "", head, "|---|---|---|---|---|---|---|---|---|", *rows, "", undonated, "",
           frame]
  return "\n".join(table)


def lower_pairs(sizes, pairs: int, paths=DEFAULT_PATHS) -> str:
  """`lower()` of fresh functions, `pairs` pairs a size and path in alternating order (after 5
  pairs of warm-up): the medians of `jax.jit`'s time, donate's difference and the ratio."""
  rows = []
  for n in sizes:
    for path in paths:
      theirs, ours = _paired(n, "lower()", pairs, path, warmup=5)
      diffs = sorted(o - t for o, t in zip(ours, theirs))
      ratios = [o / t for o, t in zip(ours, theirs)]
      q1, q3 = (q * 1e3 for q in _quartiles(diffs))
      rows.append(f"| {n} | {path} | {statistics.median(theirs) * 1e3:.2f} | "
                  f"{statistics.median(diffs) * 1e3:.2f} ({q1:.2f} to {q3:.2f}) | "
                  f"{statistics.median(ratios):.3f}x |")
  head = "| leaves | path | jax.jit ms | donate's difference ms (quartiles) | ratio |"
  title = f"`lower()` of fresh functions, medians of {pairs} pairs in alternating order"
  return "\n".join([title, "", head, "|---|---|---|---|---|", *rows])


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="10,100,1000,10000")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--layers", type=int, default=24)
  parser.add_argument("--own-repeats", type=int, default=1)
  parser.add_argument("--paths", default=",".join(DEFAULT_PATHS), help=", ".join(PATHS))
  parser.add_argument("--lower-pairs", type=int, default=0)
  parser.add_argument("--pairs", type=int, default=0)
  parser.add_argument("--rounds", type=int, default=41)
  parser.add_argument("--min-pairs", type=int, default=5)
  parser.add_argument("--rounds-10000", type=int, default=0, help="cached-call rounds at 10,000")
  args = parser.parse_args(argv)
  print(f"Machine: {_demo.machine()}\n")
  if args.pairs:
    sizes = [int(s) for s in args.sizes.split(",")]
    paths = tuple(args.paths.split(","))
    print(paired_table(sizes, args.pairs, args.rounds, paths, args.min_pairs, args.rounds_10000))
    return
  if args.lower_pairs:
    sizes = [int(s) for s in args.sizes.split(",")]
    print(lower_pairs(sizes, args.lower_pairs, tuple(args.paths.split(","))))
    return
  print(table([int(s) for s in args.sizes.split(",")], args.repeats,
              tuple(args.paths.split(","))), "\n")
  print(own_share(args.layers, args.own_repeats))
  print(host_callback_call())
  print(in_place_program_call())


if __name__ == "__main__":
  main()
