"""Unit tests for the planning passes (`donate._planner.passes`) and the plan's records and views.

Most tests build a `Liveness` by hand, so each pass is tested on exactly the case it names
(roles and ranges, copies of comm buffers, grouping, in-place reuse, allocation); the rest plan
small traced programs and check them with `check_plan`, the overlap validator of
tests/test_planner.py (independent of the planner), and a golden listing.
"""

import jax
import jax.numpy as jnp
import pytest
from test_planner import check_plan

import donate
from donate._planner import liveness, memory_plan, passes, records, text
from donate._planner.records import Allocation, Buffer, LiveRange, Pool

COMM = ("symm_mem", ("x",))


def value(i, start, last_use, *, nbytes=64, producer="add", arg=None, out=None):
  return liveness.Value(i, producer, (nbytes // 4,), "float32", nbytes, start, last_use, "", arg,
                        out)


def make_lv(values, steps, inplace=(), donated=()):
  cands = tuple(liveness.InplaceCandidate(s, o, ops) for s, o, ops in inplace)
  return liveness.Liveness(tuple(values), tuple(steps), {}, cands, frozenset(donated))


def plan(lv, **kwargs):
  args = dict(name="f", arg_names=["x", "y"], out_names=["out"], donated=set(), comm={},
              strict=False, alignment=64, time_limit=1.0)
  return passes.plan(lv, **{**args, **kwargs})


# Pass 1: classify ------------------------------------------------------------------------------


def test_classify_names_roles_and_reserved_ranges():
  lv = make_lv([value(0, 0, 1, producer="argument", arg=0),  # caller-owned: the whole program
                value(1, 0, 2, producer="argument", arg=1),  # donated: dies at its last use
                value(2, 0, 3, producer="argument", arg=2),  # named like the first, made unique
                value(3, 1, 3),  # an intermediate
                value(4, 2, 3, out=0),  # an output: to the end
                value(5, 2, 3, out=1)],  # marked comm: to its last use, even as an output
               ["a", "b", "c", "d"])
  bufs = passes.classify(lv, arg_names=["x", "y", "x"], out_names=["out"], donated={1},
                          comm={5: COMM})
  assert [(b.name, b.role, str(b.live_range)) for b in bufs] == [
      ("x", "input", "[0, 4)"), ("y", "donated input", "[0, 2)"), ("x#1", "input", "[0, 4)"),
      ("buf3", "regular", "[1, 3)"), ("out", "output", "[2, 4)"), ("buf5", "comm", "[2, 3)")]
  assert (bufs[5].kind, bufs[5].group, bufs[5].is_output) == ("symm_mem", ("x",), True)
  donated_by_mark = make_lv(lv.values, lv.steps, donated={0})
  assert passes.classify(donated_by_mark, arg_names=["x"], out_names=[], donated=set(),
                          comm={})[0].role == "donated input"


# Pass 2: copies --------------------------------------------------------------------------------


def comm_in_and_out():
  lv = make_lv([value(0, 0, 2, producer="argument", arg=0), value(1, 1, 3, out=0)],
               ["a", "b", "c"])
  return lv, passes.classify(lv, arg_names=["x"], out_names=["out"], donated=set(),
                              comm={0: COMM, 1: COMM})


def test_copy_out_copies_a_comm_output_out_and_a_comm_argument_in():
  lv, bufs = comm_in_and_out()
  new, copies = passes.copy_out(bufs, lv, strict=False)
  assert [str(c) for c in copies] == ["out = copy_out(buf1)  # at step 2",
                                      "x.symm = copy_in(x)  # at step 0"]
  assert [(b.name, b.role, b.producer, str(b.live_range), b.kind) for b in new] == [
      ("x", "input", "argument", "[0, 3)", None),
      ("buf1", "comm", "add", "[1, 3)", "symm_mem"),
      ("out", "output", "copy-out", "[2, 3)", None),
      ("x.symm", "comm", "copy-in", "[0, 2)", "symm_mem")]
  assert not new[1].is_output


def test_copy_out_in_strict_mode_names_every_such_buffer():
  lv, bufs = comm_in_and_out()
  with pytest.raises(donate.DonationError, match=r"at out, x: .*out \(float32\[16\]\) returned; "
                     r"x \(float32\[16\]\) an argument"):
    passes.copy_out(bufs, lv, strict=True)


# Pass 3: group and in-place reuse ---------------------------------------------------------------


def test_group_orders_comm_pools_by_first_use_and_puts_the_arena_last():
  def buf(start, role="regular", group=None):
    kind = "symm_mem" if group else None
    return Buffer(f"b{start}", role, "add", (4,), "float32", 16, LiveRange(start, start + 1),
                  kind=kind, group=group)

  bufs = [buf(3, "comm", ("x",)), buf(0), buf(1, "comm", ("y",)), buf(2, "comm", ("x",))]
  assert passes.group(bufs) == {("symm_mem", ("y",)): [2], ("symm_mem", ("x",)): [3, 0],
                                 ("regular", ()): [1]}


@pytest.mark.parametrize("case, takes", [
    ("dies here", {2: 1}),
    ("lives on", {}),
    ("other size", {}),
    ("caller-owned", {}),
    ("donated input", {3: 0}),
    ("comm operand", {}),
    ("two takers", {2: 1}),
])
def test_inplace_reuse_takes_over_a_dying_operand_of_the_same_size_once(case, takes):
  values = [value(0, 0, 2, producer="argument", arg=0), value(1, 0, 2), value(2, 1, 3),
            value(3, 1, 3)]
  inplace = [(1, 2, (1,))]
  donated, comm = set(), {}
  if case == "lives on":
    values[1] = value(1, 0, 3)
  elif case == "other size":
    values[1] = value(1, 0, 2, nbytes=128)
  elif case in ("caller-owned", "donated input"):  # read last by the last step
    values[0], values[3] = value(0, 0, 3, producer="argument", arg=0), value(3, 2, 3)
    inplace = [(2, 3, (0,))]
    donated = {0} if case == "donated input" else set()
  elif case == "comm operand":
    comm = {1: COMM}
  elif case == "two takers":
    inplace = [(1, 2, (1,)), (1, 3, (1,))]
  lv = make_lv(values, ["a", "b", "c"], inplace)
  bufs = passes.classify(lv, arg_names=["x"], out_names=[], donated=donated, comm=comm)
  assert passes.inplace_reuse(bufs, lv, {v.id: v.id for v in values}) == takes


# Pass 4: allocate ------------------------------------------------------------------------------


def test_an_in_place_chain_shares_one_slot_and_the_pool_is_checked():
  lv = make_lv([value(0, 0, 2), value(1, 1, 3), value(2, 2, 4), value(3, 0, 4)],
               ["a", "b", "c", "d"], [(1, 1, (0,)), (2, 2, (1,))])
  p = plan(lv, arg_names=[])
  check_plan(p)
  offsets, reuses = p.arena.offsets, {a.name: a.reuses for a in p.arena.allocations}
  assert offsets["buf0"] == offsets["buf1"] == offsets["buf2"] != offsets["buf3"]
  assert reuses == {"buf3": None, "buf0": None, "buf1": "buf0", "buf2": "buf1"}
  assert (p.arena.size, p.arena.lower_bound) == (128, 128)
  assert passes.plan(lv, name="f", arg_names=[], out_names=[], donated=set(), comm={},
                      strict=False, alignment=64, time_limit=1.0, inplace=False).arena.size == 192


def test_a_comm_pool_is_planned_apart_from_the_arena():
  # sin's result dies where the product starts: in the arena it would be reused in place.
  closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(jax.ShapeDtypeStruct((16,), jnp.float32))
  lv = liveness.live_ranges(closed)
  p = plan(lv, comm={1: COMM})
  check_plan(p)
  (pool,) = p.pools
  assert (pool.name, pool.size, [str(a) for a in pool.allocations]) == (
      "pool_symm_mem_x", 64, ["buf1 @ 0 +64 [0, 2)"])
  assert [(a.name, a.reuses) for a in p.arena.allocations] == [("x", None), ("out", None)]
  assert p.arena.offsets["out"] != p.arena.offsets["x"]  # both live at step 1


def test_the_allocation_check_catches_a_clash_but_not_an_in_place_pair():
  a = Buffer("a", "regular", "add", (4,), "float32", 16, LiveRange(0, 2))
  b = Buffer("b", "regular", "mul", (4,), "float32", 16, LiveRange(1, 3))
  passes._assert_disjoint([Allocation(a, 0), Allocation(b, 0, reuses="a")])
  with pytest.raises(AssertionError, match="overlap in time and memory"):
    passes._assert_disjoint([Allocation(a, 0), Allocation(b, 8)])


def test_pool_names_are_identifiers():
  assert passes.pool_name("symm_mem", ("x", "y")) == "pool_symm_mem_x_y"
  assert passes.pool_name("nv-shmem", ("a.b",)) == "pool_nv_shmem_a_b"


# Records and views -----------------------------------------------------------------------------


# The offsets are the engine's (placeholders); all around them is the passes' and the listing's.
GOLDEN = """\
# memory plan for f: 5 steps, alignment 64
arena = empty_pool(2048)  # regular buffers, lower bound 2048, 7 buffers
  x = alloc_from_pool(arena, {x}, 512)  # float32[8,16] input [0, 5), argument, caller-owned
  w = alloc_from_pool(arena, {w}, 1024)  # float32[16,16] donated input [0, 1), argument, freed after step 0 (dot_general)
  buf2 = alloc_from_pool(arena, {buf2}, 512)  # float32[8,16] regular [0, 2), dot_general, freed after step 1 (tanh)
  buf3 = alloc_from_pool(arena, {buf2}, 512)  # float32[8,16] regular [1, 5), tanh, reuses buf2 in place, freed after step 4 (reduce_sum)
  buf4 = alloc_from_pool(arena, {buf4}, 512)  # float32[8,16] regular [2, 4), mul, freed after step 3 (add)
  out[0] = alloc_from_pool(arena, {buf4}, 512)  # float32[8,16] output [3, 5), add, reuses buf4 in place, returned
  out[1][0] = alloc_from_pool(arena, {sum}, 4)  # float32[] output [4, 5), reduce_sum, returned
# arena: 2048 bytes (lower bound 2048)
# collective memory: 0 bytes; regular: 2048 bytes; total: 2048 bytes (lower bound 2048)"""


def golden_plan():
  def f(x, w):
    h = jnp.tanh(x @ w)
    return h * 2 + 1, (h.sum(), x)

  return donate.planner.plan_memory(f, jax.ShapeDtypeStruct((8, 16), jnp.float32),
                                    jax.ShapeDtypeStruct((16, 16), jnp.float32), alignment=64,
                                    donate_argnums=1)


def test_golden_listing():
  p = golden_plan()
  check_plan(p)
  offsets = p.arena.offsets
  assert str(p) == GOLDEN.format(x=offsets["x"], w=offsets["w"], buf2=offsets["buf2"],
                                 buf4=offsets["buf4"], sum=offsets["out[1][0]"])


def test_html_and_plot_say_what_the_listing_says():
  p = golden_plan()
  page = p._repr_html_()
  assert page.count("<tr>") == 1 + len(p.arena.allocations)
  assert ("<p>collective memory 0 bytes, regular 2048 bytes, total 2048 bytes (lower bound 2048)"
          "</p></div>") in page
  assert "<code>arena</code>: 2048 bytes, lower bound 2048</p>" in page
  (ax,) = p.plot().axes
  assert ax.get_title() == "arena: 2048 bytes (lower bound 2048, dotted)"
  assert len(ax.patches) == len(p.arena.allocations)


def test_plan_totals_add_up_over_pools():
  arena = Pool("arena", "regular", (), 256, 192, ())
  pools = (Pool("pool_a", "a", ("x",), 64, 64, ()), Pool("pool_b", "b", ("x",), 128, 64, ()))
  p = memory_plan.MemoryPlan("f", (), pools, arena, (), ("s",), 64)
  assert (p.collective_memory_bytes, p.regular_bytes, p.total_bytes, p.lower_bound_bytes) == (
      192, 256, 448, 320)
  assert str(p).splitlines()[-1] == ("# collective memory: 192 bytes; regular: 256 bytes; "
                                     "total: 448 bytes (lower bound 320)")
  assert p.pool("b", "x") is pools[1]
  with pytest.raises(KeyError):
    p.pool("a", ("y",))


def test_record_text():
  buf = Buffer("x", "comm", "add", (2, 3), "float32", 24, LiveRange(1, 4), "shard_map/",
               "symm_mem", ("x",))
  assert str(buf) == "x: float32[2,3] comm [1, 4) from shard_map/add" and buf.is_comm
  alloc = Allocation(buf, 64)
  assert (str(alloc), alloc.size, alloc.name) == ("x @ 64 +24 [1, 4)", 24, "x")
  pool = Pool("pool_symm_mem_x", "symm_mem", ("x",), 64, 24, (alloc,))
  assert str(pool) == ("pool_symm_mem_x = empty_pool(64)  # kind='symm_mem', group=('x',), "
                       "lower bound 24, 1 buffer")
  assert records.ROLES == ("input", "donated input", "regular", "output", "comm")
  assert text.size_text(5) == "5 bytes"
  assert text.size_text(5, 4, "a", "b") == "5 bytes (lower bound 4, a, b)"
  with pytest.raises(AssertionError):
    LiveRange(3, 3)
