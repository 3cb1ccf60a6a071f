"""donate._symm.xla: the target platform, and the XLA:GPU options and process-wide spec that place
the annotated collectives; decided from facts alone, without compiling for a GPU."""

import types

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import donate
from donate import symm
from donate._base.errors import DonationError
from donate._symm import xla
from donate._symm.xla import FLAG, SYMMETRIC


def bufs(*collectives):
  """Stand-ins for comm buffers: one per annotated value, with the collectives it feeds."""
  return [types.SimpleNamespace(collectives=(c,)) for c in collectives]


def sharding(platform, kind="", version=""):
  device = types.SimpleNamespace(platform=platform, device_kind=kind,
                                 client=types.SimpleNamespace(platform_version=version))
  return types.SimpleNamespace(device_set=[device])


def test_gpu_compile_options_only_for_gpu_platforms():
  marked = symm.comm_buffers(jax.make_jaxpr(
      lambda v: lax.psum(donate.with_symmetric(v * 2, "i"), "i"), axis_env=[("i", 1)])(1.0))
  cuda = xla.gpu_compile_options("cuda", marked)
  assert cuda == {"xla_gpu_enable_nccl_user_buffers": True,
                  "xla_gpu_experimental_enable_nccl_symmetric_buffers": True}
  assert xla.gpu_compile_options("ROCm", marked) == {"xla_gpu_enable_nccl_user_buffers": True}
  assert xla.gpu_compile_options("cpu", marked) == {} == xla.gpu_compile_options("tpu", marked)
  assert xla.gpu_compile_options("cuda", ()) == {}
  # Every name is a real XLA debug option: XLA rejects unknown ones ("No such compile option").
  assert float(jax.jit(jnp.sin, compiler_options=cuda)(0.0)) == 0.0
  with pytest.raises(Exception, match="No such compile option"):
    jax.jit(jnp.sin, compiler_options={"xla_gpu_enable_nccl_user_buffer": True})(0.0)


def test_parse_spec_entries():
  (a, g) = xla.parse_spec(" allreduce:8192:f32 ,AllGather,")
  assert (a.op, a.max_bytes, a.dtype, a.kind) == ("AllReduce", 8192, "F32", "all-reduce")
  assert (g.op, g.max_bytes, g.dtype, str(g)) == ("AllGather", None, None, "AllGather")
  assert xla.parse_spec("") == ()


@pytest.mark.parametrize("text", ["Broadcast", "AllReduce:big", "AllReduce:1:F32:x", "AllReduce:-1"])
def test_parse_spec_refuses_bad_entries(text):
  with pytest.raises(DonationError, match="bad collective-memory spec entry"):
    xla.parse_spec(text)


def test_spec_entry_matches_kind_size_and_dtype():
  (entry,) = xla.parse_spec("AllReduce:1024:F32")
  assert entry.matches("all-reduce", 1024, "f32")
  assert not entry.matches("all-reduce", 1025, "f32")
  assert not entry.matches("all-reduce", 8, "bf16")
  assert not entry.matches("all-gather", 8, "f32")
  (any_size,) = xla.parse_spec("AllGather")
  assert any_size.matches("all-gather", 1 << 40, "s8")


def test_process_spec_reads_the_last_setting_in_xla_flags(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", f"{FLAG}=AllGather --xla_foo=1 {FLAG}=AllReduce:64")
  assert [str(e) for e in xla.process_spec()] == ["AllReduce:64"]
  monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1")
  assert xla.process_spec() == ()
  monkeypatch.delenv("XLA_FLAGS")
  assert xla.process_spec() == ()


def test_spec_support_starts_at_jaxlib_0_12():
  assert [xla.spec_supported(v) for v in ("0.10.2", "0.11.9", "0.12.0", "1.0")] == [
      False, False, True, True]
  xla.require_spec_support("0.12.0.1")
  with pytest.raises(DonationError, match="jaxlib 0.10.2 has no per-collective"):
    xla.require_spec_support("0.10.2")


def test_configure_after_jax_started_is_refused_and_leaves_xla_flags(monkeypatch):
  jnp.ones(1)  # a backend exists
  monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1")
  with pytest.raises(DonationError, match="too late"):
    xla.configure("AllReduce")
  with pytest.raises(DonationError, match="bad collective-memory spec"):
    xla.configure("Broadcast")  # the entries are checked first
  assert xla.process_spec() == () and xla.flags_with_spec("--xla_foo=1", ()) == "--xla_foo=1"


def test_flags_with_spec_replaces_every_earlier_setting():
  flags = f"{FLAG}=AllGather --xla_foo=1 {FLAG}=AllToAll"
  entries = xla.parse_spec("AllReduce:64:F32,CollectivePermute")
  assert xla.flags_with_spec(flags, entries) == (
      f"--xla_foo=1 {FLAG}=AllReduce:64:F32,CollectivePermute")


def test_target_platform_from_shardings():
  abstract = jax.sharding.NamedSharding(jax.sharding.AbstractMesh((2,), ("x",)), jax.P("x"))
  cpu = jax.sharding.make_single_device_sharding(jax.devices()[0])
  assert xla.target_platform([], "cpu") == "cpu"
  assert xla.target_platform([None, abstract], "tpu") == "tpu"  # no devices: the default
  assert xla.target_platform([abstract], "gpu") == "cuda"
  assert xla.target_platform([cpu], "gpu") == "cpu"
  assert xla.target_platform([sharding("gpu", "NVIDIA H100 80GB HBM3")], "cpu") == "cuda"
  assert xla.target_platform([sharding("gpu", "", "cuda 12.8")], "cpu") == "cuda"
  assert xla.target_platform([sharding("gpu", "AMD Instinct MI300X")], "cpu") == "rocm"
  assert xla.target_platform([sharding("gpu", "mystery")], "cpu") == "gpu"
  assert xla.target_platform([cpu, sharding("gpu", "NVIDIA B200")], "cpu") == "cuda"  # GPU wins


def test_annotated_kinds():
  assert xla.annotated_kinds(bufs("psum_invariant", "all_gather", "pmax")) == (
      ("all-reduce", "all-gather"), False)
  assert xla.annotated_kinds(bufs("pbroadcast")) == ((), False)
  assert xla.annotated_kinds(bufs("declared")) == ((), True)


def test_no_options_off_gpus_without_annotations_or_when_disabled(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  for platform, buffers, enabled in [("cpu", bufs("psum"), True), ("tpu", bufs("psum"), True),
                                     ("cuda", [], True), ("cuda", bufs("psum"), False),
                                     ("cuda", [types.SimpleNamespace(collectives=())], True)]:
    policy = xla.placement_policy(platform, buffers, enabled=enabled)
    assert (policy.options, policy.routes, policy.placed_too) == ({}, (), ()), platform


def test_kinds_with_a_mode_option_are_placed_by_kind(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  policy = xla.placement_policy("cuda", bufs("all_gather", "ppermute", "all_gather_invariant"))
  assert policy.options == {"xla_gpu_all_gather_mode": SYMMETRIC,
                            "xla_gpu_collective_permute_mode": SYMMETRIC}
  assert policy.route("all-gather").startswith("xla_gpu_all_gather_mode=")
  assert policy.route("all-reduce") is None
  assert len(policy.placed_too) == 2 and "every un-annotated all-gather" in policy.placed_too[0]
  assert xla.compile_options_for("cuda", bufs("ppermute")) == {
      "xla_gpu_collective_permute_mode": SYMMETRIC}


@pytest.mark.parametrize("platform, collectives", [
    ("cuda", ("psum",)), ("cuda", ("all_gather", "psum_scatter")), ("cuda", ("declared",)),
    ("rocm", ("all_gather",))])
def test_otherwise_every_collective_is_placed_and_the_policy_says_so(monkeypatch, platform,
                                                                    collectives):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  policy = xla.placement_policy(platform, bufs(*collectives))
  assert policy.options == xla.gpu_compile_options(platform, bufs(*collectives))
  (sentence,) = policy.placed_too
  assert sentence.startswith("every un-annotated collective is placed too")
  assert all(route.startswith("xla_gpu_enable_nccl_user_buffers") for _, route in policy.routes)


def test_a_process_wide_spec_places_kinds_without_a_mode_option(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", f"{FLAG}=AllReduce:1024:F32")
  policy = xla.placement_policy("cuda", bufs("psum", "all_gather"))
  assert policy.options == {"xla_gpu_all_gather_mode": SYMMETRIC}
  assert policy.route("all-reduce") == f"process-wide {FLAG[2:]}=AllReduce:1024:F32"
  assert [str(e) for e in policy.process] == ["AllReduce:1024:F32"]
  assert "annotated or not, in every program of the process" in policy.placed_too[0]
