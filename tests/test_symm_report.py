"""donate._symm.report: where each annotated value landed, read from compiled HLO text (hand-written
here in the shapes XLA:GPU prints, so no GPU compiler is needed)."""

import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import donate
from donate._base.errors import DonationError, SymmetricMemoryWarning
from donate._symm import report
from donate._symm.xla import FLAG
from donate._xla import hlo as _hlo

MARK = 'frontend_attributes={donate.group="x",donate.symmetric="symm_mem"}'
MODE = 'backend_config={"collective_backend_config":{"collectives_mode":"%s"}}'

# The annotated sine sits inside a fusion (XLA keeps the attributes on the fused op); the cosine is
# not annotated. The all-reduce reads the sine through a bitcast; the all-gather reads the cosine.
PLACED = f"""HloModule m
%fused_sine (param_0: f32[256]) -> f32[256] {{
  %param_0 = f32[256]{{0}} parameter(0)
  ROOT %sin.1 = f32[256]{{0}} sine(%param_0), {MARK}
}}
ENTRY %main (p: f32[256]) -> (f32[256], f32[2048]) {{
  %p = f32[256]{{0}} parameter(0)
  %fusion = f32[256]{{0:S(1)}} fusion(%p), kind=kLoop, calls=%fused_sine
  %bitcast = f32[16,16]{{1,0:S(1)}} bitcast(%fusion)
  %cos = f32[256]{{0:S(1)}} cosine(%p)
  %all-reduce-start = f32[16,16]{{1,0:S(1)}} all-reduce-start(%bitcast), channel_id=1, to_apply=%add
  %all-reduce-done = f32[16,16]{{1,0:S(1)}} all-reduce-done(%all-reduce-start)
  %all-gather-start = (f32[256]{{0:S(1)}}, f32[2048]{{0:S(1)}}) all-gather-start(%cos), channel_id=2
  %all-gather-done = f32[2048]{{0:S(1)}} all-gather-done(%all-gather-start)
  ROOT %t = (f32[256]{{0}}, f32[2048]{{0}}) tuple(%all-reduce-done, %all-gather-done)
}}"""


def buf(producer="sin", collectives=("psum_invariant",), dtype="float32", shape=(256,),
        nbytes=1024, feeds=True):
  return types.SimpleNamespace(producer=producer, collectives=collectives, dtype=dtype,
                               shape=shape, nbytes=nbytes, feeds_collective=feeds)


@pytest.fixture(autouse=True)
def _no_process_spec(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)


def test_collectives_of_the_compiled_program():
  uses = report.collectives(_hlo.parse_module(PLACED))
  assert [(u.instruction, u.kind, u.memory_space, u.annotated, u.dtype, u.nbytes) for u in uses] == [
      ("all-reduce-start", "all-reduce", 1, True, "f32", 1024),
      ("all-gather-start", "all-gather", 1, False, "f32", 1024)]


def test_placed_value_and_the_unannotated_collective_placed_with_it():
  found = report.placement_report(PLACED, [buf()])
  (record,) = found.records
  assert (record.value, record.kind, record.instruction) == (
      "sin output float32[256]", "all-reduce", "all-reduce-start")
  assert record.placed and record.where == "collective memory S(1)"
  assert record.reason == "xla_gpu_enable_nccl_user_buffers places every collective's buffers"
  (also,) = found.also_placed
  assert (also.value, also.kind, also.memory_space) == (
      "un-annotated f32 operand (1024 B)", "all-gather", 1)
  assert not found.missing and found.check(strict=True) is found
  assert str(found).splitlines()[0] == (
      "PlacementReport: 1 of 1 annotated values in collective memory")
  assert "un-annotated collectives placed too: 1" in str(found)


def test_the_mode_option_and_the_process_spec_are_named_as_reasons(monkeypatch):
  text = PLACED.replace("to_apply=%add", "to_apply=%add, " + MODE % "COLLECTIVES_SYMMETRIC_MEMORY")
  (record,) = report.placement_report(text, [buf()]).records
  assert record.reason.startswith("the mode option=COLLECTIVES_SYMMETRIC_MEMORY")
  monkeypatch.setenv("XLA_FLAGS", f"{FLAG}=AllReduce:4096:F32")
  (record,) = report.placement_report(PLACED, [buf()]).records
  assert record.reason == "the process-wide spec AllReduce:4096:F32 matches it (op, size, dtype)"


def test_default_memory_with_the_reason(monkeypatch):
  default = PLACED.replace(":S(1)}", "}")
  (record,) = report.placement_report(default, [buf()]).records
  assert not record.placed and record.where == "default memory"
  assert record.reason.startswith("no collective-memory option was on for this compile")
  monkeypatch.setenv("XLA_FLAGS", f"{FLAG}=AllReduce:64")
  (record,) = report.placement_report(default, [buf()]).records
  assert "does not match its size or dtype (1024 B, f32)" in record.reason
  monkeypatch.setenv("XLA_FLAGS", f"{FLAG}=AllReduce")
  (record,) = report.placement_report(default, [buf()]).records
  assert "XLA did not read it" in record.reason


def test_a_value_no_compiled_collective_reads():
  (record,) = report.placement_report(PLACED, [buf(collectives=("ppermute",))]).records
  assert record.instruction == "" and "no collective in the compiled program reads it" in (
      record.reason)
  assert report.placement_report(PLACED, [buf(feeds=False)]).records == ()


def test_values_merged_by_the_combiner_are_found_through_tuples_and_concatenates():
  text = f"""HloModule m
ENTRY %main (p: f32[4]) -> f32[8] {{
  %p = f32[4]{{0}} parameter(0)
  %s = f32[4]{{0}} sine(%p), {MARK}
  %c = f32[4]{{0}} cosine(%p)
  %t = (f32[4]{{0}}, f32[4]{{0}}) tuple(%c, %s)
  %g = f32[4]{{0}} get-tuple-element(%t), index=1
  %h = f32[4]{{0}} get-tuple-element(%t), index=0
  %cat = f32[8]{{0:S(7)}} concatenate(%h, %g), dimensions={{0}}
  ROOT %ar = f32[8]{{0:S(7)}} all-reduce(%cat), channel_id=1, to_apply=%add
}}"""
  module = _hlo.parse_module(text)
  assert report._marked(module, "g") and not report._marked(module, "h")
  (use,) = report.collectives(module)
  assert use.annotated and use.memory_space == 7
  (record,) = report.placement_report(text, [buf(nbytes=16, shape=(4,))]).records
  assert record.where == "collective memory S(7)"


def test_several_values_are_matched_to_distinct_collectives_of_their_size():
  text = f"""HloModule m
ENTRY %main (p: f32[4]) -> f32[4] {{
  %p = f32[4]{{0}} parameter(0)
  %a = f32[4]{{0:S(1)}} sine(%p), {MARK}
  %b = f32[4]{{0}} cosine(%p), {MARK}
  %c = f32[8]{{0}} concatenate(%a, %b), {MARK}
  %ar.1 = f32[4]{{0:S(1)}} all-reduce(%a), channel_id=1, to_apply=%add
  %ar.2 = f32[4]{{0}} all-reduce(%b), channel_id=2, to_apply=%add
  ROOT %ar.3 = f32[8]{{0}} all-reduce(%c), channel_id=3, to_apply=%add
}}"""
  found = report.placement_report(text, [buf(nbytes=32), buf(nbytes=16), buf(nbytes=16)])
  assert [(r.instruction, r.placed) for r in found.records] == [
      ("ar.3", False), ("ar.1", True), ("ar.2", False)]


def test_check_warns_per_missing_value_or_raises_when_strict():
  found = report.placement_report(PLACED.replace(":S(1)}", "}"), [buf(), buf()])
  assert len(found.missing) == 2
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert found.check() is found
  assert [w.category for w in caught] == [SymmetricMemoryWarning] * 2
  assert all("requested symmetric placement did not happen" in str(w.message) for w in caught)
  with pytest.raises(DonationError, match="did not happen.*Fix: compile with"):
    found.check(strict=True)


def test_a_cpu_program_keeps_every_annotated_value_in_default_memory():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
  f = jax.shard_map(lambda v: lax.psum(donate.with_symmetric(jnp.sin(v), "x"), "x"), mesh=mesh,
                    in_specs=jax.P("x"), out_specs=jax.P())
  x = jnp.ones(8)
  bufs = donate.symm.comm_buffers(jax.make_jaxpr(f)(x))
  found = report.placement_report(jax.jit(f).lower(x).compile().as_text(), bufs)
  assert [r.placed for r in found.records] == [False] and not found.also_placed
