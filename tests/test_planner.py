"""Tests for `donate.planner`: liveness over nested jaxprs, comm-buffer pools, listing and plot.

Every plan is checked by `check_plan`, an overlap validator written here independently of the
planner. The seed example (Inductor's comm-buffer planning PR) is a golden listing.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import donate
from donate import planner
from donate.symm import with_symmetric

F32 = jax.ShapeDtypeStruct((4, 4), jnp.float32)


def mesh_1d(n=4, name="x"):
  return jax.make_mesh((n,), (name,), devices=jax.devices()[:n])


# The independent validator ----------------------------------------------------------------------


def check_plan(plan, alignment=None):
  """Checks a plan without trusting the planner: placement, isolation, ranges and totals."""
  steps = max(len(plan.steps), 1)
  pools = (*plan.pools, plan.arena)
  placed = [a.buffer.name for p in pools for a in p.allocations]
  assert sorted(placed) == sorted(b.name for b in plan.buffers), "each buffer in exactly one pool"
  for b in plan.buffers:
    assert 0 <= b.live_range.start < b.live_range.end <= steps, b
  for a in plan.arena.allocations:
    assert a.buffer.role != "comm" and a.buffer.kind is None, f"{a.name} is comm but in the arena"
  for pool in plan.pools:
    for a in pool.allocations:
      assert a.buffer.role == "comm" and (a.buffer.kind, a.buffer.group) == (pool.kind, pool.group)
      assert a.reuses is None, "comm buffers take no part in in-place reuse"
  assert len({(p.kind, p.group) for p in plan.pools}) == len(plan.pools), "one pool per key"
  for pool in pools:
    _check_pool(pool, alignment or plan.alignment)
  assert plan.collective_memory_bytes == sum(p.size for p in plan.pools)
  assert plan.total_bytes == plan.collective_memory_bytes + plan.arena.size


def _check_pool(pool, alignment):
  allocs = pool.allocations
  for a in allocs:
    assert a.offset >= 0 and a.offset % alignment == 0, a
    assert a.offset + a.size <= pool.size, a
  for i, a in enumerate(allocs):
    for b in allocs[i + 1:]:
      in_time = (a.live_range.start < b.live_range.end and b.live_range.start < a.live_range.end)
      in_memory = a.offset < b.offset + b.size and b.offset < a.offset + a.size
      if in_time and in_memory:
        assert _in_place_pair(a, b) or _in_place_pair(b, a), f"{pool.name}: {a} clashes with {b}"
  aligned = lambda a: -(-a.size // alignment) * alignment
  live = [sum(aligned(a) for a in allocs if a.live_range.start <= t < a.live_range.end)
          for t in {a.live_range.start for a in allocs}]
  assert pool.lower_bound <= pool.size
  if not any(a.reuses for a in allocs):
    assert pool.lower_bound == max(live, default=0)


def _in_place_pair(later, earlier):
  """`later` takes over `earlier` in place: same slot, touching at the one step that links them."""
  return (later.reuses == earlier.name and later.offset == earlier.offset
          and later.size == earlier.size and earlier.live_range.end == later.live_range.start + 1)


def test_validator_catches_a_clash():
  good = planner.plan_memory(lambda x: (x + 1) * 2, F32, alignment=1, inplace=False)
  check_plan(good)
  a, b = good.arena.allocations[:2]
  bad = planner.Pool("arena", "regular", (), good.arena.size, good.arena.lower_bound,
                     (a, planner.Allocation(b.buffer, a.offset)))
  with pytest.raises(AssertionError, match="clashes"):
    _check_pool(bad, 1)


# The seed example -------------------------------------------------------------------------------


def seed_body(x):
  """Inductor PR 138519's graph: three all-reduces of x + 1, 2, 3, their sum, a fourth."""
  a, b, c = (with_symmetric(x + 1, "x"), with_symmetric(x + 2, "x"), with_symmetric(x + 3, "x"))
  a, b, c = jax.lax.psum(a, "x"), jax.lax.psum(b, "x"), jax.lax.psum(c, "x")
  return jax.lax.psum(with_symmetric(a + b + c, "x"), "x")


def seed_fn():
  return jax.shard_map(seed_body, mesh=mesh_1d(), in_specs=P(), out_specs=P())


SEED_GOLDEN = """\
# memory plan for seed_body: 9 steps, alignment 64
pool_symm_mem_x = empty_pool(192)  # kind='symm_mem', group=('x',), lower bound 192, 4 buffers
  buf1 = alloc_from_pool(pool_symm_mem_x, {o1}, 64)  # float32[4,4] comm [0, 4), shard_map/add, freed after step 3 (shard_map/psum_invariant)
  buf2 = alloc_from_pool(pool_symm_mem_x, {o2}, 64)  # float32[4,4] comm [1, 5), shard_map/add, freed after step 4 (shard_map/psum_invariant)
  buf3 = alloc_from_pool(pool_symm_mem_x, {o3}, 64)  # float32[4,4] comm [2, 6), shard_map/add, freed after step 5 (shard_map/psum_invariant)
  buf8 = alloc_from_pool(pool_symm_mem_x, {o8}, 64)  # float32[4,4] comm [7, 9), shard_map/add, freed after step 8 (shard_map/psum_invariant)
arena = empty_pool(256)  # regular buffers, lower bound 256, 6 buffers
  x = alloc_from_pool(arena, {ox}, 64)  # float32[4,4] input [0, 9), argument, caller-owned
  buf4 = alloc_from_pool(arena, {o4}, 64)  # float32[4,4] regular [3, 7), shard_map/psum_invariant, freed after step 6 (shard_map/add)
  buf5 = alloc_from_pool(arena, {o5}, 64)  # float32[4,4] regular [4, 7), shard_map/psum_invariant, freed after step 6 (shard_map/add)
  buf6 = alloc_from_pool(arena, {o6}, 64)  # float32[4,4] regular [5, 8), shard_map/psum_invariant, freed after step 7 (shard_map/add)
  buf7 = alloc_from_pool(arena, {o4}, 64)  # float32[4,4] regular [6, 8), shard_map/add, reuses buf4 in place, freed after step 7 (shard_map/add)
  out = alloc_from_pool(arena, {oo}, 64)  # float32[4,4] output [8, 9), shard_map/psum_invariant, returned
# pool_symm_mem_x: 192 bytes (lower bound 192)
# arena: 256 bytes (lower bound 256)
# collective memory: 192 bytes; regular: 256 bytes; total: 448 bytes (lower bound 448)"""


def test_seed_example_golden_listing():
  plan = planner.plan_memory(seed_fn(), F32, alignment=64)
  check_plan(plan)
  (pool,) = plan.pools
  assert (pool.name, pool.kind, pool.group, pool.size, pool.lower_bound) == (
      "pool_symm_mem_x", "symm_mem", ("x",), 192, 192)
  off = pool.offsets | plan.arena.offsets
  # The three first buffers fill the pool; the fourth reuses the slot of a dead one.
  assert sorted(off[n] for n in ("buf1", "buf2", "buf3")) == [0, 64, 128]
  assert off["buf8"] in (off["buf1"], off["buf2"], off["buf3"])
  expected = SEED_GOLDEN.format(
      o1=off["buf1"], o2=off["buf2"], o3=off["buf3"], o8=off["buf8"], ox=off["x"], o4=off["buf4"],
      o5=off["buf5"], o6=off["buf6"], oo=off["out"])
  assert str(plan) == expected
  assert plan.collective_memory_bytes == 192 and plan.total_bytes == 448


def test_seed_example_alignment_1_and_the_program_still_runs():
  plan = planner.plan_memory(seed_fn(), F32, alignment=1, inplace=False)
  check_plan(plan, alignment=1)
  (pool,) = plan.pools
  assert (pool.size, pool.lower_bound) == (192, 192)
  x = jnp.arange(16, dtype=jnp.float32).reshape(4, 4)
  got = jax.jit(seed_fn())(x)
  np.testing.assert_allclose(got, 4 * 4 * (3 * np.asarray(x) + 6))
  np.testing.assert_allclose(got, seed_fn()(x))


def test_plot_and_html():
  plan = planner.plan_memory(seed_fn(), F32)
  fig = plan.plot()
  assert len(fig.axes) == len(plan.pools) + 1
  assert len(fig.axes[0].patches) == len(plan.pools[0].allocations)
  assert "pool_symm_mem_x" in fig.axes[0].get_title()
  html = plan._repr_html_()
  assert "<table>" in html and "pool_symm_mem_x" in html and "192" in html


# Pools, copies and in-place reuse ---------------------------------------------------------------


def test_two_groups_get_two_isolated_pools():
  mesh = jax.make_mesh((2, 4), ("x", "y"))

  def body(v):
    a = jax.lax.psum(with_symmetric(v * 2, "x"), "x")
    b = jax.lax.psum(with_symmetric(v * 3, "y"), "y")
    c = jax.lax.psum(with_symmetric(a + b, ("x", "y")), ("x", "y"))
    return c + 1

  f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())
  plan = planner.plan_memory(f, F32, alignment=64)
  check_plan(plan)
  assert {p.group for p in plan.pools} == {("x",), ("y",), ("x", "y")}
  for p in plan.pools:
    assert p.size == p.lower_bound == 64, "each group's buffer sits alone at offset 0"
    assert [a.offset for a in p.allocations] == [0]
  # Buffers live at the same time yet share offset 0: only possible because pools are isolated.
  assert plan.collective_memory_bytes == 192
  assert plan.pool("symm_mem", "x").buffers[0].group == ("x",)
  with pytest.raises(KeyError):
    plan.pool("symm_mem", "z")


def test_kinds_get_separate_pools():
  def body(v):
    a = jax.lax.psum(with_symmetric(v * 2, "x"), "x")
    b = jax.lax.psum(with_symmetric(v * 3, "x", kind="nvshmem"), "x")
    return a + b

  f = jax.shard_map(body, mesh=mesh_1d(), in_specs=P(), out_specs=P())
  plan = planner.plan_memory(f, F32)
  check_plan(plan)
  assert sorted(p.name for p in plan.pools) == ["pool_nvshmem_x", "pool_symm_mem_x"]


def comm_output_fn():
  def body(v):
    s = with_symmetric(v + 1, "x")
    return jax.lax.psum(s, "x"), s

  return jax.shard_map(body, mesh=mesh_1d(), in_specs=P(), out_specs=(P(), P()), check_vma=False)


def test_comm_output_is_copied_out():
  plan = planner.plan_memory(comm_output_fn(), F32)
  check_plan(plan)
  (copy,) = plan.copies
  comm, target = plan.buffer(copy.source), plan.buffer(copy.target)
  assert comm.role == "comm" and not comm.is_output
  assert target.role == "output" and target.producer == "copy-out" and target.kind is None
  assert copy.step == comm.live_range.end - 1 == target.live_range.start
  assert target.live_range.end == len(plan.steps)
  assert target in plan.arena.buffers and comm in plan.pools[0].buffers
  assert f"{copy.target} = copy_out({copy.source})" in str(plan)
  assert (copy.source, copy.target) == ("buf1", "out[1]")
  assert "copied out to out[1] at step" in str(plan)


def test_comm_output_strict_raises_naming_it():
  with pytest.raises(donate.DonationError, match=r"out\[1\] \(float32\[4,4\]\) returned"):
    planner.plan_memory(comm_output_fn(), F32, strict=True)


def test_comm_argument_is_copied_in():
  def body(v):
    return jax.lax.psum(with_symmetric(v, "x"), "x")

  f = jax.shard_map(body, mesh=mesh_1d(), in_specs=P(), out_specs=P(), check_vma=False)
  plan = planner.plan_memory(f, F32)
  check_plan(plan)
  (copy,) = plan.copies
  assert (copy.source, copy.reason) == ("v", "in") and plan.buffer("v").role == "input"
  assert plan.buffer(copy.target).role == "comm"
  with pytest.raises(donate.DonationError, match="an argument"):
    planner.plan_memory(f, F32, strict=True)


def test_inplace_reuse_skips_comm_buffers_and_caller_inputs():
  def body(v):
    t = jnp.sin(v)
    u = with_symmetric(t * 2, "x")  # t dies here, but u is comm: no in-place reuse
    w = jax.lax.psum(u, "x")
    return jnp.exp(w) + 1  # w dies at exp, whose result reuses it; + 1 reuses exp's

  f = jax.shard_map(body, mesh=mesh_1d(), in_specs=P(), out_specs=P())
  plan = planner.plan_memory(f, F32)
  check_plan(plan)
  reuses = {a.name: a.reuses for a in plan.arena.allocations if a.reuses}
  producers = {plan.buffer(n).producer: plan.buffer(r).producer for n, r in reuses.items()}
  assert producers == {"exp": "psum_invariant", "add": "exp"}
  assert plan.buffer("v").role == "input"
  assert not planner.plan_memory(f, F32, inplace=False).arena.allocations[-1].reuses


def test_donated_input_dies_at_last_use_and_is_reused():
  def f(a, b):
    return jnp.sin(a) + b

  kept = planner.plan_memory(f, F32, F32)
  given_ = planner.plan_memory(f, F32, F32, donate_argnums=0)
  check_plan(kept)
  check_plan(given_)
  assert kept.buffer("a").live_range == planner.LiveRange(0, 2)
  a = given_.buffer("a")
  assert (a.role, a.live_range) == ("donated input", planner.LiveRange(0, 1))
  assert {x.name: x.reuses for x in given_.arena.allocations}["buf2"] == "a"
  assert given_.arena.size < kept.arena.size
  with pytest.raises(donate.DonationError, match="donate_argnums out of range"):
    planner.plan_memory(f, F32, F32, donate_argnums=2)


def test_donate_buffer_mark_counts_as_donation():
  def f(a):
    return jnp.sin(donate.donate_buffer(a))

  assert planner.plan_memory(f, F32).buffer("a").role == "donated input"


# Recursion into sub-jaxprs ----------------------------------------------------------------------


def span(plan, prefix):
  idx = [i for i, s in enumerate(plan.steps) if s.startswith(prefix)]
  assert idx == list(range(idx[0], idx[-1] + 1)), f"{prefix} steps are contiguous"
  return idx[0], idx[-1] + 1


def inside(plan, prefix):
  return [b for b in plan.buffers if b.scope.startswith(prefix)]


def test_scan_cond_while_jit_bodies_get_ranges_inside_their_span():
  inner = jax.jit(lambda a: jnp.cos(a) * 2)

  def f(x, ys):
    c, zs = jax.lax.scan(lambda c, y: (c + jnp.sin(y), c * y), x, ys)
    d = jax.lax.cond(c.sum() > 0, lambda v: jnp.exp(v) + 1, lambda v: v - 1, c)
    e = jax.lax.while_loop(lambda v: v.sum() < 100, lambda v: v * 2 + 1, d)
    return inner(e), zs

  plan = planner.plan_memory(f, jax.ShapeDtypeStruct((4,), jnp.float32),
                             jax.ShapeDtypeStruct((6, 4), jnp.float32))
  check_plan(plan)
  for prefix in ("scan/", "cond[0]/", "cond[1]/", "while.cond/", "while.body/", "jit/"):
    lo, hi = span(plan, prefix)
    bufs = inside(plan, prefix)
    assert bufs, prefix
    for b in bufs:
      assert lo <= b.live_range.start and b.live_range.end <= hi or b.is_output, (prefix, b)
  # Loop state and the stacked scan output live across the whole loop span.
  lo, hi = span(plan, "scan/")
  carry, stacked = [b for b in plan.buffers if b.producer == "scan"]
  assert carry.live_range.start == lo and carry.live_range.end > hi
  assert stacked.role == "output" and stacked.live_range == planner.LiveRange(lo, len(plan.steps))
  # The operand of the loop lives until the loop ends.
  assert plan.buffer("ys").live_range.end == len(plan.steps)  # caller-owned
  lo, hi = span(plan, "while.")
  (state,) = [b for b in plan.buffers if b.producer == "while"]
  assert state.live_range.start == lo and state.live_range.end >= hi
  # The jit body's result is the program's output (a call's results alias its body's).
  assert plan.buffer("out[0]").scope == "jit/"
  args = (jnp.linspace(-1, 1, 4), jnp.ones((6, 4)))
  for got, want in zip(jax.jit(f)(*args), f(*args)):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_loop_state_and_body_results_live_to_the_end_of_the_loop():
  def f(x, ys):
    jax.lax.scan(lambda c, y: (c * 2, jnp.sin(y) + jnp.cos(y)), x, ys)  # result unused
    return x + 1

  plan = planner.plan_memory(f, jax.ShapeDtypeStruct((4,), jnp.float32),
                             jax.ShapeDtypeStruct((6, 4), jnp.float32), inplace=False)
  check_plan(plan)
  lo, hi = span(plan, "scan/")
  assert hi - lo == 4
  carry, _ = [b for b in plan.buffers if b.producer == "scan"]
  assert carry.live_range == planner.LiveRange(lo, hi), "the loop state spans every iteration"
  new_carry = next(b for b in plan.buffers if b.scope == "scan/" and b.producer == "mul")
  assert new_carry.live_range == planner.LiveRange(lo, hi), "a body result lives to the body's end"


def test_shard_map_uses_per_device_blocks_and_comm_inside_scan():
  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))

  def body(v):
    def step(c, _):
      return c + jax.lax.psum(with_symmetric(c * 2, "x"), "x"), None

    return jax.lax.scan(step, v, None, length=3)[0]

  f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
  plan = planner.plan_memory(f, jax.ShapeDtypeStruct((32, 4), jnp.float32))
  check_plan(plan)
  assert plan.buffer("v").nbytes == 32 * 4 * 4
  (pool,) = plan.pools
  (comm,) = pool.buffers
  assert comm.shape == (4, 4) and comm.nbytes == 64 and comm.scope == "shard_map/scan/"
  lo, hi = span(plan, "shard_map/scan/")
  assert lo <= comm.live_range.start < comm.live_range.end <= hi
  x = jnp.arange(128.0).reshape(32, 4)
  np.testing.assert_allclose(jax.jit(f)(x), f(x))


def test_nested_call_aliases_operands_and_results():
  @jax.jit
  def g(a):
    return jnp.sin(a) * 3

  plan = planner.plan_memory(lambda x: g(x) + 1, F32, alignment=1)
  check_plan(plan)
  assert [b.name for b in plan.buffers] == ["x", "buf1", "buf2", "out"]
  inner = plan.buffer("buf2")
  assert inner.scope == "jit/" and inner.live_range == planner.LiveRange(1, 3)


def test_buffers_are_named_by_pytree_path():
  def f(params, x, *, scale):
    return {"y": params["w"] @ x * scale, "b": params["b"]}

  params = {"w": jnp.ones((4, 4)), "b": jnp.ones(4)}
  plan = planner.plan_memory(f, params, jnp.ones(4), scale=2.0)
  check_plan(plan)
  names = [b.name for b in plan.buffers]
  assert names[:4] == ["params['b']", "params['w']", "x", "scale"]
  assert "out['y']" in names and plan.buffer("params['b']").is_output


# Random programs --------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(0, 7), st.booleans()),
                min_size=1, max_size=12),
       st.sampled_from([1, 16, 64]))
def test_random_programs_plan_validly(ops, alignment):
  """Random dataflow graphs over values of three sizes, some marked for one of two groups."""
  def body(v):
    vals = [v, v[:2], v[:1]]
    for kind, i, j, mark in ops:
      a, b = vals[i % len(vals)], vals[j % len(vals)]
      if kind == 0:
        out = a * 2
      elif kind == 1:
        out = a + b[:a.shape[0]] if b.shape[0] >= a.shape[0] else jnp.tanh(a)
      elif kind == 2:
        out = jnp.concatenate([a, a])[:4]
      else:
        out = jax.lax.psum(a, "x")
      if mark:
        out = jax.lax.psum(with_symmetric(out, "x" if i % 2 else "y"), "x")
      vals.append(out)
    return vals[-1], vals[len(vals) // 2]

  mesh = jax.make_mesh((2, 4), ("x", "y"))
  f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
  plan = planner.plan_memory(f, jax.ShapeDtypeStruct((4, 8), jnp.float32), alignment=alignment)
  check_plan(plan, alignment)
  assert all(not b.is_output for p in plan.pools for b in p.buffers)


def test_bad_alignment_is_rejected():
  with pytest.raises(donate.DonationError, match="alignment"):
    planner.plan_memory(jnp.sin, F32, alignment=0)


def test_assign_offsets_is_reexported():
  result = planner.assign_offsets([64, 64, 64], [0, 1, 3], [2, 3, 4], alignment=64)
  assert result.height == result.lower_bound == 128
