"""Unit tests of donate._jit.binding: arguments split into leaves, paths and donation exactly as jax.jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import donate
from donate._jit import binding as _binding
from donate._plan import donation_plan as dp


def binding(fun, **jit_kwargs):
  return _binding.Binding(fun, jax.jit(fun, **jit_kwargs))


def step(params, batch, lr, *, mode="sgd", extra=None):
  return params


def test_static_arguments_leave_the_leaves_and_enter_the_key():
  b = binding(step, static_argnums=2, static_argnames="mode", donate_argnums=0)
  params, batch = {"w": jnp.ones(2), "b": jnp.zeros(2)}, jnp.ones(3)
  c1 = b.bind((params, batch, 0.1), {"mode": "adam"})
  c2 = b.bind((params, batch, 0.2), {"mode": "adam"})
  assert len(c1.leaves) == 3 and c1.positions == (0, 1)
  assert c1.key != c2.key  # another static value: another signature
  assert b.paths(c1) == ["params['b']", "params['w']", "batch"]
  assert b.donated_leaves(c1) == {0: "donate_argnums", 1: "donate_argnums"}


def test_keyword_arguments_are_named_and_donated_by_name():
  b = binding(step, donate_argnames=("params", "extra"))
  params = {"w": jnp.ones(2)}
  call = b.bind((), {"params": params, "batch": 1.0, "lr": 0.1, "extra": [jnp.ones(1)]})
  assert b.paths(call) == ["batch", "extra[0]", "lr", "params['w']"]
  assert b.donated_leaves(call) == {1: "donate_argnames", 3: "donate_argnames"}


def test_negative_static_argnums_and_rebuild_keep_the_static_values():
  b = binding(step, static_argnums=-1)
  args = ({"w": jnp.ones(2)}, jnp.ones(3), 0.5)
  call = b.bind(args, {})
  assert call.positions == (0, 1)
  new_args, new_kwargs = b.rebuild(call, args, {}, [jnp.zeros(2), jnp.zeros(3)])
  assert new_args[2] == 0.5 and new_args[0]["w"].tolist() == [0.0, 0.0] and new_kwargs == {}


def test_leaf_info_tells_device_abstract_and_host_leaves_apart():
  device = _binding.leaf_info("a", jnp.ones((2, 3)))
  abstract = _binding.leaf_info("b", jax.ShapeDtypeStruct((2, 3), jnp.float32))
  host = _binding.leaf_info("c", np.ones(3))
  scalar = _binding.leaf_info("d", 1.5)
  assert (device.kind, abstract.kind, host.kind, scalar.kind) == (dp.DEVICE, dp.ABSTRACT, dp.HOST,
                                                                  dp.HOST)
  assert device.nbytes == abstract.nbytes == 24 and device.sharding == "cpu:0"
  assert host.type_name == "ndarray" and not host.is_array


def test_meta_key_separates_what_a_plan_depends_on():
  a, b = jnp.ones(4), jnp.ones(4)
  assert _binding.meta_key(a) == _binding.meta_key(b)
  assert _binding.meta_key(a) != _binding.meta_key(np.ones(4))


class Checked:
  """A pytree class whose constructor checks its children (as many users' classes do)."""

  def __init__(self, w, b):
    if w.shape[-1] != b.shape[0]:
      raise ValueError(f"w {w.shape} and b {b.shape} do not fit")
    self.w, self.b = w, b


jax.tree_util.register_pytree_with_keys(
    Checked, lambda c: (((jax.tree_util.GetAttrKey("w"), c.w), (jax.tree_util.GetAttrKey("b"),
                                                                  c.b)), None),
    lambda _, children: Checked(*children))


@pytest.mark.parametrize("donate_argnums", [(), (0,)])
def test_a_pytree_class_that_checks_its_children_plans_and_runs(donate_argnums):
  def step(layer, x):
    return Checked(layer.w * 2.0, layer.b + x.sum()), x + 1.0

  f = donate.jit(step, donate_argnums=donate_argnums)
  layer, x = Checked(jnp.ones((3, 2)), jnp.ones(2)), jnp.ones(4)
  plan = f.plan(layer, x)
  assert [d.path for d in plan.decisions] == ["layer.w", "layer.b", "x"]
  assert [o.path for o in plan.outputs] == ["out[0].w", "out[0].b", "out[1]"]
  out, y = f(layer, x)
  want, want_y = jax.jit(step)(Checked(jnp.ones((3, 2)), jnp.ones(2)), jnp.ones(4))
  np.testing.assert_array_equal(out.w, want.w)
  np.testing.assert_array_equal(y, want_y)
  assert layer.w.is_deleted() == bool(donate_argnums) and not x.is_deleted()


class _Tagged:
  """A pytree node with metadata that may not hash or compare plainly (a list, an array)."""

  def __init__(self, x, tags):
    self.x, self.tags = x, tags


jax.tree_util.register_pytree_with_keys(
    _Tagged,
    lambda n: (((jax.tree_util.GetAttrKey("x"), n.x),), n.tags),
    lambda tags, children: _Tagged(children[0], tags),
)


def test_key_paths_are_read_once_per_structure_and_unhashable_metadata_still_works():
  tree = {"a": [jnp.ones(2), jnp.ones(3)], "b": jnp.ones(1)}
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  first = _binding.key_paths(treedef, leaves)
  assert first == ("['a'][0]", "['a'][1]", "['b']")
  assert _binding.key_paths(treedef, leaves) is first  # kept by treedef
  # Nodes whose metadata is a list or an array (not hashable, or ambiguous to compare): their
  # paths are right, cached or not, and jax.jit and donate.jit return them alike.
  for tags in (["t"], np.arange(3)):
    leaves, treedef = jax.tree_util.tree_flatten(_Tagged(jnp.ones(4), tags))
    assert _binding.key_paths(treedef, leaves) == (".x",) == _binding.key_paths(treedef, leaves)
  f = lambda x: _Tagged(x * 2, ["out"])
  ours, theirs = donate.jit(f, donate_argnums=0)(jnp.ones(4)), jax.jit(f)(jnp.ones(4))
  assert ours.tags == theirs.tags == ["out"] and (ours.x == theirs.x).all()


def _optimizer_state(n=8):
  """numpyro's optimizers' state: a pytree node registered without keys."""
  from jax.example_libraries import optimizers

  tree = jax.tree_util
  return optimizers.OptimizerState(
    ([jnp.ones(n)],), tree.tree_structure([0]), [tree.tree_structure(0)]
  )


def _state_and_varargs(state, *args, **kw):
  return jax.tree.map(lambda x: x * 2.0, state), jnp.tanh(args[0]) @ args[1], kw["lr"] + 1.0


def test_leaves_are_named_as_jaxs_args_info_names_them():
  """The first argument past the named ones is `args[0]` (JAX binds `*args` as a tuple by its
  name), a keyword taken by `**kw` is `kw['lr']`, and the child of a node registered without
  keys is `[0]` (JAX's debug info cleans keystr's `[<flat index 0>]`)."""
  args = (_optimizer_state(), jnp.ones((4, 4)), jnp.ones((4, 4)))
  kwargs = {"lr": jnp.ones(1)}
  theirs = jax.jit(_state_and_varargs).trace(*args, **kwargs).jaxpr.jaxpr.debug_info.arg_names
  plan = donate.jit(_state_and_varargs, donate_argnums=(0, 1)).plan(*args, **kwargs)
  assert tuple(d.path for d in plan.decisions) == theirs
  assert theirs == ("state[0][0][0]", "args[0]", "args[1]", "kw['lr']")
  assert donate.planner._arg_names(_state_and_varargs, args, kwargs) == list(theirs)


def test_the_same_program_profiled_under_either_jit_shows_no_change():
  args = (_optimizer_state(2**14), jnp.ones((128, 128)), jnp.ones((128, 128)))
  kwargs = {"lr": jnp.ones(1)}
  theirs = donate.memory_profile(jax.jit(_state_and_varargs), *args, **kwargs)
  ours = donate.memory_profile(donate.jit(_state_and_varargs), *args, **kwargs)
  comparison = theirs.compare(ours)
  changes = comparison.by_source + comparison.by_scope
  assert changes and all(c.before_bytes == c.after_bytes for c in changes), str(comparison)
