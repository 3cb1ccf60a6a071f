"""The public names: one rule for byte counts, the old names kept, and every type a user receives
exported.

The rule (CONTRIBUTING.md, docs/api.md): `nbytes` is the size of one buffer (an array, a leaf, a
copied buffer, a pool, an allocation), as numpy and JAX name it; every other count of bytes is
`<what>_bytes`. A name the rule replaced stays as a read-only property that reads the new one.
"""

import dataclasses
import inspect
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import donate
from donate import planner, symm, targets, transforms
from donate._profile import proto
from donate._xla import gpu_targets

PUBLIC_MODULES = (donate, planner, symm, targets, transforms)

# The figures of a profile's `Step` and `Timeline`.
FIGURES = {
  "arguments": "argument_bytes",
  "outputs": "output_bytes",
  "aliased": "alias_bytes",
  "temporaries": "temp_bytes",
  "collective": "collective_bytes",
  "constants": "constant_bytes",
}
# class -> {old name: new name}: the names the rule replaced, each still read by its old name.
RENAMED = {
  donate.DonationPlan: {"bytes_requested": "requested_bytes", "bytes_reused": "reused_bytes"},
  donate.MemoryStats: {
    "argument": "argument_bytes",
    "output": "output_bytes",
    "alias": "alias_bytes",
    "temp": "temp_bytes",
    "generated_code": "generated_code_bytes",
    "peak": "peak_bytes",
  },
  donate.CopyRecord: {"bytes_per_call": "per_call_bytes"},
  donate.Entry: {"bytes": "nbytes"},
  donate.Step: {**FIGURES, "total": "total_bytes"},
  donate.Timeline: FIGURES,
  donate.Group: {"bytes": "total_bytes"},
  donate.Line: {"bytes": "total_bytes"},
  donate.Suggestion: {"bytes": "nbytes"},
  donate.Shadow: {"bytes": "nbytes"},
  donate.Fit: {"capacity": "capacity_bytes", "needed": "needed_bytes", "headroom": "headroom_bytes"},
  donate.Change: {"before": "before_bytes", "after": "after_bytes", "delta": "delta_bytes"},
  donate.Comparison: {
    "before_peak": "before_peak_bytes",
    "after_peak": "after_peak_bytes",
    "before_saved": "before_saved_bytes",
    "after_saved": "after_saved_bytes",
    "delta": "delta_bytes",
  },
  planner.Pool: {"size": "nbytes", "lower_bound": "lower_bound_bytes"},
  planner.Allocation: {"size": "nbytes"},
  symm.XlaAllocation: {"size": "nbytes"},
  targets.GpuSpec: {"l2_cache_size": "l2_cache_bytes", "device_memory_size": "device_memory_bytes"},
  proto.Allocation: {"size": "nbytes"},  # private, read like `symm.XlaAllocation`
}


def _examples():
  """One instance of each renamed class, every figure a different number (so that an alias that
  reads the wrong field cannot agree by chance)."""
  entry = donate.Entry(11, "temporary", "exp", "f32[4]", "f.py:3", None, "jit(f)/exp", (0, 2))
  leaf = donate.LeafInfo("x", (4,), "float32", 16, "cpu:0", None, donate.Kind.DEVICE, "ArrayImpl")
  decisions = (
    donate.LeafDecision(leaf, donate.Request.DONATE_ARGNUMS, None, donate.Action.ALIASED, "out",
                        donate.Cause.ELEMENTWISE_UPDATE, "elementwise update of this input"),
    donate.LeafDecision(dataclasses.replace(leaf, path="y", nbytes=48), None, None,
                        donate.Action.KEPT, None, donate.Cause.NOT_REQUESTED, "not requested"),
  )
  buffer = planner.Buffer("x", "input", "argument", (4,), "float32", 16, planner.LiveRange(0, 2))
  allocation = planner.Allocation(buffer, 0)
  loop = donate.Loop("while.6", "f.py:7", 8, "scan")
  return [
    donate.DonationPlan("f", decisions, (), (), donate.Layout((0,))),
    donate.MemoryStats(1000, 200, 30, 4, 5),
    donate.CopyRecord("copy.6", "copy", 64, (16,), "f32", (loop,), 8, "buf", "buf", 1, True, (),
                      "read after update", None),
    entry,
    donate.Step(3, "add", 1, 20, 300, 4000, 50000, 600000),
    donate.Timeline(("a", "b"), 1, 20, 300, (4000, 4001), (50000, 50001), 600000),
    donate.Group("f.py:3", 17, 2, ("temporary",)),
    donate.Line("f.py:3", "layer", 18, 2, "activations"),
    donate.Suggestion("w", "out", 19, 0, "w"),
    donate.Shadow("w", "out", 21, entry, 1000, True),
    donate.Fit("h100", 1000, 300),
    donate.Change("f.py:3", 100, 30),
    donate.Comparison(1000, 300, (), (), 70, 8),
    planner.Pool("arena", "regular", (), 64, 48, (allocation,)),
    allocation,
    symm.XlaAllocation(7, 4096, 1, "color 1", ()),
    targets.GpuSpec("h100", "H100", 132, (9, 0), 1, 52, 1.5, 80, (9, 0, 0), "spec"),
    proto.Allocation(7, 4096, 0, None, False, False, False, ()),
  ]


def test_every_old_name_reads_its_new_name():
  examples = {type(x): x for x in _examples()}
  assert set(examples) == set(RENAMED)
  for cls, names in RENAMED.items():
    for old, new in names.items():
      alias = inspect.getattr_static(cls, old, None)
      assert isinstance(alias, property) and alias.fset is None, f"{cls.__name__}.{old}"
      assert f"old name of `{new}`" in (alias.__doc__ or ""), f"{cls.__name__}.{old}"
      value = getattr(examples[cls], new)
      assert getattr(examples[cls], old) == value, f"{cls.__name__}.{old} != .{new}"
      # read-only (a frozen slotted dataclass raises TypeError before Python 3.12: its
      # `__setattr__` calls `super()` in the class that `slots=True` re-creates)
      with pytest.raises((AttributeError, TypeError)):
        setattr(examples[cls], old, value)


def test_the_old_names_change_no_equality_and_no_field():
  for cls, names in RENAMED.items():
    fields = {f.name for f in dataclasses.fields(cls)}
    assert not fields & set(names), f"{cls.__name__}: an old name is still a field"
  a, b = donate.MemoryStats(1, 2, 3, 4, 5), donate.MemoryStats(1, 2, 3, 4, 5)
  assert a == b and hash(a) == hash(b) and "argument_bytes=1" in repr(a)
  step = donate.Step(0, "add", 1, 2, 3, 4, 5)
  assert not hasattr(step, "__dict__"), "a base class of the old names without __slots__"


def _public_classes():
  found = {}
  for module in PUBLIC_MODULES:
    for name in module.__all__:
      obj = getattr(module, name)
      if isinstance(obj, type) and not issubclass(obj, BaseException):
        found[obj] = f"{module.__name__}.{name}"
  return found


def _attributes(cls) -> dict[str, object]:
  """The public fields and properties of `cls`: name -> the property (None for a field)."""
  names: dict[str, object] = {}
  if dataclasses.is_dataclass(cls):
    names.update({f.name: None for f in dataclasses.fields(cls) if not f.name.startswith("_")})
  for klass in cls.__mro__:
    if klass.__module__.startswith("donate"):
      for name, value in vars(klass).items():
        if isinstance(value, property) and not name.startswith("_"):
          names.setdefault(name, value)
  return names


def _is_old_name(value) -> bool:
  return isinstance(value, property) and "The old name of `" in (value.__doc__ or "")


def test_every_public_byte_count_follows_the_rule():
  """`nbytes` or `<what>_bytes`; a name with "size" in it, or "bytes" anywhere else, is an old
  name kept as an alias (and listed in RENAMED)."""
  broken = []
  for cls, where in _public_classes().items():
    for name, value in _attributes(cls).items():
      if not re.search(r"bytes|size", name):
        continue
      if _is_old_name(value):
        assert name in RENAMED.get(cls, {}), f"{where}.{name}: an old name missing from RENAMED"
      elif name != "nbytes" and not re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*_bytes", name):
        broken.append(f"{where}.{name}")
  assert not broken, f"byte counts named against the rule: {broken}"


def test_the_renamed_classes_are_public():
  public = _public_classes()
  assert all(cls in public for cls in RENAMED if cls is not proto.Allocation)


# The types a user receives: each exported, and the type the public API really returns.


def _sgd(w, x):
  def loss(w):
    return jnp.mean((x @ w) ** 2)

  return w - 0.1 * jax.grad(loss)(w)


def _read_after_update(buf, xs):
  def body(c, x):
    old = c[0]  # read before the in-place update, used after it: XLA copies the carry
    c = c.at[0].set(x)
    return c, old + c[1]

  return jax.lax.scan(body, buf, xs)


@pytest.fixture(scope="module")
def received():
  """(the exported type, an object of the public API's) pairs."""
  plan = donate.jit(_read_after_update, donate_argnums=0).plan(jnp.zeros(2**14), jnp.ones(4))
  profile = donate.memory_profile(
    jax.jit(_sgd, donate_argnums=0), jnp.ones((512, 512)), jnp.ones((16, 512))
  )
  plain = donate.memory_profile(jax.jit(_sgd), jnp.ones((512, 512)), jnp.ones((16, 512)))
  mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
  step = jax.shard_map(
    lambda x: jax.lax.psum(symm.with_symmetric(jnp.sin(x), "i"), "i"),
    mesh=mesh,
    in_specs=P("i"),
    out_specs=P(),
  )
  check = symm.check_placement(step, jnp.ones(4, jnp.float32))
  memory = planner.plan_memory(lambda x: jnp.sin(x) * 2, jnp.ones(4))
  return [
    (donate.DonationPlan, plan),
    (donate.LeafDecision, plan.decisions[0]),
    (donate.LeafInfo, plan.decisions[0].info),
    (donate.OutputInfo, plan.outputs[0]),
    (donate.Layout, plan.layout),
    (donate.MemoryStats, plan.memory),
    (donate.CopyRecord, plan.copies[0]),
    (donate.Loop, plan.copies[0].loop),
    (donate.MemoryProfile, profile),
    (donate.Entry, profile.at_peak[0]),
    (donate.Timeline, profile.timeline),
    (donate.Step, profile.timeline[profile.peak_step]),
    (donate.Group, profile.by_source()[0]),
    (donate.Group, profile.by_category()[0]),
    (donate.Group, profile.by_scope()[0]),
    (donate.Line, profile.by_line()[0]),
    (donate.Suggestion, plain.could_donate[0]),
    (donate.Shadow, profile.shadowed[0]),
    (donate.Fit, profile.fits("h100")),
    (donate.Comparison, plain.compare(profile)),
    (donate.Change, plain.compare(profile).by_source[0]),
    (donate.Saving, profile.saving),
    (donate.Program, profile.program),
    (donate.Advice, plain.advice(["donate_argnums=0"])[0]),
    (transforms.Into, donate.jit(lambda a, b: a + b).into(jnp.zeros(4))),
    (planner.MemoryPlan, memory),
    (planner.Pool, memory.arena),
    (planner.Allocation, memory.arena.allocations[0]),
    (planner.Buffer, memory.buffers[0]),
    (symm.PlacementCheck, check),
    (symm.PlacementPolicy, check.policy),
    (symm.PlacementReport, check.report),
    (symm.Placement, check.report.records[0]),
    (symm.CollectiveUse, check.report.collectives[0]),
    (symm.XlaCollectiveMemory, check.memory),
  ]


def test_every_type_received_is_the_exported_one(received):
  wrong = [f"{cls.__name__}: {type(obj).__name__}" for cls, obj in received if type(obj) is not cls]
  assert not wrong


def test_the_types_received_are_listed_in_the_api():
  """Each one in its module's `__all__` (docs/conf.py makes the API reference from them)."""
  expected = {
    donate: ["DonationPlan", "LeafDecision", "LeafInfo", "OutputInfo", "Layout", "MemoryStats",
             "CopyRecord", "Loop", "MemoryProfile", "Entry", "Timeline", "Step", "Group", "Line",
             "Suggestion", "Shadow", "Fit", "Comparison", "Change", "Saving", "Program", "Advice"],
    transforms: ["Compiled", "Lowered", "Traced", "JitWrapped", "Into"],
    planner: ["MemoryPlan", "Pool", "Allocation", "Buffer", "Copy", "LiveRange", "OffsetAssignment"],
    symm: ["PlacementCheck", "PlacementPolicy", "SpecEntry", "PlacementReport", "Placement",
           "CollectiveUse", "XlaCollectiveMemory", "XlaAllocation", "SizingRow", "CommBuffer"],
    targets: ["GpuSpec"],
  }
  for module, names in expected.items():
    assert not set(names) - set(module.__all__), module.__name__


def test_the_annotated_types_are_the_exported_ones():
  """Fields whose values the examples above do not build: their annotations name the type."""
  hints = typing.get_type_hints
  assert hints(symm.XlaCollectiveMemory)["allocations"] == tuple[symm.XlaAllocation, ...]
  assert hints(symm.PlacementPolicy)["process"] == tuple[symm.SpecEntry, ...]
  assert hints(donate.CopyRecord)["loops"] == tuple[donate.Loop, ...]
  assert hints(donate.LeafDecision)["info"] is donate.LeafInfo
  assert type(gpu_targets.SPECS["h100"]) is targets.GpuSpec
