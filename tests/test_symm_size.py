"""donate._symm.size: collective memory from byte counts and pools, and from XLA's buffer
assignment (a hand-written dump in the format XLA writes, and a real CPU compile)."""

import math

import jax
import jax.numpy as jnp
import pytest

from donate._base.errors import DonationError
from donate._symm import size

DUMP = """BufferAssignment:
allocation 0: size 4096, parameter 0, shape |f32[1024]| at ShapeIndex {}:
 value: <0 p @0> (size=4096,offset=0): f32[1024]{0}
allocation 3: size 53248, color 7, page 0, preallocated-temp:
 value: <19 psum.7.2 @7> (size=4096,offset=0): f32[1024]{0:S(7)}
 value: <20 all-gather.1 @7> (size=32768,offset=4096): f32[8192]{0:S(7)}
allocation 4: size 1024, color 7, preallocated-temp:
 value: <21 psum.8 @7> (size=1024,offset=0): f32[256]{0:S(7)}
allocation 5: size 512, color 5:
 value: <22 host @5> (size=512,offset=0): f32[128]{0:S(5)}

Total bytes used: 58880
"""

COMPILED = """HloModule m
ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %s = f32[1024]{0:S(7)} sine(%p)
  ROOT %ar = f32[1024]{0:S(7)} all-reduce(%s), channel_id=1, to_apply=%add
}"""


def dump_dir(tmp_path, text=DUMP, name="module_0001.jit_f.sm_9.0_gpu_after_optimizations"):
  (tmp_path / f"{name}-buffer-assignment.txt").write_text(text)
  return str(tmp_path)


def test_collective_memory_size_rounds_up_to_mb():
  assert size.collective_memory_bytes([192, 64]) == 256
  assert size.collective_memory_bytes([]) == 0
  assert size.collective_memory_mb(0) == 0 and size.collective_memory_mb(1) == 1
  assert size.collective_memory_mb((3 << 20) + 1) == 4
  assert size.collective_memory_env(5 << 20) == {"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "5"}


@pytest.mark.parametrize("item", ["64", True, 1.5, None])
def test_collective_memory_bytes_refuses_what_has_no_size(item):
  with pytest.raises(DonationError, match="cannot size an item"):
    size.collective_memory_bytes([item])


def test_collective_memory_bytes_reads_nbytes():
  class Pool:
    nbytes = 192

  assert size.collective_memory_bytes([Pool(), 64]) == 256


def test_collective_allocation_takes_the_collective_colour(tmp_path):
  memory = size.collective_allocation(dump_dir(tmp_path), COMPILED)
  assert (memory.nbytes, memory.color) == (53248 + 1024, 7)
  assert [a.index for a in memory.allocations] == [3, 4]
  assert memory.value_bytes == 4096 + 32768 + 1024
  assert memory.recommended_mb == 1 and memory.env == {
      "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "1"}
  assert str(memory) == ("XLA collective memory: 54272 B per device in 2 allocation(s) (colour 7);"
                         " XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB=1")


def test_without_the_compiled_text_every_non_default_non_host_colour_counts(tmp_path):
  memory = size.collective_allocation(dump_dir(tmp_path))
  assert (memory.nbytes, memory.color) == (54272, 7)
  (tmp_path / "plain").mkdir()
  plain = size.collective_allocation(dump_dir(tmp_path / "plain", DUMP.replace("color 7", "color 0"),
                                              "other_after_optimizations"))
  assert plain.nbytes == 0 and plain.color == 0 and plain.allocations == ()


def test_no_dump_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="buffer-assignment"):
    size.collective_allocation(str(tmp_path))


def test_xla_collective_memory_of_a_cpu_program_is_empty():
  lowered = jax.jit(lambda x: jnp.sin(x) * 2).lower(jnp.ones(16))
  compiled, memory = size.xla_collective_memory(lowered)
  assert float(compiled(jnp.zeros(16))[0]) == 0.0
  assert (memory.nbytes, memory.color, memory.env) == (
      0, 0, {"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "0"})
  assert sorted(size.xla_dump_options("/d")) == ["xla_dump_hlo_as_text", "xla_dump_to"]


def test_sizing_rows_compare_the_planner_with_xla():
  smaller, equal, larger = (size.SizingRow("a", 8192, 4096, 4096), size.SizingRow("b", 64, 64, 64),
                            size.SizingRow("c", 64, 128, 128))
  assert smaller.ratio == 0.5 and "only the annotated operands" in smaller.note
  assert equal.note == "equal" and larger.note.startswith("ours is larger")
  assert math.isnan(size.SizingRow("d", 0, 64, 64).ratio)
  lines = size.sizing_table([smaller, larger]).splitlines()
  assert len(lines) == 4 and lines[1].startswith("|---") and len({len(l) for l in lines}) == 1
  assert [c.strip() for c in lines[3].split("|")[1:-1]] == ["c", "64", "1", "128", "2.00", "128"]
