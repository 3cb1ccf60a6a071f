"""`donate.memory_profile(compiled)`: a compiled program alone, from the buffer assignment it
carries (issue 22).

A CPU program's `memory_analysis().serialized_buffer_assignment_proto` holds XLA's buffer
assignment but not its live ranges; the profile recomputes them with XLA's rules. Every range, the
flattened schedule and every allocation's values are checked against XLA's own dump of the same
compile (read here with this file's regular expressions); the profiles themselves against the
dump-based ones in test_memory_profile.py.
"""

import dataclasses
import glob
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
import test_memory_profile as programs
from jax import lax
from jax.experimental import serialize_executable

import donate
from donate import _profile, targets
from donate._profile import api, liverange, naming, proto
from donate._xla import hlo as _hlo

pytestmark = pytest.mark.slow  # pytest -m "not slow" runs the fast tier


def cond_step(x, y):
  return lax.cond(x.sum() > 0, lambda a: jnp.exp(a) * 2, lambda a: jnp.sin(a) + 1, y), x * 2


def nested_scans(stack, x):
  def outer(h, ws):
    return lax.scan(lambda h, w: (jnp.tanh(h @ w), None), h, ws)[0], h.sum()
  return lax.scan(outer, x, stack)


CASES = {
    "mlp": (programs.mlp_step, programs.mlp_args, 0),
    "scan": (programs.scan_step, programs.scan_args, 0),
    "decode": (programs.decode_loop, programs.decode_args, 0),
    "45912": (programs.openxla_45912, lambda: (jnp.ones(programs.MIB),), 0),
    "in_place": (programs.in_place_step, lambda: (jnp.zeros(2**16), jnp.ones(8)), 0),
    "cond": (cond_step, lambda: (jnp.ones(1000), jnp.ones(1000)), 1),
    "nested": (nested_scans, lambda: (jnp.full((3, 4, 64, 64), 0.01), jnp.ones((8, 64))), 1),
}


def _dump_files(folder):
  """XLA's dump of one compile, read with this file's regexes: the flattened schedule, the live
  ranges (`name{index}` -> first, last step) and each allocation's (value, size, offset)s."""
  [ranges] = glob.glob(os.path.join(folder, "*after_optimizations-live-range.txt"))
  text = open(ranges).read()
  head, _, rest = text.partition("BufferLiveRange:")
  sequence = tuple(re.findall(r"^\s+\d+:(\S+)$", head, re.M))
  live = {name: (int(a), int(b)) for name, a, b in
          re.findall(r"^\s+(\S+):(\d+)-(\d+)$", rest.split("Live ranges at")[0], re.M)}
  assignment = open(ranges.replace("live-range", "buffer-assignment")).read()
  blocks = re.split(r"^allocation \d+: ", assignment.split("\nTotal bytes used")[0], flags=re.M)
  values = [tuple((n, int(s), int(o)) for n, s, o in re.findall(
      r"^ value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)", b, re.M))
      for b in blocks[1:]]
  return sequence, live, values


@pytest.mark.parametrize("name", sorted(CASES))
def test_live_ranges_schedule_and_values_are_xla_s(name, tmp_path):
  fn, make, argnums = CASES[name]
  folder = str(tmp_path / "dump")
  compiled = jax.jit(fn, donate_argnums=argnums).lower(*make()).compile(
      compiler_options={"xla_dump_to": folder, "xla_dump_hlo_as_text": True})
  dump = api.dump_of_compiled(compiled)
  sequence, live, values = _dump_files(folder)
  assert dump.sequence == sequence and len(sequence) > 3
  assert dump.ranges == live
  assert [a.values for a in dump.allocations] == values
  assert dump.platform == "cpu"


def test_the_profile_of_a_compiled_alone_needs_no_lowered_program():
  """A donate.jit Compiled reads the buffer assignment it carries (it is not compiled again), a
  deserialized executable too; both equal the profile of a compile with XLA's dump."""
  g = donate.jit(programs.mlp_step, donate_argnums=0)
  compiled = g.lower(*programs.mlp_args()).compile()
  source = compiled.__donate_program__()  # what the profile reads of it: a `_profile.Source`
  expected = _profile.profile_of_source(dataclasses.replace(source, compiled=None))  # XLA's dump
  alone = _profile.profile_of_source(dataclasses.replace(source, lowered=None))  # no compile
  programs._same(alone, expected)
  measured = compiled.memory_profile()  # the plan's: its donation saving measured
  programs._same(measured, expected, text=False)
  assert measured.donation_saved_bytes > 0 and "donation saved" in str(measured)
  assert {e.path for e in expected.at_peak if e.aliased} == {"params['w1']", "params['w2']"}

  plain = jax.jit(programs.scan_step, donate_argnums=0).lower(*programs.scan_args()).compile()
  loaded = serialize_executable.deserialize_and_load(*serialize_executable.serialize(plain))
  programs._same(donate.memory_profile(loaded), donate.memory_profile(plain))
  assert donate.memory_profile(loaded).alias_bytes == plain.memory_analysis().alias_size_in_bytes


@pytest.mark.skipif(not targets.available(), reason="needs the gpu-aot extra")
def test_an_h100_compiled_alone_is_refused_with_what_is_missing():
  mesh = targets.gpu_mesh("h100", 8)
  args = programs._abstract(programs.mlp_args(), mesh)
  compiled = jax.jit(programs.mlp_step, donate_argnums=0).lower(*args).compile()
  assert compiled.memory_analysis().serialized_buffer_assignment_proto == b""
  with pytest.raises(donate.DonationError, match=r"serialized_buffer_assignment_proto is empty"
                     r".*Fix: pass the jax.jit or donate.jit function with its arguments"):
    donate.memory_profile(compiled)
  assert compiled.memory_analysis().temp_size_in_bytes > 0  # the Compiled is untouched
  # A donate.jit Compiled keeps its Lowered: compiled again with XLA's dump.
  ours = donate.jit(programs.mlp_step, donate_argnums=0).lower(*args).compile()
  profile = ours.memory_profile()
  assert profile.platform == "gpu" and profile.temp_bytes == compiled.memory_analysis(
      ).temp_size_in_bytes


def test_values_named_through_xla_0_12_tuple_element_operands():
  """XLA:GPU 0.12's dumped module (read where `as_text()` lacks kernels) spells element k of a
  tuple-shaped value as an operand `while.1#k`: the buffer assignment names that value
  `while.1{k}`."""
  from test_hlo import ELEMENTS_012
  module = _hlo.parse_module(ELEMENTS_012)
  assert naming.output_instructions(module) == ["while.1#1"]
  assert {"while.1#1", "while.1{1}"} <= naming.value_names(module, "while.1#1")
  assert "state{1}" in naming.value_names(module, "state#1")


def test_asynchronous_instructions_are_refused_not_guessed():
  """XLA widens live ranges around asynchronous instructions by rules the reader does not
  recompute (CPU programs have none): such a module is refused, not read approximately."""
  start = proto.Instruction(1, "copy-start", "copy-start", (None, None, None), 0, 0, (), (), 7)
  module = proto.Module("m", 7, {1: start}, {7: 1}, {7: (1,)}, frozenset())
  with pytest.raises(liverange.Unsupported, match="copy-start"):
    liverange.dump_of(proto.BufferAssignment({}, (), ()), module)


_HOISTED = """
import json
import jax, jax.numpy as jnp
import donate
table = jnp.arange(4096.0 * 64).reshape(4096, 64)  # 1 MiB, closed over
def step(params, x):
  g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p + table[: x.shape[0]]) ** 2))(params)
  return params - 0.01 * g, table + 1.0  # the table's new value: its shape, from it
params, x = jnp.ones((256, 64)), jnp.ones((1024, 256))
found = {}
for name, jit in (("jax.jit", jax.jit), ("donate.jit", donate.jit)):
  p = donate.memory_profile(jit(step), params, x)
  found[name] = {
    "arguments": sorted([e.path, e.category] for e in p.at_peak if e.kind == "argument"),
    "suggested": [s.path for s in p.could_donate],
  }
print(json.dumps(found))
"""


@pytest.mark.parametrize("hoisted", [False, True], ids=["constants-in-jaxpr", "constants-hoisted"])
def test_a_closed_over_constant_is_a_constant_never_an_input_to_donate(hoisted):
  """With `jax_use_simplified_jaxpr_constants` (the default from jax 0.12.1, read when JAX is
  imported: a fresh process) a closed-over array is a leading parameter of the program; the
  profile names it a constant, as XLA's literal is without it, and never suggests donating it."""
  env = {**os.environ, "JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS": str(int(hoisted))}
  run = subprocess.run([sys.executable, "-c", _HOISTED], env=env, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  found = json.loads(run.stdout.splitlines()[-1])
  for name in ("jax.jit", "donate.jit"):
    arguments = dict(map(tuple, found[name]["arguments"]))
    assert arguments["params"] == "parameters" and arguments["x"] == "inputs", (name, arguments)
    assert found[name]["suggested"] == ["params"], (name, found[name]["suggested"])
    if hoisted:
      assert arguments["<constant>"] == "constants", (name, arguments)
    else:
      assert "<constant>" not in arguments
