"""Unit tests of donate._plan.pairing (make_plan), donate._plan.keys (fcfs_pairs) and the plan data
model, from plain data."""

import jax
import numpy as np
import pytest

from donate._base.errors import DonationError
from donate._plan import dataflow as df
from donate._plan import donation_plan as dp
from donate._plan import keys as _keys
from donate._plan import pairing as _pairing

CPU = jax.sharding.make_single_device_sharding(jax.devices()[0])


def leaf(path, shape=(4,), dtype="float32", kind=dp.DEVICE, sharding=None):
  nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
  return dp.LeafInfo(path, shape, dtype, nbytes, "cpu:0", None, kind, "ArrayImpl", sharding)


def out(path, shape=(4,), dtype="float32", sharding=None):
  return dp.OutputInfo(path, shape, dtype, int(np.prod(shape)) * np.dtype(dtype).itemsize,
                       sharding)


def flow(out_sources, n_in, annotations=(), used=None):
  return df.Dataflow(tuple(annotations), tuple(out_sources),
                     tuple(frozenset() for _ in out_sources), tuple(used or [True] * n_in))


def plan(leaves, outputs, requested, dataflow, **kw):
  return _pairing.make_plan("f", leaves, outputs, requested, dataflow, **kw)


def test_dataflow_pairs_where_first_come_first_served_would_copy():
  # (b.at[0].set(1), a + 1): b updates out[0] in place, a becomes out[1].
  leaves, outputs = [leaf("a"), leaf("b")], [out("out[0]"), out("out[1]")]
  p = plan(leaves, outputs, {0: "donate_argnums", 1: "donate_argnums"},
           flow([{1: df.UPDATE}, {0: df.ELEMENTWISE}], 2))
  assert p.pairs() == {1: 0, 0: 1}
  assert _keys.fcfs_pairs(leaves, outputs, [0, 1]) == {0: 0, 1: 1}
  assert p.layout.donated == (0, 1)
  assert [d.action for d in p.decisions] == [dp.ALIASED, dp.ALIASED]


def test_host_unused_donor_and_unusable_leaves():
  leaves = [leaf("h", kind=dp.HOST), leaf("u"), leaf("d", shape=(2, 2)), leaf("x", shape=(3,)),
            leaf("k")]
  outputs = [out("out[0]", shape=(4,), dtype="int32")]
  requested = dict.fromkeys(range(4), "donate_argnums")
  p = plan(leaves, outputs, requested, flow([{}], 5, used=[True, False, True, True, True]))
  actions = [d.action for d in p.decisions]
  assert actions == [dp.UNUSABLE, dp.UNUSED, dp.DONOR, dp.UNUSABLE, dp.KEPT]
  # The host value: its copy on the device is donated, and d took the only output of its size.
  assert p.decisions[0].cause == dp.Cause.NOT_A_DEVICE_BUFFER
  assert p.decisions[0].reason.startswith("not a device buffer (ArrayImpl); its copy on the")
  used = [True, False, True, True, True]
  two = plan(leaves, [*outputs, out("out[1]")], requested, flow([{}, {}], 5, used=used))
  assert two.decisions[0].action == dp.KEPT  # out[1] is free for its copy
  assert two.decisions[0].reason.startswith(dp.NOT_A_DEVICE_BUFFER)
  assert "no output of its shape and dtype" in p.decisions[3].reason
  assert p.decisions[4].requested is False


def test_keep_unused_donates_an_unread_input():
  p = plan([leaf("a")], [out("out")], {0: "donate_argnums"}, flow([{}], 1, used=[False]),
           keep_unused=True)
  assert p.decisions[0].action == dp.ALIASED


def test_alias_of_two_inputs_is_one_error_listing_it():
  annotations = [df.Annotation("alias", "f.py:3", 0, 1)]
  with pytest.raises(DonationError, match="aliases two inputs"):
    plan([leaf("a"), leaf("b")], [out("out")], {}, flow([{}], 2, annotations))


def test_jax_groups_by_memory_kind_only_when_every_value_has_one():
  device = CPU.with_memory_kind("device")
  pinned = CPU.with_memory_kind("pinned_host")
  leaves = [leaf("a", sharding=pinned), leaf("b", sharding=device)]
  outputs = [out("out", sharding=device)]
  # Every value has a memory kind: the device output takes the device input.
  assert _keys.fcfs_pairs(leaves, outputs, [0, 1]) == {1: 0}
  # An output without one: jax.jit ignores memory kinds and takes the first donated input.
  assert _keys.fcfs_pairs(leaves, [out("out")], [0, 1]) == {0: 0}


def test_plan_text_fits_in_100_columns_and_names_every_leaf():
  leaves = [leaf(f"params['layer_{i}']['kernel']", shape=(1024, 1024)) for i in range(3)]
  outputs = [out(f"out[{i}]", shape=(1024, 1024)) for i in range(3)]
  p = plan(leaves, outputs, dict.fromkeys(range(3), "donate_argnums"),
           flow([{i: df.ELEMENTWISE} for i in range(3)], 3))
  text = str(p)
  assert max(map(len, text.splitlines())) <= 100
  assert all(l.path in text for l in leaves)
  assert p.bytes_requested == 3 * 4 * 1024 * 1024


def test_an_output_of_its_shape_in_other_memory_is_a_memory_difference_not_a_sharding_one():
  device, pinned = CPU.with_memory_kind("device"), CPU.with_memory_kind("pinned_host")
  requested, same = {0: "donate_argnums"}, flow([{0: df.ELEMENTWISE}], 1)
  d = plan([leaf("a", sharding=pinned)], [out("out", sharding=device)], requested, same).decisions[0]
  assert (str(d.action), d.cause) == ("unusable", dp.Cause.MEMORY_DIFFERS)
  assert d.reason == ("no output of its shape and dtype in its memory; nearest is out: memory "
                      "kind device vs pinned_host")
  # an output without a memory kind: jax.jit pairs by shape and dtype alone, and the shardings
  # of the output of its shape say where the difference is
  leaves = [leaf("a", sharding=pinned), leaf("b", sharding=device)]
  outputs = [out("out", sharding=device), out("other", shape=(2,))]
  p = plan(leaves, outputs, {0: "donate_argnums", 1: "donate_argnums"},
           flow([{1: df.ELEMENTWISE}, {}], 2))
  d = p.decisions[0]
  assert (str(d.action), d.cause) == ("unusable", dp.Cause.MEMORY_DIFFERS)
  assert d.reason == "not usable: memory kind differs (in pinned_host, out device)"
