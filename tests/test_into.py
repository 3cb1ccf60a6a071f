"""Unit tests of donate._jit.into (the `(into, *args)` wrapper) and donate._jit.options."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate
from donate._base.errors import DonationError
from donate._jit import into as _into
from donate._jit.options import Options


def test_with_out_keeps_the_parameters_and_aliases_each_result():
  def f(x, *, scale=2.0):
    return {"y": x * scale, "n": x.sum()}
  g = _into.with_out(f, "f")
  assert list(inspect.signature(g).parameters) == ["into", "x", "scale"]
  jaxpr = jax.make_jaxpr(g)({"y": jnp.zeros(3), "n": None}, jnp.ones(3))
  names = [e.primitive.name for e in jaxpr.eqns]
  assert names.count("donate_alias") == 1  # "n" is None: allocated, not aliased


@pytest.mark.parametrize("out, match", [
    ((jnp.zeros(3), jnp.zeros(3)), "structure"),
    ({"y": jnp.zeros(4), "n": None}, "does not fit"),
])
def test_with_out_checks_structure_shape_and_dtype_while_tracing(out, match):
  g = _into.with_out(lambda x: {"y": x * 2.0, "n": x.sum()}, "f")
  with pytest.raises(DonationError, match=match):
    jax.make_jaxpr(g)(out, jnp.ones(3))


def test_check_buffers_names_the_path():
  with pytest.raises(DonationError, match=r"out\['y'\]"):
    _into.check_buffers({"y": np.zeros(3)})
  _into.check_buffers({"y": jnp.zeros(3), "n": None})


def test_into_is_made_once_per_function_and_writes_in_place():
  g = donate.jit(lambda x: x * 2.0)
  buf = jnp.zeros(4)
  ptr = buf.unsafe_buffer_pointer()
  y = g.into(buf)(jnp.ones(4))
  assert g.into(jnp.zeros(4))._jitted is g.into(jnp.zeros(4))._jitted
  assert y.unsafe_buffer_pointer() == ptr and buf.is_deleted()


def test_options_shift_every_argument_number_for_the_leading_buffer():
  o = Options(donate_argnums=1, strict=("unusable", "copies"),
              jit_kwargs={"static_argnums": (0,), "in_shardings": (None, None)})
  shifted = o.with_leading_argument()
  assert shifted.donate_argnums == (2,)
  assert shifted.jit_kwargs == {"static_argnums": (1,), "in_shardings": (None, None, None)}
  assert (shifted.strict_unusable, shifted.strict_copies) == (True, True)
  assert donate.jit(lambda a, b: a, **o.keywords()) is not None
  with pytest.raises(DonationError, match="unknown strict mode"):
    Options(strict="always")
