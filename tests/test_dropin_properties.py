"""Whatever `jax.jit` accepts, `donate.jit` accepts alike: any Python signature and any pytree,
drawn at random and run under both.

A signature mixes positional-only, positional-or-keyword and keyword-only parameters, defaults,
`*args` and `**kwargs`; `donate_argnums` (negative numbers and a bare int too),
`donate_argnames` (names the function does not have too), `static_argnums` and
`static_argnames`; the call passes arguments by position or by name, or leaves defaults out. A
pytree nests dicts, lists, tuples, namedtuples, a registered class, a registered dataclass with a
static field, `None` and empty tuples, over device arrays of several dtypes and shapes, numpy
arrays and Python scalars, returned scaled, shuffled, beside their sum, as their sum alone, or
as given.

Each example runs under `jax.jit` and `donate.jit` with fresh arrays and compares: where building
or calling fails, the same exception (donate's may be a subclass of JAX's, as `DonationError` is
of `ValueError`); the results, bitwise, in the same structure; which arrays the call consumed; and
whether JAX's unusable-donation warning (or donate's, which starts alike) was given; and that the
plan asks for exactly the leaves `jax.jit` reports donated (`args_info`), which `jax.jit`'s own
program would hide where it runs the call.
"""

import collections
import dataclasses
import random
import warnings

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from test_pairing_never_worse import settings

import donate

# ---- signatures ----------------------------------------------------------------------------------


def _source(params, varargs: bool, varkw: bool) -> str:
  """`def f(...)` with `params` ((name, kind, has default), kinds in order), returning each
  argument that is not None scaled, then `args` and `kwargs` (by name) shifted."""
  written = lambda p: f"{p[0]}=None" if p[2] else p[0]  # noqa: E731
  parts = [written(p) for p in params if p[1] == "positional"]
  parts += ["/"] if parts else []
  parts += [written(p) for p in params if p[1] == "either"]
  keyword = [written(p) for p in params if p[1] == "keyword"]
  parts += ["*args"] if varargs else (["*"] if keyword else [])
  parts += keyword + (["**kwargs"] if varkw else [])
  body = [f"  if {name} is not None: out.append({name} * 2.0)" for name, _, _ in params]
  body += ["  out += [a + 1.0 for a in args]"] if varargs else []
  body += ["  out += [kwargs[k] - 1.0 for k in sorted(kwargs)]"] if varkw else []
  return "\n".join([f"def f({', '.join(parts)}):", "  out = []", *body, "  return out"])


@st.composite
def signatures(draw):
  """`(source, jit options, call)`: a function's text, the options of both jits and the call
  (`[(name or None, is static)]` for each argument passed, None: by position)."""
  n = draw(st.integers(1, 4))
  kinds = sorted(draw(st.lists(st.sampled_from(["positional", "either", "keyword"]),
                               min_size=n, max_size=n)),
                 key=["positional", "either", "keyword"].index)  # fmt: skip
  params, defaulted = [], False
  for i, kind in enumerate(kinds):  # after a default, every positional parameter has one
    default = draw(st.booleans()) or (defaulted and kind != "keyword")
    defaulted = defaulted or (default and kind != "keyword")
    params.append((f"p{i}", kind, default))
  varargs, varkw = draw(st.booleans()), draw(st.booleans())
  names = [p[0] for p in params]
  inside = st.integers(-len(params), len(params) - 1)
  numbers = st.one_of(inside, inside, st.integers(-len(params) - 2, len(params) + 1))
  options = {}
  if draw(st.sampled_from([False, True, True])):
    options["donate_argnums"] = draw(st.one_of(numbers, st.lists(numbers, max_size=2).map(tuple)))
  if draw(st.booleans()):
    known = st.sampled_from([*names, "missing"])
    options["donate_argnames"] = draw(st.one_of(known, st.lists(known, max_size=2).map(tuple)))
  if draw(st.integers(0, 3)) == 0:
    options["static_argnums"] = (draw(numbers),)
  if draw(st.integers(0, 3)) == 0:
    options["static_argnames"] = (draw(st.sampled_from([*names, "missing"])),)
  call: list = []
  for name, kind, default in params:
    if default and draw(st.booleans()):
      continue  # left to its default
    by_name = kind == "keyword" or (kind == "either" and draw(st.booleans()))
    by_name = by_name or any(k is not None for k, _ in call)  # no position after a name
    call.append((name if by_name else None, False))
  positional = len(names) - kinds.count("keyword")
  if varargs and all(k is None for k, _ in call) and len(call) == positional:
    call += [(None, False)] * draw(st.integers(0, 2))
  if varkw and draw(st.booleans()):
    call.append(("extra", False))
  static_nums, static_names = options.get("static_argnums", ()), options.get("static_argnames", ())
  n_pos = sum(k is None for k, _ in call)
  call = [
    (k, (k is None and (i in static_nums or i - n_pos in static_nums)) or k in static_names)
    for i, (k, _) in enumerate(call)
  ]
  return _source(params, varargs, varkw), options, call


def _bound(call):
  """Fresh arguments for `call`: a float32[4] array each, a Python int where static."""
  args, kwargs = [], {}
  for i, (name, static) in enumerate(call):
    value = 3 if static else jnp.full(4, float(i + 1))
    if name is None:
      args.append(value)
    else:
      kwargs[name] = value
  return args, kwargs


# ---- pytrees -------------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


@jax.tree_util.register_pytree_node_class
class Node:
  """A registered class with metadata (`tag`) beside its two children."""

  def __init__(self, x, y, tag="node"):
    self.x, self.y, self.tag = x, y, tag

  def tree_flatten(self):
    return (self.x, self.y), self.tag

  @classmethod
  def tree_unflatten(cls, tag, children):
    return cls(*children, tag=tag)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
  w: object
  b: object
  name: str = dataclasses.field(default="params", metadata={"static": True})


LEAVES = {  # kind -> a value made from a counter
  "float32[4]": lambda c: jnp.full((4,), c, jnp.float32),
  "float32[2,2]": lambda c: jnp.full((2, 2), c, jnp.float32),
  "bfloat16[4]": lambda c: jnp.full((4,), c, jnp.bfloat16),
  "int32[4]": lambda c: jnp.full((4,), c, jnp.int32),
  "float32[]": lambda c: jnp.full((), c, jnp.float32),
  "numpy float32[4]": lambda c: np.full((4,), c, np.float32),
  "python float": float,
  "python int": int,
}


def trees(depth: int = 0):
  leaf = st.sampled_from([None, *sorted(LEAVES), "float32[4]", "float32[4]"])
  if depth >= 2:
    return leaf
  sub = trees(depth + 1)
  return st.one_of(
    leaf,
    st.dictionaries(st.sampled_from("abc"), sub, min_size=1, max_size=3),
    st.lists(sub, min_size=1, max_size=3),
    st.lists(sub, max_size=2).map(tuple),
    st.tuples(sub, sub).map(lambda t: ("pair", *t)),
    st.tuples(sub, sub).map(lambda t: ("node", *t)),
    st.tuples(sub, sub).map(lambda t: ("params", *t)),
  )


def _built(spec, counter):
  """The pytree `spec` describes, with fresh values (`counter` numbers them)."""
  if spec is None:
    return None
  if isinstance(spec, str):
    counter[0] += 1
    return LEAVES[spec](counter[0])
  if isinstance(spec, dict):
    return {k: _built(v, counter) for k, v in spec.items()}
  if isinstance(spec, list):
    return [_built(v, counter) for v in spec]
  if spec and spec[0] in ("pair", "node", "params"):
    kind = {"pair": Pair, "node": Node, "params": Params}[spec[0]]
    return kind(_built(spec[1], counter), _built(spec[2], counter))
  return tuple(_built(v, counter) for v in spec)


def _step(op: str, shuffle: int):
  def step(*args):
    leaves = jax.tree.leaves(args)
    if op == "scale":
      return jax.tree.map(lambda x: x * 2 + 1, args)
    if op == "shuffle":
      out = [x + 1 for x in leaves]
      random.Random(shuffle).shuffle(out)
      return out
    total = sum(jnp.sum(x.astype(jnp.float32)) for x in leaves) if leaves else 0.0
    if op == "sum":
      return {"sum": total, "rest": [x * 3 for x in leaves[::-1]]}
    if op == "total":  # no output for a donated array to take but a scalar's
      return total
    return args[0]

  return step


# ---- both runs ----------------------------------------------------------------------------------


def _outcome(jit, make, build_fun):
  """`(function, outcome)`: the function `build_fun(jit)` built (None where building failed)
  and what happened, `(stage, exception type or result, consumed, warned)`."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    args, kwargs = make()
    arrays = [x for x in jax.tree.leaves((args, kwargs)) if isinstance(x, jax.Array)]
    try:
      fun = build_fun(jit)
    except Exception as e:
      return None, ("build", type(e), [x.is_deleted() for x in arrays], False)
    try:
      out = fun(*args, **kwargs)
      got = (str(jax.tree.structure(out)), [np.asarray(x).tolist() for x in jax.tree.leaves(out)])
      stage = "ran"
    except Exception as e:
      stage, got = "call", type(e)
  warned = any("donated buffers were not usable" in str(w.message) for w in caught)
  return fun, (stage, got, [x.is_deleted() for x in arrays], warned)


def _assert_alike(jits, make, build_fun):
  """Runs both jits (`_outcome`) and compares; where the call ran, the plan must ask for
  exactly the leaves `jax.jit` donates (`args_info`), leaf by leaf."""
  (their_fun, theirs), (our_fun, ours) = (_outcome(j, make, build_fun) for j in jits)
  assert ours[0] == theirs[0], (theirs, ours)
  if ours[0] == "ran":
    assert ours[1] == theirs[1]
  else:  # the same exception, or a subclass of it
    assert issubclass(ours[1], theirs[1]), (theirs[1], ours[1])
  assert ours[2] == theirs[2], "consumed arrays differ"
  assert ours[3] == theirs[3], "the unusable-donation warning differs"
  if ours[0] == "ran":
    args, kwargs = make()
    donated = [a.donated for a in jax.tree.leaves(their_fun.trace(*args, **kwargs).args_info)]
    assert [d.requested for d in our_fun.trace(*args, **kwargs).plan.decisions] == donated


@settings(80)
@hypothesis.given(signature=signatures())
# A negative static argument number naming the only argument, which donate_argnums names too.
@hypothesis.example(
  signature=(
    _source([("p0", "positional", False)], False, False),
    {"donate_argnums": 0, "static_argnums": (-1,)},
    [(None, True)],
  )
)
def test_any_signature_binds_donates_and_fails_as_in_jax_jit(signature):
  source, options, call = signature

  def build(jit):  # a function of this signature, its own for each jit (no cache shared)
    scope: dict = {}
    exec(source, scope)
    return jit(scope["f"], **options)

  _assert_alike((jax.jit, donate.jit), lambda: _bound(call), build)


@settings(80)
@hypothesis.given(
  specs=st.lists(trees(), min_size=1, max_size=3),
  donated=st.lists(st.sampled_from([False, True, True]), min_size=3, max_size=3),
  op=st.sampled_from(["scale", "shuffle", "sum", "total", "first"]),
  shuffle=st.integers(0, 99),
)
# A donated numpy array no output can take (JAX warns about its copy on the device), and a
# registered class holding an array and a Python scalar beside an int32 array.
@hypothesis.example(specs=["numpy float32[4]"], donated=[True] * 3, op="total", shuffle=0)
@hypothesis.example(
  specs=[("node", "float32[4]", "python float"), "int32[4]"], donated=[True] * 3, op="shuffle",
  shuffle=1,
)  # fmt: skip
def test_any_pytree_of_any_leaves_donates_as_in_jax_jit(specs, donated, op, shuffle):
  donate_argnums = tuple(i for i in range(len(specs)) if donated[i])
  build = lambda jit: jit(_step(op, shuffle), donate_argnums=donate_argnums)  # noqa: E731
  _assert_alike((jax.jit, donate.jit), lambda: (_built(specs, [0]), {}), build)
