"""Unit tests of donate._base.jaxprs (sub-jaxprs and their variable maps), donate._base.loops and
donate._base.compat (source lines, the private reads), on both supported JAX versions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from donate._base import compat as _compat
from donate._base import jaxprs as _jaxprs
from donate._base import loops as _loops

X = jnp.ones(4)


def eqn_of(f, *args, name):
  (eqn,) = [e for e in jax.make_jaxpr(f)(*args).eqns if e.primitive.name == name]
  return eqn


def test_scan_layout_and_body_map():
  w = jnp.ones(4)
  def f(c, xs):
    return jax.lax.scan(lambda c, x: (c * w + x, c), c, xs)
  eqn = eqn_of(f, X, jnp.ones((3, 4)), name="scan")
  loop = _loops.loop_layout(eqn)
  assert (loop.kind, loop.cond_consts, loop.body_consts, loop.carries) == ("scan", 0, 1, 1)
  assert list(loop.carry_operands) == [1]
  (sub,) = _jaxprs.subs(eqn)
  assert sub.in_map == (0, 1, 2) and not sub.transparent


def test_while_layout_and_maps_for_condition_and_body():
  limit, step = 3.0, jnp.ones(4)
  def f(c):
    return jax.lax.while_loop(lambda c: c[0] < limit, lambda c: c + step, c)
  eqn = eqn_of(f, X, name="while")
  loop = _loops.loop_layout(eqn)
  assert (loop.kind, loop.carries) == ("while", 1)
  assert loop.cond_consts + loop.body_consts == len(eqn.invars) - 1
  maps = {s.key: s.in_map for s in _jaxprs.subs(eqn)}
  n = len(eqn.invars)
  assert maps["body_jaxpr"][-1] == n - 1 and maps["cond_jaxpr"][-1] == n - 1
  assert _loops.loop_layout(eqn_of(jnp.sin, X, name="sin")) is None


def test_calls_and_branches_are_transparent_with_identity_maps():
  def f(p, x):
    return jax.jit(jnp.cos)(x), jax.lax.cond(p, jnp.sin, jnp.cos, x)
  jaxpr = jax.make_jaxpr(f)(True, X)
  call, cond = [e for e in jaxpr.eqns if e.primitive.name in ("jit", "pjit", "cond")]
  (sub,) = _jaxprs.subs(call)
  assert sub.transparent and sub.in_map == (0,) and sub.out_map == (0,)
  branches = _jaxprs.subs(cond)
  assert len(branches) == 2 and all(b.in_map == (1,) and b.transparent for b in branches)


def test_replace_subs_rebuilds_the_equation():
  jaxpr = jax.make_jaxpr(lambda x: jax.jit(jnp.sin)(x))(1.0)
  (eqn,) = [e for e in jaxpr.eqns if e.primitive.name in ("jit", "pjit")]
  other = jax.make_jaxpr(jnp.cos)(1.0).jaxpr
  new = _jaxprs.replace_subs(eqn, {("jaxpr", None): other})
  names = lambda e: [q.primitive.name for q in e.params["jaxpr"].jaxpr.eqns]
  assert names(new) == ["cos"] and names(eqn) == ["sin"]


@pytest.mark.parametrize("aval, expected", [
    (jax.core.ShapedArray((2, 3), jnp.float32), 24),
    (jax.core.ShapedArray((5,), jnp.bfloat16), 10),
    (jax.core.ShapedArray((), jnp.int8), 1),
])
def test_nbytes(aval, expected):
  assert _jaxprs.nbytes(aval) == expected


def test_source_lines_point_at_the_user_code():
  eqn = jax.make_jaxpr(lambda x: jnp.sin(x))(1.0).eqns[0]
  line = _compat.source_line(eqn.source_info)
  assert "test_jaxprs.py" in line and line.endswith(")")
  short = _jaxprs.short_source_line(eqn.source_info)
  assert short.endswith(line.split(":")[1].split(" ")[0]) and " (" not in short


def test_private_reads_answer_as_jax_does():
  def f(x, y):
    del y
    return x * 2
  closed = jax.make_jaxpr(f)(X, X)
  assert _compat.used_inputs(closed.jaxpr) == [True, False]
  jitted = jax.jit(f, static_argnums=(), donate_argnums=1)
  assert _compat.jit_argnums(jitted) == ((), (), (1,), ("y",))
  assert _compat.trace_state_clean()
  seen = []
  jax.make_jaxpr(lambda x: seen.append(_compat.trace_state_clean()) or x)(1.0)
  assert seen == [False]
  traced = jax.jit(f).trace(X, np.ones(4, np.float32))
  assert _compat.traced_num_consts(traced) == 0
  ins, outs, layouts = _compat.traced_flat_shardings(traced)
  assert len(ins) == 2 and len(outs) == 1 and layouts is False
