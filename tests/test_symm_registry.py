"""donate._symm.registry: JAX collectives to primitive names, the registry, and the wrapper that
marks a user collective's arguments."""

import functools
import threading

import jax
import jax.extend as jex
import jax.numpy as jnp
import pytest
from jax import lax

from donate._base.errors import DonationError
from donate._symm import registry

pytestmark = pytest.mark.usefixtures("no_symmetric_requirements")


@pytest.mark.parametrize("fn, kind", [
    (lax.psum, "psum"), (lax.pmax, "pmax"), (lax.pmin, "pmin"), (lax.pmean, "psum"),
    (lax.all_gather, "all_gather"), (lax.psum_scatter, "scatter"), (lax.ppermute, "ppermute"),
    (lax.all_to_all, "all_to_all")])
def test_each_jax_collective_maps_to_the_primitives_it_binds(fn, kind):
  names = registry.collective_primitive_names(fn)
  assert names and names <= registry.COLLECTIVE_PRIMITIVES
  assert any(kind in n for n in names), names


def test_primitives_and_names_map_to_themselves_other_callables_to_none():
  assert registry.collective_primitive_names(jex.core.Primitive("mine")) == {"mine"}
  assert registry.collective_primitive_names("psum") == {"psum"}
  assert registry.collective_primitive_names(jnp.sin) is None


def test_register_requirements_and_clear():
  registry.register({"psum", "ppermute"}, [0], "nccl")
  snapshot = registry.requirements()
  assert snapshot == {"psum": registry.Requirement("psum", (0,), "nccl"),
                      "ppermute": registry.Requirement("ppermute", (0,), "nccl")}
  snapshot.clear()  # a copy: the registry keeps its entries
  assert sorted(registry.requirements()) == ["ppermute", "psum"]
  registry.register({"psum"}, (0,), "symm_mem")  # the last registration wins
  assert registry.requirements()["psum"].kind == "symm_mem"
  registry.clear()
  assert registry.requirements() == {}


def test_registrations_from_many_threads_all_land():
  threads = [threading.Thread(target=registry.register, args=({f"p{k}"}, (0,), "k"))
             for k in range(16)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(registry.requirements()) == 16


@pytest.mark.parametrize("argnums", [1, (0, 1), ()])
def test_builtin_argnums_accepts_only_the_operand(argnums):
  assert registry.builtin_argnums(0, lax.psum) == (0,) == registry.builtin_argnums((0,), "psum")
  with pytest.raises(DonationError, match="only array argument is its first"):
    registry.builtin_argnums(argnums, lax.psum)


@pytest.mark.parametrize("argnums", [-1, (), (0, -2), True, (1.0,)])
def test_user_argnums_refuses_what_is_not_a_non_negative_int(argnums):
  assert registry.user_argnums((2, 0), print) == (2, 0)
  with pytest.raises(DonationError, match="bad argnums"):
    registry.user_argnums(argnums, print)


def marked_sources(fn, *args):
  closed = jax.make_jaxpr(fn, axis_env=[("i", 1), ("j", 1)])(*args)
  return [(e.params["axis_name"], e.params["kind"]) for e in closed.jaxpr.eqns
          if e.primitive.name == "symmetric"]


def test_wrapper_marks_the_chosen_arguments_positional_or_keyword():
  def collective(x, y, axis_name):
    return x + y

  wrapped = registry.wrap_collective(collective, (1,), "nccl", None)
  assert wrapped.__wrapped__ is collective and wrapped.__name__ == "collective"
  assert marked_sources(lambda a, b: wrapped(a, b, "i"), 1.0, 2.0) == [(("i",), "nccl")]
  assert marked_sources(lambda a, b: wrapped(a, y=b, axis_name="j"), 1.0, 2.0) == [
      (("j",), "nccl")]
  assert marked_sources(lambda a, b: wrapped(y=b, x=a, axis_name="i"), 1.0, 2.0) == [
      (("i",), "nccl")]
  assert float(wrapped(1.0, 2.0, "i")) == 3.0  # eager: nothing is marked


def test_wrapper_takes_the_group_from_axes_or_from_the_registration():
  def by_axes(x, axes):
    return x

  wrapped = registry.wrap_collective(by_axes, (0,), "k", None)
  assert marked_sources(lambda a: wrapped(a, axes=("i", "j")), 1.0) == [(("i", "j"), "k")]
  fixed = registry.wrap_collective(lambda x: x, (0,), "k", "j")
  assert marked_sources(fixed, 1.0) == [(("j",), "k")]
  with pytest.raises(DonationError, match="cannot find the group"):
    registry.wrap_collective(lambda x: x, (0,), "k", None)(1.0)


def test_wrapper_of_a_callable_without_a_signature_marks_by_position():
  class NoSignature:
    __signature__ = property(lambda self: (_ for _ in ()).throw(ValueError("no signature")))

    def __call__(self, *args):
      return args[0] + args[1]

  wrapped = registry.wrap_collective(NoSignature(), (1,), "k", "i")
  assert marked_sources(wrapped, 1.0, 2.0) == [(("i",), "k")]


def test_wrapper_carries_its_requirement():
  wrapped = registry.wrap_collective(functools.partial(lambda x, axis_name: x), (0,), "k", None)
  assert wrapped.__donate_requirement__ == registry.Requirement("collective", (0,), "k")
  assert registry.requirements() == {}  # user collectives are wrapped, never registered
