"""Property-based equivalence of `donate.jit` with `jax.jit` (issue 7).

Hypothesis draws a pytree of input arrays (scalars, zero-size arrays; float32, bfloat16, int32,
bool) and a random straight-line program over them: elementwise ops, `.at[].set`, reductions,
reshapes, dtype conversions, `lax.scan` (carry and xs), `lax.cond`, nested `jax.jit` (with and
without its own `donate_argnums`), nested `donate.jit`, `donate.donate_buffer` and `donate.alias`
(each inside and outside the nested bodies), with random `donate_argnums`. The generator obeys
the documented rules (a value given up by an annotation is never read again; `alias` only between
one shape and dtype, never input to input, one aliased source per output). A program in which an
`alias` alone gives up a buffer no output of its type takes is refused by the documented error,
which names only such inputs and consumes nothing (`check_unheld_alias`). For every other one:

* the outputs equal `jax.jit(f)` without donation, bit for bit;
* `g.plan` on copies consumes nothing;
* donate.jit warns of a leaf `donate_argnums` donates only where `jax.jit` warns of one of its type;
* after the call, every leaf the plan says is consumed is deleted, every other input leaf is alive
  and unchanged, and every aliased output really lives in its input's buffer.

`DONATE_PROPERTY_SCALE` draws more examples at random (`test_pairing_never_worse.settings`).
"""

import collections
import dataclasses
import re
import warnings

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jax import lax
from test_pairing_never_worse import settings

import donate

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier

SHAPES = [(), (0,), (1,), (3,), (2, 3)]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.int32, jnp.bool_]
SETTINGS = settings(200)


# ---- the program model ------------------------------------------------------------------------

@dataclasses.dataclass
class Value:
  """What the generator knows about a value: its type, which input buffer it *is* (if any), and
  which inputs an explicit alias ties it to (over-approximated, see `Builder.derive`)."""
  shape: tuple
  dtype: object
  origin: int | None = None
  taint: frozenset = frozenset()
  alive: bool = True


def unary(x, variant=0):
  """A shape- and dtype-preserving op that always makes a new value."""
  if x.dtype == jnp.bool_:
    return ~x if variant % 2 == 0 else x ^ (jnp.ones_like(x) if variant == 1 else ~x)
  if jnp.issubdtype(x.dtype, jnp.integer):
    return x * 3 + 1 if variant % 2 == 0 else x - 2
  return x * 1.5 + 0.25 if variant % 2 == 0 else jnp.sin(x)


def binary(x, y, variant=0):
  if x.dtype == jnp.bool_:
    return x ^ y if variant % 2 == 0 else x & y
  return x + y if variant % 2 == 0 else x * y


def reduce(x):
  return jnp.any(x, axis=0) if x.dtype == jnp.bool_ else jnp.sum(x, axis=0)


def reshaped(shape):
  if len(shape) == 0:
    return (1,)
  if len(shape) == 1:
    return (1, shape[0])
  return (int(np.prod(shape)),)


def constant(dtype):
  return jnp.asarray(True if dtype == jnp.bool_ else 7, dtype)


class Builder:
  """Draws a legal program and its metadata; `ops` is replayed by `run` on real values."""

  def __init__(self, data, specs):
    self.data = data
    self.values = [Value(s, d, origin=i) for i, (s, d) in enumerate(specs)]
    self.ops = []
    self.alias_roots = set()  # the inputs an explicit alias gives up

  def draw(self, strategy, label):
    return self.data.draw(strategy, label=label)

  def alive(self, pred=lambda v: True):
    return [i for i, v in enumerate(self.values) if v.alive and pred(v)]

  def pick(self, label, pred=lambda v: True):
    choices = self.alive(pred)
    return self.draw(st.sampled_from(choices), label) if choices else None

  def derive(self, shape, dtype, *operands, keep_taint=True):
    # Explicit-alias ties survive any op whose result has an operand's shape (the library keeps
    # them through elementwise ops, updates, loop carries and branches); tracking them through
    # every same-shape result over-approximates that, so the outputs chosen stay legal.
    taint = frozenset().union(*(self.values[i].taint for i in operands
                                if self.values[i].shape == shape)) if keep_taint else frozenset()
    self.values.append(Value(shape, dtype, None, taint))
    return len(self.values) - 1

  def consume(self, i):
    self.values[i].alive = False

  def step(self):
    kinds = ["unary", "binary", "set", "reduce", "reshape", "convert", "scan_carry", "scan_xs",
             "cond", "jit", "donate_jit", "donate_buffer", "alias", "alias"]
    kind = self.draw(st.sampled_from(kinds), "op")
    getattr(self, "op_" + kind)()

  def op_unary(self):
    i = self.pick("x")
    v = self.values[i]
    self.ops.append(("unary", i, self.draw(st.integers(0, 3), "variant")))
    self.derive(v.shape, v.dtype, i)

  def op_binary(self):
    i = self.pick("x")
    v = self.values[i]
    j = self.pick("y", lambda w: w.shape == v.shape and w.dtype == v.dtype)
    self.ops.append(("binary", i, j, self.draw(st.integers(0, 1), "variant")))
    self.derive(v.shape, v.dtype, i, j)

  def op_set(self):
    # On an empty array `.at[0].set` gives back its operand itself (the same tracer), which the
    # builder would track as a new value: only arrays with elements are updated.
    i = self.pick("x", lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    if i is None:
      return
    v = self.values[i]
    self.ops.append(("set", i))
    self.derive(v.shape, v.dtype, i)

  def op_reduce(self):
    i = self.pick("x", lambda v: len(v.shape) >= 1)
    if i is None:
      return
    v = self.values[i]
    self.ops.append(("reduce", i))
    self.derive(v.shape[1:], v.dtype, i)

  def op_reshape(self):
    i = self.pick("x")
    v = self.values[i]
    self.ops.append(("reshape", i))
    self.derive(reshaped(v.shape), v.dtype, i)

  def op_convert(self):
    i = self.pick("x")
    v = self.values[i]
    dtype = self.draw(st.sampled_from([d for d in DTYPES if d != v.dtype]), "dtype")
    self.ops.append(("convert", i, dtype))
    self.derive(v.shape, dtype, i)

  def op_scan_carry(self):
    i = self.pick("x")
    v = self.values[i]
    inner_donate = self.draw(st.booleans(), "donate_buffer in body")
    self.ops.append(("scan_carry", i, self.draw(st.integers(0, 3), "length"), inner_donate))
    self.derive(v.shape, v.dtype, i)

  def op_scan_xs(self):
    i = self.pick("x", lambda v: len(v.shape) >= 1)
    if i is None:
      return
    v = self.values[i]
    self.ops.append(("scan_xs", i))
    self.derive(v.shape[1:], v.dtype, keep_taint=False)  # the carry starts from zeros
    self.derive(v.shape, v.dtype, i)  # ys

  def op_cond(self):
    i = self.pick("x")
    v = self.values[i]
    p = self.pick("predicate source")
    self.ops.append(("cond", i, p, self.draw(st.integers(0, 3), "variant")))
    self.derive(v.shape, v.dtype, i)

  def op_jit(self):
    i = self.pick("x")
    v = self.values[i]
    self.ops.append(("jit", i, self.draw(st.booleans(), "inner donate_argnums"),
                     self.draw(st.booleans(), "donate_buffer inside")))
    self.derive(v.shape, v.dtype, i)

  def op_donate_jit(self):
    i = self.pick("x")
    v = self.values[i]
    self.ops.append(("donate_jit", i))
    self.consume(i)  # a nested donate.jit donates at the call site: x is given up
    self.derive(v.shape, v.dtype, i)

  def op_donate_buffer(self):
    i = self.pick("x")
    v = self.values[i]
    self.ops.append(("donate_buffer", i))
    self.consume(i)
    self.values.append(Value(v.shape, v.dtype, v.origin, v.taint))

  def op_alias(self):
    src = self.pick("src")
    v = self.values[src]
    same = lambda w: w.shape == v.shape and w.dtype == v.dtype
    k = self.pick("dst from", same)
    if self.draw(st.booleans(), "binary dst"):
      m = self.pick("dst with", same)
      self.ops.append(("binary", k, m, 0))
      dst = self.derive(v.shape, v.dtype, k, m)
    else:
      self.ops.append(("unary", k, 0))
      dst = self.derive(v.shape, v.dtype, k)
    self.ops.append(("alias", src, dst))
    if v.origin is not None:
      self.alias_roots.add(v.origin)
    self.consume(src)
    self.consume(dst)
    root = frozenset() if v.origin is None else frozenset([v.origin])
    self.values.append(Value(v.shape, v.dtype, v.origin, self.values[dst].taint | root))

  def outputs(self):
    """Alive values to return, at most one per explicit-alias root."""
    wanted = self.draw(st.lists(st.sampled_from(self.alive()), max_size=5), "outputs")
    chosen, roots = [], set()
    for i in wanted:
      if self.values[i].taint & roots:
        continue
      roots |= self.values[i].taint
      chosen.append(i)
    return chosen


def run(ops, leaves, outputs, as_dict):
  """Replays a drawn program on real (traced) values."""
  env = list(leaves)
  for op in ops:
    kind, args = op[0], op[1:]
    if kind == "unary":
      env.append(unary(env[args[0]], args[1]))
    elif kind == "binary":
      env.append(binary(env[args[0]], env[args[1]], args[2]))
    elif kind == "set":
      x = env[args[0]]
      env.append(x.at[0].set(constant(x.dtype)))
    elif kind == "reduce":
      env.append(reduce(env[args[0]]))
    elif kind == "reshape":
      x = env[args[0]]
      env.append(x.reshape(reshaped(x.shape)))
    elif kind == "convert":
      env.append(env[args[0]].astype(args[1]))
    elif kind == "scan_carry":
      i, length, inner_donate = args

      def body(c, _):
        if inner_donate:
          c = donate.donate_buffer(c)
        return unary(c, 1 if c.dtype == jnp.bool_ else 0), None

      env.append(lax.scan(body, env[i], None, length=length)[0])
    elif kind == "scan_xs":
      x = env[args[0]]

      def body(c, row):
        return binary(c, row), unary(row)

      carry, ys = lax.scan(body, jnp.zeros(x.shape[1:], x.dtype), x)
      env += [carry, ys]
    elif kind == "cond":
      i, p, variant = args
      pred = jnp.any(env[p] != 0)
      env.append(lax.cond(pred, lambda v: unary(v, variant), lambda v: unary(v, variant + 1),
                          env[i]))
    elif kind == "jit":
      i, inner_donate, annotate = args

      def inner(v):
        if annotate:
          v = donate.donate_buffer(v)
        return unary(v)

      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env.append(jax.jit(inner, donate_argnums=(0,) if inner_donate else ())(env[i]))
    elif kind == "donate_jit":
      env.append(donate.jit(unary, donate_argnums=0)(env[args[0]]))
    elif kind == "donate_buffer":
      env.append(donate.donate_buffer(env[args[0]]))
    elif kind == "alias":
      env.append(donate.alias(env[args[0]], env[args[1]]))
    else:
      raise AssertionError(kind)
  if as_dict:
    return {f"o{k}": env[i] for k, i in enumerate(outputs)}
  return tuple(env[i] for i in outputs)


# ---- drawing inputs ---------------------------------------------------------------------------

def make_value(rng, shape, dtype):
  if dtype == jnp.bool_:
    host = rng.random(shape) < 0.5
  elif dtype == jnp.int32:
    host = rng.integers(-5, 6, shape)
  else:
    host = rng.integers(-8, 9, shape) / 4.0
  return on_device(jnp.asarray(host, dtype))


def on_device(x):
  """A device-owned copy (a CPU array made from numpy may share host memory: not donatable)."""
  return jax.jit(jnp.copy)(x)


@st.composite
def arguments(draw):
  """A tuple of arguments: each a leaf, a dict of leaves or a list of leaves; and leaf specs."""
  spec = st.tuples(st.sampled_from(SHAPES), st.sampled_from(DTYPES))
  arg = st.one_of(spec.map(lambda s: ("leaf", s)),
                  st.dictionaries(st.sampled_from("abc"), spec, min_size=1, max_size=3)
                  .map(lambda d: ("dict", d)),
                  st.lists(spec, min_size=1, max_size=2).map(lambda l: ("list", l)))
  return draw(st.lists(arg, min_size=1, max_size=3))


def build(structure, rng):
  args = []
  for kind, content in structure:
    if kind == "leaf":
      args.append(make_value(rng, *content))
    elif kind == "dict":
      args.append({k: make_value(rng, *s) for k, s in content.items()})
    else:
      args.append([make_value(rng, *s) for s in content])
  return tuple(args)


def copies(tree):
  return jax.tree.map(on_device, tree)


def specs_of(args):
  return [(tuple(x.shape), x.dtype) for x in jax.tree.leaves(args)]


# ---- the property -----------------------------------------------------------------------------

def check_program(data, structure, seed, n_steps):
  rng = np.random.default_rng(seed)
  args = build(structure, rng)
  builder = Builder(data, specs_of(args))
  for _ in range(n_steps):
    builder.step()
  outputs = builder.outputs()
  as_dict = data.draw(st.booleans(), label="dict output")
  ops = tuple(builder.ops)
  donate_argnums = tuple(data.draw(st.sets(st.integers(0, len(args) - 1)), label="donate_argnums"))
  hypothesis.note(f"ops={ops}\noutputs={outputs} donate_argnums={donate_argnums}")

  def f(*args):  # named as the plan names them: args[0], ...
    return run(ops, jax.tree.leaves(args), outputs, as_dict)

  host_before = [np.asarray(x).copy() for x in jax.tree.leaves(args)]
  expect = jax.jit(f)(*copies(args))
  g = donate.jit(f, donate_argnums=donate_argnums)
  spare = copies(args)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", donate.UnusableDonationWarning)
    try:
      plan = g.plan(*spare)
    except donate.DonationError as e:
      return check_unheld_alias(e, g, args, spare, builder.alias_roots, donate_argnums)
    for x in jax.tree.leaves(spare):
      assert not x.is_deleted()  # plan consumes nothing
    check_warned_as_jax_jit(f, args, donate_argnums)
    leaves = jax.tree.leaves(args)
    pointers = [x.unsafe_buffer_pointer() for x in leaves]
    out = g(*args)
  hypothesis.note(str(plan))
  for d in plan.decisions:
    hypothesis.event(f"action {d.action}" + (f" ({d.source.split(' at ')[0]})" if d.requested
                                             else ""))
  # Outputs equal jax.jit's, leaf for leaf and bit for bit.
  assert jax.tree.structure(out) == jax.tree.structure(expect)
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expect)):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # Consumed leaves are deleted; every other leaf is alive and unchanged.
  assert len(plan.decisions) == len(leaves)
  out_by_path = {path: x for path, x in zip(
      [o.path for o in plan.outputs], jax.tree.leaves(out))}
  for d, x, old, ptr in zip(plan.decisions, leaves, host_before, pointers):
    if d.consumed:
      assert x.is_deleted(), d
    else:
      assert not x.is_deleted(), d
      np.testing.assert_array_equal(np.asarray(x), old)
    if d.action == "aliased" and d.nbytes > 0:
      assert out_by_path[d.output].unsafe_buffer_pointer() == ptr, d
    if d.requested is False:
      assert d.action == "kept", d
  # And the cached call (fast path) agrees too.
  again = jax.tree.unflatten(jax.tree.structure(args), [
      on_device(jnp.asarray(h, x.dtype)) for h, x in zip(host_before, leaves)])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", donate.UnusableDonationWarning)
    out2 = g(*again)
  for got, want in zip(jax.tree.leaves(out2), jax.tree.leaves(expect)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for d, x in zip(plan.decisions, jax.tree.leaves(again)):
    assert x.is_deleted() == d.consumed, d


def unusable_types(caught, donated=None) -> collections.Counter:
  """The types an unusable-donation warning lists (`donated`: only those of leaves whose path
  starts with one of these; donate's warning names each leaf's path, `jax.jit`'s none)."""
  found = collections.Counter()
  for w in caught:
    line = str(w.message).split("\n")[0]
    if not line.startswith("Some donated buffers were not usable"):
      continue
    if donated is None:
      found.update(re.findall(r"\w+\[[^\]]*\]", line))
    else:
      found.update(t for t, path in re.findall(r"(\w+\[[^\]]*\]) \(([^)]*)\)", line)
                   if path.startswith(donated))
  return found


def check_warned_as_jax_jit(f, args, donate_argnums):
  """donate.jit warns of a leaf `donate_argnums` donates only where `jax.jit` warns of one of
  its type (it may warn of fewer: a better pairing uses more; its own annotations are its own),
  or where a leaf that only donate's annotations donate (`jax.jit` ignores them) took an output
  `jax.jit` would have given it: one of as many elements (`jax.jit` pairs a donated leaf with an
  output of its type, and a leaf left over with any output left of as many elements, which XLA
  may reuse: no warning)."""
  caught = {}
  for jit in (jax.jit, donate.jit):
    with warnings.catch_warnings(record=True) as caught[jit]:
      warnings.simplefilter("always")
      jit(f, donate_argnums=donate_argnums).lower(*copies(args))
  asked = tuple(f"args[{k}]" for k in donate_argnums)
  extra = unusable_types(caught[donate.jit], asked) - unusable_types(caught[jax.jit])
  if not extra:
    return
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    plan = donate.jit(f, donate_argnums=donate_argnums).plan(*copies(args))
  taken = collections.Counter(
    int(np.prod(d.shape))
    for d in plan.decisions
    if d.action == "aliased" and not d.path.startswith(asked)
  )
  extra_elements = collections.Counter(
    int(np.prod([int(n) for n in re.findall(r"\d+", t.split("[", 1)[1])]))
    for t in extra.elements()
  )
  assert not extra_elements - taken, ([str(w.message) for w in caught[donate.jit]], str(plan))
  hypothesis.event("a donated leaf's output taken by an annotated leaf: warned")


def check_unheld_alias(error, g, args, spare, alias_roots, donate_argnums):
  """A drawn program whose explicit alias no output can take (its value returned only in
  another dtype or shape, or not at all while the input is read): the documented error, naming
  only inputs that an alias alone gave up, raised by the plan and by the call with every input
  alive."""
  flat = jax.tree_util.tree_flatten_with_path(args)[0]
  paths = ["args" + jax.tree_util.keystr(k) for k, _ in flat]
  text = str(error)
  assert text.startswith("donate: Some donated buffers were not usable"), text
  named = re.findall(r"^  (\S[^:]*): ", text, re.M)
  assert named and set(named) <= {paths[r] for r in alias_roots}, (named, alias_roots)
  assert not any(p.startswith(f"args[{k}]") for p in named for k in donate_argnums), named
  with pytest.raises(donate.DonationError, match="Some donated buffers were not usable"):
    g(*args)
  for x in jax.tree.leaves((spare, args)):
    assert not x.is_deleted()
  hypothesis.event("an explicit alias no output can take: refused")


@SETTINGS
@hypothesis.given(data=st.data(), structure=arguments(), seed=st.integers(0, 2**16),
                  n_steps=st.integers(1, 12))
def test_random_programs_match_jax_jit_and_consume_exactly_the_plan(data, structure, seed,
                                                                    n_steps):
  check_program(data, structure, seed, n_steps)


@pytest.mark.parametrize("seed", range(3))
def test_a_fixed_program_with_every_op_kind(seed):
  """A deterministic program using every op kind (guards the generator itself)."""
  specs = [((2, 3), jnp.float32), ((2, 3), jnp.float32), ((3,), jnp.int32), ((), jnp.bool_),
           ((0,), jnp.bfloat16)]
  rng = np.random.default_rng(seed)
  args = tuple(make_value(rng, s, d) for s, d in specs)
  ops = (("unary", 0, 0), ("binary", 0, 1, 0), ("set", 5), ("reduce", 6), ("reshape", 2),
         ("convert", 2, jnp.float32), ("scan_carry", 1, 2, True), ("scan_xs", 0),
         ("cond", 10, 3, 1), ("jit", 2, True, False), ("donate_jit", 4),
         ("donate_buffer", 3), ("unary", 0, 1), ("alias", 0, 18))
  outputs = [19, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17]

  def f(*args):  # named as the plan names them: args[0], ...
    return run(ops, list(args), outputs, False)

  host = [np.asarray(x).copy() for x in args]
  expect = jax.jit(f)(*copies(args))
  g = donate.jit(f, donate_argnums=(1,), adopt_inner_donation=True)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", donate.UnusableDonationWarning)
    plan = g.plan(*copies(args))
    out = g(*args)
  for got, want in zip(out, expect):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  sources = {d.path: d.source.split(" at ")[0] for d in plan.decisions}
  assert sources == {"args[0]": "alias", "args[1]": "donate_argnums",
                     "args[2]": "inner jit donation", "args[3]": "donate_buffer",
                     "args[4]": "donate_buffer"}
  for d, x, old in zip(plan.decisions, args, host):
    assert x.is_deleted() == d.consumed
    if not d.consumed:
      np.testing.assert_array_equal(np.asarray(x), old)
  assert plan.decisions[0].action == "aliased" and plan.decisions[0].output == "out[0]"
