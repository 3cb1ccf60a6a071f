"""Unit tests for `donate._planner.liveness`: values, steps and live ranges of small jaxprs.

Each program is traced with `jax.make_jaxpr` and walked directly, without the planning passes, so
a failure points at the walk itself: the time model (one step per equation, half-open ranges),
aliasing (identities, views, calls, loop state) and the in-place candidates it hands on.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import donate
from donate._planner import liveness

X = jax.ShapeDtypeStruct((4,), jnp.float32)


def walk(fun, *args):
  closed = jax.make_jaxpr(fun)(*args)
  return closed, liveness.live_ranges(closed)


def ranges(lv):
  """(producer, scope, start, last_use) per value, in creation order."""
  return [(v.producer, v.scope, v.start, v.last_use) for v in lv.values]


def ids_of(lv, var):
  return lv.instances[var]


def test_last_used_maps_each_var_to_its_last_reader_and_outputs_to_none():
  jaxpr = jax.make_jaxpr(lambda x: (jnp.sin(x) * x, jnp.cos(x)))(X).jaxpr
  sin, mul, cos = jaxpr.eqns
  last = liveness.last_used(jaxpr)
  assert last[jaxpr.invars[0]] is cos
  assert last[sin.outvars[0]] is mul
  assert last[mul.outvars[0]] is None and last[cos.outvars[0]] is None


def test_aval_bytes_of_arrays_and_of_other_things():
  assert liveness.aval_bytes(jax.ShapeDtypeStruct((2, 3), jnp.float32)) == ((2, 3), "float32", 24)
  assert liveness.aval_bytes(jax.ShapeDtypeStruct((), jnp.int8)) == ((), "int8", 1)
  assert liveness.aval_bytes(object()) is None


def test_one_step_per_equation_operands_live_through_their_last_use():
  _, lv = walk(lambda x: (jnp.sin(x) * 2, jnp.cos(x)), X)
  assert lv.steps == ("sin", "mul", "cos")
  assert ranges(lv) == [("argument", "", 0, 3), ("sin", "", 0, 2), ("mul", "", 1, 2),
                        ("cos", "", 2, 3)]
  assert [v.out_index for v in lv.values] == [None, None, 0, 1]
  assert lv.values[0].arg_index == 0 and lv.num_steps == 3


def test_views_and_identities_take_no_step_and_share_their_operand():
  closed, lv = walk(lambda x: jnp.sin(x.reshape(2, 2)).reshape(4) + x, X)
  assert lv.steps == ("sin", "add")
  assert [v.producer for v in lv.values] == ["argument", "sin", "add"]
  reshape_in, _, reshape_out, _ = closed.jaxpr.eqns
  assert ids_of(lv, reshape_in.outvars[0]) == (0,)  # the argument, seen as 2x2
  assert ids_of(lv, reshape_out.outvars[0]) == (1,)  # sin's buffer, seen flat
  _, lv = walk(lambda x: jax.lax.optimization_barrier(x.reshape(1, 4).squeeze(0)) * 2, X)
  assert lv.steps == ("mul",) and len(lv.values) == 2


def test_donate_buffer_marks_its_operand_and_alias_returns_its_target():
  _, lv = walk(lambda x: jnp.sin(donate.donate_buffer(x)), X)
  assert lv.donated == frozenset({0}) and lv.steps == ("sin",)
  closed, lv = walk(lambda x, y: donate.alias(x, y * 2), X, X)
  assert lv.steps == ("mul",)
  assert ids_of(lv, closed.jaxpr.outvars[0]) == (2,)  # the product, written over x
  assert lv.values[2].out_index == 0 and lv.values[0].out_index is None


def test_a_call_body_shares_the_callers_operands_and_results():
  inner = jax.jit(lambda a: jnp.sin(a) * 3)
  closed, lv = walk(lambda x: inner(x) + 1, X)
  assert lv.steps == ("jit/sin", "jit/mul", "add")
  assert ranges(lv) == [("argument", "", 0, 2), ("sin", "jit/", 0, 2), ("mul", "jit/", 1, 3),
                        ("add", "", 2, 3)]
  call = closed.jaxpr.eqns[0]
  assert ids_of(lv, call.outvars[0]) == (2,)  # the call's result is the body's product
  assert not any(v.producer == "parameter" for v in lv.values)


def test_an_empty_call_body_still_takes_a_step_and_a_literal_result_gets_a_buffer():
  _, lv = walk(lambda x: jax.jit(lambda a: a)(x) + 1, X)
  assert lv.steps == ("jit", "add")
  _, lv = walk(lambda x: jax.jit(lambda a: (a * 2, 1.0))(x), X)
  assert ranges(lv)[2] == ("jit", "", 0, 1) and lv.values[2].nbytes == 4


def test_scan_carry_is_the_loop_state_and_slices_are_fresh():
  closed, lv = walk(lambda x, ys: jax.lax.scan(lambda c, y: (c + y, c * y), x, ys)[0], X,
                    jax.ShapeDtypeStruct((3, 4), jnp.float32))
  assert lv.steps == ("scan/add", "scan/mul")
  assert ranges(lv) == [
      ("argument", "", 0, 2), ("argument", "", 0, 2),
      ("scan", "", 0, 2), ("scan", "", 0, 2),  # carry and stacked ys: the whole span
      ("parameter", "scan/", 0, 2),  # one slice of ys per iteration
      ("add", "scan/", 0, 2), ("mul", "scan/", 1, 2)]  # body results live to the body's end
  body = closed.jaxpr.eqns[0].params["jaxpr"].jaxpr
  assert ids_of(lv, body.invars[0]) == (2,)  # the carry parameter is the loop state


def test_while_cond_and_body_walk_one_after_the_other_over_the_loop_state():
  _, lv = walk(lambda x: jax.lax.while_loop(lambda v: v.sum() < 10, lambda v: v * 2, x), X)
  assert lv.steps == ("while.cond/reduce_sum", "while.cond/lt", "while.body/mul")
  assert ranges(lv) == [("argument", "", 0, 3), ("while", "", 0, 3),
                        ("reduce_sum", "while.cond/", 0, 2), ("lt", "while.cond/", 1, 2),
                        ("mul", "while.body/", 2, 3)]


def test_cond_branches_take_turns_and_their_operands_live_through_both():
  _, lv = walk(lambda x: jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), X)
  assert lv.steps[-2:] == ("cond[0]/cos", "cond[1]/sin")
  by_producer = {v.producer: v for v in lv.values}
  assert by_producer["argument"].last_use == len(lv.steps)
  assert (by_producer["cond"].start, by_producer["cond"].last_use) == (3, 5)
  assert (by_producer["cos"].scope, by_producer["sin"].scope) == ("cond[0]/", "cond[1]/")


def test_shard_map_values_have_per_device_shapes():
  mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])
  f = jax.shard_map(lambda v: jnp.sin(v) * v, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  _, lv = walk(f, jax.ShapeDtypeStruct((8, 4), jnp.float32))
  assert lv.steps == ("shard_map/sin", "shard_map/mul")
  assert [(v.producer, v.shape, v.nbytes) for v in lv.values] == [
      ("argument", (8, 4), 128), ("sin", (2, 4), 32), ("mul", (2, 4), 32)]


def test_inplace_candidates_are_elementwise_steps_with_distinct_operands():
  _, lv = walk(lambda x, w: jnp.tanh(x @ w) + (x @ w), X, jax.ShapeDtypeStruct((4, 4), jnp.float32))
  kinds = {lv.steps[c.step] for c in lv.inplace}
  assert kinds == {"tanh", "add"}  # never dot_general
  _, lv = walk(lambda x: x + x, X)
  (cand,) = lv.inplace
  assert (cand.step, cand.out, cand.operands) == (0, 1, (0,))


def test_zero_sized_values_need_no_memory_and_repeated_outputs_count_once():
  closed, lv = walk(lambda x: (x, x + 1, jnp.zeros((0,)), x), X)
  assert [v.producer for v in lv.values] == ["argument", "add"]
  assert lv.values[0].out_index == 0 and lv.values[0].is_output
  assert closed.jaxpr.outvars[2] not in lv.instances or lv.instances[closed.jaxpr.outvars[2]] == ()


@pytest.mark.parametrize("n", [1, 3])
def test_nested_calls_stack_their_scopes(n):
  f = lambda a: jnp.exp(a)  # noqa: E731
  for _ in range(n):
    f = jax.jit(f)
  _, lv = walk(f, X)
  assert lv.steps == ("jit/" * n + "exp",)
  assert lv.values[1].scope == "jit/" * n and lv.values[1].out_index == 0
