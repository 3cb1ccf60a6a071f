"""Symmetric memory that reaches the GPU: real H100/B200 executables compiled ahead of time here.

Each test compiles with plain `jax.jit` plus the options `donate.symm.compile_options_for` returns
(what `donate.jit` does on a GPU target) for abstract GPU meshes (`donate.targets`), and asserts on
the compiled program: memory spaces of collective operands, aliases, XLA's buffer assignment.
"""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import donate
from donate import _examples as examples
from donate import symm, targets
from donate._symm.report import collectives
from donate._symm.xla import spec_supported
from donate._xla import hlo as _hlo

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _abstract(mesh, shape=(8192,), spec=P("x")):
  return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))


def _program(mesh, *, reduce_marked=False, gather_marked=False):
  def body(v):
    a, b = jnp.sin(v), jnp.cos(v)
    a = donate.with_symmetric(a, "x") if reduce_marked else a
    b = donate.with_symmetric(b, "x") if gather_marked else b
    return lax.psum(a, "x"), lax.all_gather(b, "x", tiled=True)
  return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P(), P()), check_vma=False)


def _compile(f, *args, donate_argnums=()):
  """As donate.jit will: comm buffers, target platform, options, plain jax.jit, the report."""
  bufs = symm.comm_buffers(symm.mark_required(jax.make_jaxpr(f)(*args)))
  platform = symm.target_platform([a.sharding for a in args], jax.default_backend())
  options = symm.compile_options_for(platform, bufs)
  compiled = jax.jit(f, donate_argnums=donate_argnums).lower(*args).compile(
      compiler_options=options)
  return compiled, symm.placement_report(compiled.as_text(), bufs), options


def _spaces(compiled):
  """{collective kind: memory space of its first operand} read from the compiled HLO."""
  module = _hlo.parse_module(compiled.as_text())
  return {u.kind: u.memory_space for u in collectives(module)}


@pytest.fixture(scope="module")
def h100():
  return targets.gpu_mesh("h100", 8)


def test_configs_carry_the_published_figures():
  h, b = targets.gpu_spec("h100"), targets.gpu_spec("b200")
  assert (h.core_count, h.compute_capability, h.memory_bandwidth) == (132, (9, 0), 3352320000000)
  assert (b.core_count, b.compute_capability, b.device_memory_size) == (148, (10, 0), 191514411008)
  with pytest.raises(donate.DonationError, match="b200, h100"):
    targets.gpu_spec("a100")


@pytest.mark.parametrize("gpu, kind", [("h100", "NVIDIA H100 80GB HBM3"), ("b200", "NVIDIA B200")])
def test_gpu_mesh_is_a_cuda_target(gpu, kind):
  mesh = targets.gpu_mesh(gpu, 8, ("dp", "tp"), shape=(2, 4))
  assert mesh.devices.shape == (2, 4) and mesh.devices.flat[0].device_kind == kind
  x = _abstract(mesh, (64, 64), P("dp", "tp"))
  assert symm.target_platform([None, x.sharding], "cpu") == "cuda"
  assert symm.target_platform([jax.sharding.NamedSharding(jax.sharding.AbstractMesh(
      (2,), ("x",)), P("x"))], "cpu") == "cpu"  # no devices: the default backend


def test_annotated_all_reduce_lands_in_collective_memory(h100):
  compiled, report, options = _compile(_program(h100, reduce_marked=True), _abstract(h100))
  assert options  # all-reduce: only the all-collectives option places it per compile
  assert _spaces(compiled)["all-reduce"] > 0
  (record,) = report.records
  assert record.placed and record.kind == "all-reduce" and "S(" in record.where
  # XLA cannot place this all-reduce alone per compile: the all-gather is placed too, and said so.
  assert [u.kind for u in report.also_placed] == ["all-gather"]


def test_unannotated_collective_stays_in_default_memory(h100):
  compiled, report, options = _compile(_program(h100, gather_marked=True), _abstract(h100))
  assert options == {"xla_gpu_all_gather_mode": "COLLECTIVES_SYMMETRIC_MEMORY"}
  spaces = _spaces(compiled)
  assert spaces["all-gather"] > 0 and spaces["all-reduce"] == 0
  assert report.records[0].placed and not report.also_placed and not report.missing


def test_no_annotation_no_collective_memory(h100):
  compiled, report, options = _compile(_program(h100), _abstract(h100))
  assert options == {} and not report.records
  assert set(_spaces(compiled).values()) == {0}
  assert "S(" not in compiled.as_text().split("ENTRY")[1]


def test_missing_placement_is_a_warning_or_an_error(h100):
  f, x = _program(h100, reduce_marked=True), _abstract(h100)
  bufs = symm.comm_buffers(jax.make_jaxpr(f)(x))
  text = jax.jit(f).lower(x).compile().as_text()  # compiled without the options
  report = symm.placement_report(text, bufs)
  assert [r.where for r in report.records] == ["default memory"]
  assert "no collective-memory option" in report.records[0].reason
  with pytest.warns(symm.SymmetricMemoryWarning, match="did not happen"):
    report.check()
  with pytest.raises(donate.DonationError, match="did not happen"):
    report.check(strict=True)


def test_donated_abstract_arguments_alias_on_the_gpu_target(h100):
  x = _abstract(h100, (8, 1024), P("x", None))
  f = lambda a: a.at[:, 0].set(1.0) * 2.0
  compiled = jax.jit(f, donate_argnums=0).lower(x).compile()
  header = compiled.as_text().splitlines()[0]
  assert "input_output_alias" in header and "alias" in header.split("input_output_alias")[1]


def test_reported_size_is_xla_allocation(h100):
  f, x = _program(h100, reduce_marked=True), _abstract(h100)
  bufs = symm.comm_buffers(jax.make_jaxpr(f)(x))
  options = symm.compile_options_for("cuda", bufs)
  compiled, memory = symm.xla_collective_memory(jax.jit(f).lower(x), options)
  (alloc,) = memory.allocations
  assert memory.nbytes == alloc.size > 0 and alloc.color == memory.color > 0
  placed = {name for name, _, _ in alloc.values}
  assert any("all-reduce" in n or "psum" in n for n in placed)  # the placed buffers are in it
  assert memory.nbytes <= compiled.memory_analysis().temp_size_in_bytes
  assert memory.recommended_mb == -(-memory.nbytes // 2**20)
  assert memory.env == {"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": str(memory.recommended_mb)}


def test_b200_places_the_annotated_all_gather_only():
  mesh = targets.gpu_mesh("b200", 8)
  compiled, report, _ = _compile(_program(mesh, gather_marked=True), _abstract(mesh))
  spaces = _spaces(compiled)
  assert spaces["all-gather"] > 0 and spaces["all-reduce"] == 0 and report.records[0].placed


def test_transformer_step_on_h100_places_gradient_reductions():
  mesh = targets.gpu_mesh("h100", 8, ("dp", "tp"), shape=(2, 4))
  args = examples.block_abstract_args(mesh, batch=4, seq=32, d_model=64, d_ff=128)
  check = symm.check_placement(examples.block_train_step(mesh), *args, donate_argnums=(0, 1))
  assert check.platform == "cuda" and check.aliases >= 16  # params and momentum donated
  assert len(check.report.records) == 8 and not check.report.missing
  assert {r.kind for r in check.report.records} == {"all-reduce"}
  kinds = {u.kind for u in check.report.collectives}
  assert kinds >= {"all-reduce", "all-gather", "reduce-scatter", "collective-permute"}
  assert 0 < check.planned_bytes <= check.memory.nbytes


def test_configure_too_late_is_refused():
  with pytest.raises(donate.DonationError, match="too late|jaxlib"):
    symm.configure("AllReduce")
  with pytest.raises(donate.DonationError, match="Op\\[:max_bytes"):
    symm.configure("Broadcast")


_SELECTIVE = textwrap.dedent("""
    import donate, jax
    from donate import symm
    try:
      symm.configure("AllReduce:1048576:F32")
    except donate.DonationError as e:
      print("REFUSED", e); raise SystemExit(0)
    jax.config.update("jax_platforms", "cpu")
    import test_gpu_aot as t
    mesh = donate.targets.gpu_mesh("h100", 8)
    compiled, report, options = t._compile(t._program(mesh, reduce_marked=True), t._abstract(mesh))
    print("OPTIONS", options)
    print("SPACES", sorted(t._spaces(compiled).items()))
    print("PLACED", [r.placed for r in report.records], len(report.also_placed))
""")


def test_configure_places_only_the_annotated_all_reduce_on_jaxlib_0_12():
  home = os.path.dirname(os.path.dirname(donate.__file__))  # the checkout, or an installed wheel's
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([home, os.path.join(REPO, "tests")]))
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, "-c", _SELECTIVE], env=env, capture_output=True,
                       text=True, timeout=300, check=True).stdout
  if "REFUSED" in out:  # jaxlib 0.10: the flag does not exist there (XLA would abort on it)
    assert not spec_supported() and "jaxlib" in out
    return
  lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
  assert lines["OPTIONS"] == "{}"
  spaces = dict(eval(lines["SPACES"]))
  assert spaces["all-reduce"] > 0 and spaces["all-gather"] == 0
  assert lines["PLACED"] == "[True] 0"


# ---- donate.jit on a GPU target: the same options, the placement in the plan ------------------

def test_donate_jit_places_the_annotated_collective_on_the_h100_target(h100):
  x = _abstract(h100)
  g = donate.jit(_program(h100, gather_marked=True), donate_argnums=0)
  compiled = g.lower(x).compile()
  spaces = _spaces(compiled)
  assert spaces["all-gather"] not in (None, 0) and spaces["all-reduce"] in (None, 0)
  report = compiled.plan.placements
  assert report is not None and all(r.placed for r in report.records)
  assert "collective memory S(" in str(compiled.plan)
  assert any("all-gather" in n for n in compiled.plan.notes)  # what else the option places


def test_donate_jit_all_reduce_placement_and_opting_out(h100):
  x = _abstract(h100)
  placed = donate.jit(_program(h100, reduce_marked=True)).lower(x).compile()
  assert _spaces(placed)["all-reduce"] not in (None, 0)
  assert all(r.placed for r in placed.plan.placements.records)
  off = donate.jit(_program(h100, reduce_marked=True), symmetric_placement=False)
  compiled = off.lower(x).compile()
  assert set(_spaces(compiled).values()) <= {None, 0} and compiled.plan.placements is None
  plain = donate.jit(_program(h100)).lower(x).compile()  # no annotation: jax.jit's own program
  assert set(_spaces(plain).values()) <= {None, 0} and plain.plan.placements is None


def test_donate_jit_donated_abstract_argument_aliases_on_the_gpu_target(h100):
  x = _abstract(h100)
  g = donate.jit(lambda a: a * 2.0 + 1.0, donate_argnums=0)
  compiled = g.lower(x).compile()
  assert re.search(r"input_output_alias=\{ \{0?\}: \(0, ", compiled.as_text())
  assert compiled.plan.decisions[0].action == "aliased"
