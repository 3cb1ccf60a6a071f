"""Unit tests of donate._base.primitives: the table of primitive facts and the two annotation primitives."""

import sys

import jax
import jax.extend
import jax.numpy as jnp
import pytest

from donate import symm  # noqa: F401  (defines the `symmetric` primitive)
from donate._base import primitives as prims

TABLES = {
    "IDENTITY": prims.IDENTITY, "VIEW": prims.VIEW, "ELEMENTWISE": prims.ELEMENTWISE,
    "IN_PLACE": prims.IN_PLACE, "CALL": prims.CALL, "CUSTOM": prims.CUSTOM, "LOOP": prims.LOOP,
    "TRANSPARENT": prims.TRANSPARENT, "PRNG_KEY": prims.PRNG_KEY, "KEY_PARTS": prims.KEY_PARTS,
    "TRACE_BACK_VIEWS": prims.TRACE_BACK_VIEWS,
}


def _defined_primitive_names() -> set[str]:
  """Every primitive name defined by a loaded jax module or by this package."""
  jnp.linalg.norm, jax.lax.scan, jax.checkpoint  # make sure the usual modules are loaded
  names = set()
  for module in list(sys.modules.values()):
    if module is None or not getattr(module, "__name__", "").startswith(("jax", "donate")):
      continue
    for value in list(vars(module).values()):
      if isinstance(value, jax.extend.core.Primitive):
        names.add(value.name)
  return names


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_name_is_a_primitive_of_this_jax_or_marked_version_specific(table):
  defined = _defined_primitive_names()
  unknown = sorted(TABLES[table] - defined - prims.VERSION_SPECIFIC)
  assert not unknown, f"{table} names primitives this jax does not define: {unknown}"


def test_version_specific_names_are_used_and_own_ones_are_defined():
  used = set().union(*TABLES.values())
  assert prims.VERSION_SPECIFIC <= used
  assert prims.OWN <= _defined_primitive_names()


def test_facts_are_consistent():
  # A primitive is one kind of thing: never both a buffer identity and a computation.
  assert not prims.IDENTITY & (prims.ELEMENTWISE | prims.IN_PLACE | prims.CALL | prims.CUSTOM)
  assert not prims.IN_PLACE & prims.ELEMENTWISE
  assert prims.VIEW <= prims.TRACE_BACK_VIEWS


def test_walkers_read_the_table():
  # The names the jaxprs of common programs use are classified as the walkers expect.
  def f(x, i):
    y = jnp.sin(x) * 2.0
    y = jax.lax.dynamic_update_slice(y, jnp.ones(1), (i,))
    return jax.lax.optimization_barrier(y.reshape(2, 2))
  names = [e.primitive.name for e in jax.make_jaxpr(f)(jnp.ones(4), 0).eqns]
  assert {"sin", "mul"} <= prims.ELEMENTWISE & set(names)
  assert "dynamic_update_slice" in prims.IN_PLACE & set(names)
  assert "optimization_barrier" in prims.IDENTITY & set(names)
  assert "reshape" in prims.VIEW & set(names)


def test_donate_buffer_and_alias_lower_to_nothing():
  def f(x, y):
    from donate import alias, donate_buffer
    return donate_buffer(x) + alias(y, y + 1)
  text = jax.jit(f).lower(jnp.ones(3), jnp.ones(3)).as_text()
  assert "donate" not in text
  jaxpr = jax.make_jaxpr(f)(jnp.ones(3), jnp.ones(3))
  assert [e.primitive.name for e in jaxpr.eqns].count("donate_buffer") == 1
  assert all(not e.params for e in jaxpr.eqns if e.primitive.name == "donate_buffer")
