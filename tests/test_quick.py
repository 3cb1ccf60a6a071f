"""The quick route (`donate._jit.quick`): a plain signature routed before its plan is made.

* A plain call (device arrays on one device, donation by `donate_argnums` alone, every requested
  leaf paired, a donor or unread) is routed by the quick path: `lower()` and `trace()` make no
  plan, and the plan made when first read is the full planner's, word for word.
* Every call outside that domain (annotations, loops, host values, refs, several devices, stated
  output shardings, strict mode, an unusable donation, marks for symmetric memory) is planned by
  the full planner, as before.
* Property: on random step programs (those of `test_pairing_never_worse`, with calls, unread
  inputs, `keep_unused` and `copy_threshold` drawn too) the quick route is the full planner's
  (the same program, aliases, donated leaves and plan), and it answers wherever the full plan
  has no unusable donation.
"""

import os
import subprocess
import sys
import warnings

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from test_pairing_never_worse import build, inputs, programs, settings

import donate
from donate._jit import quick as _quick
from donate._jit import signature as _signature

N = 1 << 14


def _prepared(fun, *args, **kwargs):
  """`(quick, full)`: the quick route of `fun(*args)` (None when it does not answer) and the full
  planner's `Prepared` for the same trace."""
  fn = fun._fn
  with fn.gate:
    traced = fn.jitted.trace(*args, **kwargs)
  call = fn.binding.bind(args, kwargs)
  return _quick.prepare(fn, call, traced), _signature.prepare(fn, call, traced)


def _assert_same_route(quick, full):
  """The quick route is the full planner's (`quick.check`), and says so on every field read."""
  _quick.check(quick, full)
  assert (quick.native, quick.realiased, quick.jax_own) == (
    full.native,
    full.realiased,
    full.jax_own,
  )
  assert quick.plan.pairs() == full.plan.pairs()


def swapped(a, b):
  return b.at[0].set(1.0), a + 1.0


def test_a_re_paired_lower_makes_no_plan_and_the_plan_made_later_is_the_full_planners():
  g = donate.jit(swapped, donate_argnums=(0, 1))
  a, b = jnp.arange(float(N)), jnp.zeros(N)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # neither JAX's unusable-donation warning nor donate's
    lowered = g.lower(a, b)
  prep = lowered._prep
  assert prep.quick is not None and prep.realiased
  assert isinstance(prep.planned, _signature.LazyPlan) and prep.planned._plan is None
  text = lowered.as_text()
  assert "tf.aliasing_output = 1" in text and "tf.aliasing_output = 0" in text
  assert [d.output for d in lowered.plan.decisions] == ["out[1]", "out[0]"]  # made when read
  assert prep.planned._plan is not None
  quick, full = _prepared(g, a, b)
  _assert_same_route(quick, full)
  # and the call donates as planned: each output lives in the buffer it was paired with
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  x, y = g(a, b)
  assert a.is_deleted() and b.is_deleted()
  assert (x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()) == (pb, pa)
  np.testing.assert_array_equal(np.asarray(y), np.arange(float(N)) + 1)


def test_a_native_signature_and_a_small_difference_run_jax_jits_own_program():
  a, b = jnp.ones(4), jnp.ones(4)
  native = donate.jit(lambda a, b: (a + 1, b * 2), donate_argnums=(0, 1))
  quick, full = _prepared(native, a, b)
  assert quick is not None and quick.jax_own
  _assert_same_route(quick, full)
  small = donate.jit(swapped, donate_argnums=(0, 1))  # 16-byte buffers: under copy_threshold
  quick, full = _prepared(small, a, b)
  assert quick is not None and quick.jax_own
  _assert_same_route(quick, full)
  assert "copy_threshold" in quick.plan.notes[0]


def test_a_call_through_inner_jits_unread_inputs_and_donors_routes_quickly():
  inner = jax.jit(lambda x: jnp.sin(x) * 2)

  def step(p, m, unread, i):
    return inner(m), p - 0.1 * m, i.astype(jnp.float32)

  g = donate.jit(step, donate_argnums=(0, 1, 2, 3), copy_threshold=0)
  args = jnp.ones(N), jnp.ones(N), jnp.ones(N), jnp.ones(N, jnp.int32)
  quick, full = _prepared(g, *args)
  assert quick is not None
  _assert_same_route(quick, full)
  assert quick.dropped == {2}
  assert [str(d.action) for d in full.plan.decisions] == ["aliased", "aliased", "unused", "donor"]


def _donated_in_scan(x):
  return jax.lax.scan(lambda c, _: (c + 1, None), x, None, length=2)[0]


OUTSIDE = {
  "donate_buffer": (lambda x: donate.donate_buffer(x) + 1, {}, lambda: (jnp.ones(N),)),
  "scan": (_donated_in_scan, {}, lambda: (jnp.ones(N),)),
  "cond": (
    lambda x: jax.lax.cond(True, lambda v: v + 1, lambda v: v, x),
    {},
    lambda: (jnp.ones(N),),
  ),
  "host value": (lambda x: x + 1, {}, lambda: (np.ones(N, np.float32),)),
  "strict": (lambda x: x + 1, {"strict": True}, lambda: (jnp.ones(N),)),
  "out_shardings": (
    lambda x: x + 1,
    {"out_shardings": jax.sharding.make_single_device_sharding(jax.devices()[0])},
    lambda: (jnp.ones(N),),
  ),
  "unusable": (lambda x: jnp.sum(x), {}, lambda: (jnp.ones(N),)),
  "with_symmetric": (lambda x: donate.with_symmetric(x, "i") + 1, {}, lambda: (jnp.ones(N),)),
}


@pytest.mark.parametrize("case", sorted(OUTSIDE))
def test_a_call_outside_the_quick_domain_is_planned_by_the_full_planner(case):
  fun, kwargs, args = OUTSIDE[case]
  g = donate.jit(fun, donate_argnums=0, **kwargs)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      quick, _ = _prepared(g, *args())
    except donate.DonationError:  # strict mode's refusal: the full planner's own
      quick = None
  assert quick is None


def test_arrays_over_several_devices_are_planned_by_the_full_planner():
  mesh = jax.make_mesh((8,), ("x",), devices=jax.devices()[:8])
  x = jax.device_put(
    jnp.ones(64), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
  )
  g = donate.jit(lambda x: x + 1, donate_argnums=0)
  quick, full = _prepared(g, x)
  assert quick is None and full.plan.decisions[0].output == "out"


def test_a_ref_is_planned_by_the_full_planner():
  g = donate.jit(lambda r, x: x + r[...], donate_argnums=1)
  quick, _ = _prepared(g, jax.new_ref(jnp.ones(4)), jnp.ones(4))
  assert quick is None


@st.composite
def plain_programs(draw):
  """A program of `test_pairing_never_worse.programs` on one device, maybe with its ops inside
  an inner `jax.jit`, an input no output reads, `keep_unused` and `copy_threshold` drawn."""
  ins, ops, outs, donated = draw(programs())
  options = {
    "keep_unused": draw(st.booleans()),
    "copy_threshold": draw(st.sampled_from([0, 1 << 16, 1 << 20])),
  }
  return ins, ops, outs, donated, draw(st.booleans()), options


@settings(120)
@hypothesis.given(program=plain_programs())
def test_the_quick_route_is_the_full_planners_on_random_programs(program):
  ins, ops, outs, donated, nested, options = program
  device = jax.devices()[0]
  step = build(ops, outs, lambda ndim: jax.sharding.make_single_device_sharding(device))
  body = jax.jit(step) if nested else step
  g = donate.jit(body, donate_argnums=donated, **options)
  args = inputs(ins, lambda ndim: jax.sharding.make_single_device_sharding(device))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    quick, full = _prepared(g, *args)
  if full.plan.unusable:
    assert quick is None
    return
  assert quick is not None, program  # in the domain: it answers
  _assert_same_route(quick, full)


def test_a_registered_collective_is_planned_by_the_full_planner(no_symmetric_requirements):
  mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:1])
  body = jax.shard_map(lambda b: jax.lax.psum(b * 2.0, "i"), mesh=mesh, in_specs=jax.P("i"),
                       out_specs=jax.P())
  x = jnp.ones(8)
  quick, full = _prepared(donate.jit(body, donate_argnums=0), x)
  assert quick is not None  # nothing registered: a plain program (the body walked as a call)
  _assert_same_route(quick, full)
  donate.requires_symmetric(jax.lax.psum)
  quick, full = _prepared(donate.jit(body, donate_argnums=0), x)
  assert quick is None and full.comm


def test_static_arguments_names_keywords_and_closed_over_constants_route_quickly():
  const = jnp.arange(float(N))

  def step(scale, a, *, b):
    return b * scale + const, a + const

  g = donate.jit(step, static_argnums=0, donate_argnames=("a", "b"), copy_threshold=0)
  a, b = jnp.ones(N), jnp.zeros(N)
  quick, full = _prepared(g, 2.0, a, b=b)
  assert quick is not None and quick.realiased and quick.quick.pairs == {0: 1, 1: 0}
  _assert_same_route(quick, full)
  want = jax.jit(step, static_argnums=0)(2.0, a, b=b)
  pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
  got = g(2.0, a, b=b)
  assert a.is_deleted() and b.is_deleted()
  assert (got[0].unsafe_buffer_pointer(), got[1].unsafe_buffer_pointer()) == (pb, pa)
  for x, y in zip(got, want, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


_HOISTED = """
import jax, jax.numpy as jnp, numpy as np
import donate
N = 1 << 14
const = jnp.arange(float(N))
def step(scale, a, *, b):
  return b * scale + const, a + const
g = donate.jit(step, static_argnums=0, donate_argnames=("a", "b"), copy_threshold=0)
a, b = jnp.ones(N), jnp.zeros(N)
want = jax.jit(step, static_argnums=0)(2.0, a, b=b)
pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
text = g.lower(2.0, a, b=b).as_text()
got = g(2.0, a, b=b)
assert a.is_deleted() and b.is_deleted()
assert (got[0].unsafe_buffer_pointer(), got[1].unsafe_buffer_pointer()) == (pb, pa)
for x, y in zip(got, want, strict=True):
  np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
print("jax.const = true" in text)
"""


@pytest.mark.parametrize("hoisted", [False, True], ids=["constants-in-jaxpr", "constants-hoisted"])
def test_a_re_paired_program_with_constants_hoisted_as_arguments(hoisted):
  """With `jax_use_simplified_jaxpr_constants` (the default from jax 0.12.1, read when JAX is
  imported: a fresh process), the closed-over constant is `main`'s first argument and JAX numbers
  it with the argument leaves; the re-paired aliases still go to the leaves they pair."""
  env = {**os.environ, "JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS": str(int(hoisted))}
  run = subprocess.run([sys.executable, "-c", _HOISTED], env=env, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.split()[-1] == str(hoisted)


# The path most small-leaf pytrees take: outputs that do not mirror the donated inputs, leaves
# under the default copy_threshold (64 KiB), so `jax.jit`'s own first-come program runs.
SMALL, LARGE = 64, 1 << 14  # float32 elements: 256 bytes, and 64 KiB (at the threshold)


def _reversed(n):
  return list(range(n))[::-1]


def _shuffled(n):
  return [int(k) for k in np.random.default_rng(0).permutation(n)]


def _step(order):
  """Output j computed from input `order(n)[j]` alone."""
  return lambda xs: [xs[k] * 1.5 + 1.0 for k in order(len(xs))]


def _leaves_of(sizes):
  return [jnp.full((n,), float(k)) for k, n in enumerate(sizes)]


# name -> (the input each output is computed from, `order(n)`; leaf sizes in elements)
NOT_MIRRORED = {
  "reversed": (_reversed, [SMALL] * 12),
  "shuffled": (_shuffled, [SMALL] * 12),
  "mixed sizes around the threshold": (
    _shuffled,
    [LARGE - 1, LARGE, LARGE + 1, SMALL] * 3,  # 64 KiB - 4 bytes, 64 KiB, 64 KiB + 4 bytes
  ),
  "a few large among small": (_reversed, [SMALL] * 5 + [2 * LARGE] + [SMALL] * 5 + [2 * LARGE]),
  "same sizes, large reversed": (_reversed, [2 * LARGE, SMALL, SMALL, 2 * LARGE]),
}


def _routed_small(prep) -> bool:
  """Whether the quick route took `jax.jit`'s first-come pairs from sizes alone (every requested
  leaf under copy_threshold), deciding the plan's pairing when it is made."""
  return prep.quick is not None and prep.planned._make.why is None


@pytest.mark.parametrize("case", sorted(NOT_MIRRORED))
@pytest.mark.parametrize("donated", ["all", "every other", "none"])
def test_outputs_that_do_not_mirror_the_inputs_route_as_the_full_planner(case, donated):
  step, sizes = _step(NOT_MIRRORED[case][0]), NOT_MIRRORED[case][1]
  xs = _leaves_of(sizes)
  g = donate.jit(lambda xs, ys: step(xs) + ys, donate_argnums=(0, 1) if donated == "all" else 1)
  ys = list(xs[::2]) if donated == "every other" else []
  if donated == "every other":
    xs = [x for k, x in enumerate(xs) if k % 2]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # a plain program: nothing unusable, nothing to warn of
    quick, full = _prepared(g, [x.copy() for x in xs], [y.copy() for y in ys])
  assert quick is not None
  small = all(int(x.nbytes) < (1 << 16) for x in (xs if donated == "all" else []) + ys)
  assert _routed_small(quick) == small  # (read before the plan is made)
  _assert_same_route(quick, full)
  assert quick.jax_own == (small or full.jax_own)


@pytest.mark.parametrize("case", sorted(NOT_MIRRORED))
def test_the_not_mirrored_path_donates_and_aliases_as_jax_jit(case):
  """Physically: the call consumes every input, as `jax.jit`'s does; each output under
  copy_threshold lives where `jax.jit`'s does when every leaf is under it (`jax.jit`'s own
  program), and each output of at least copy_threshold bytes in the buffer of the input it is
  computed from (re-paired where `jax.jit` pairs first come, first served)."""
  order, sizes = NOT_MIRRORED[case]
  homes = {}
  for jit in (jax.jit, donate.jit):
    xs = _leaves_of(sizes)
    ptr = {x.unsafe_buffer_pointer(): k for k, x in enumerate(xs)}
    g = jit(_step(order), donate_argnums=0)
    assert "main" in g.lower(xs).as_text()
    out = g(xs)
    assert all(x.is_deleted() for x in xs)
    homes[jit] = [ptr.get(y.unsafe_buffer_pointer()) for y in out]
    for y, w in zip(out, _step(order)(_leaves_of(sizes)), strict=True):
      np.testing.assert_array_equal(np.asarray(y), np.asarray(w))
  large = [j for j, k in enumerate(order(len(sizes))) if 4 * sizes[k] >= 1 << 16]
  if not large:
    assert homes[donate.jit] == homes[jax.jit]
  for j in large:
    assert homes[donate.jit][j] == order(len(sizes))[j]


def test_a_small_not_mirrored_lower_makes_no_plan_and_the_plan_says_why_it_pairs_first_come():
  xs = _leaves_of([SMALL] * 6)
  g = donate.jit(_step(_reversed), donate_argnums=0)
  lowered = g.lower(xs)
  prep = lowered._prep
  assert _routed_small(prep) and prep.jax_own and prep.planned._plan is None
  assert prep.quick.pairs == {k: k for k in range(6)}  # jax.jit's first come, first served
  plan = lowered.plan  # made when read: dataflow would pair input k with output 5 - k
  assert plan.pairs() == {k: k for k in range(6)} and "copy_threshold" in plan.notes[0]
  quick, full = _prepared(g, xs)
  _assert_same_route(quick, full)
  native = donate.jit(lambda xs: [x + 1 for x in xs], donate_argnums=0)
  quick, full = _prepared(native, xs)
  assert _routed_small(quick) and not quick.plan.notes  # dataflow's pairs: jax.jit's own
  _assert_same_route(quick, full)
