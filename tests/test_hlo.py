"""Unit tests of the compiled-HLO reader (`donate._xla.hlo`) and the dump readers (`donate._xla.hlo_dump`)
on small hand-written modules, in the spellings of both jaxlib lines."""

import pytest

from donate._xla import hlo as _hlo
from donate._xla import hlo_dump as _hlo_dump

# jaxlib 0.10: asynchronous collectives named after their opcode, collective memory S(1).
ASYNC_S1 = """\
HloModule jit_body, is_scheduled=true, num_partitions=8

%region_0.0 (psum.0: f32[], psum.1: f32[]) -> f32[] {
  %psum.0 = f32[] parameter(0), metadata={op_name="psum"}
  %psum.1 = f32[] parameter(1), metadata={op_name="psum"}
  ROOT %add.0.0 = f32[] add(%psum.0, %psum.1), metadata={op_name="add"}
}

%wrapped_sine_computation (param_0: f32[1024]) -> f32[1024] {
  %param_0 = f32[1024]{0} parameter(0)
  ROOT %sin.3.1 = f32[1024]{0} sine(%param_0), frontend_attributes={donate.group="x",donate.symmetric="symm_mem"}
}

ENTRY %main.0_spmd (param.1: f32[1024]) -> (f32[1024], f32[8192]) {
  %param.1 = f32[1024]{0} parameter(0), sharding={devices=[8]<=[8]}, metadata={op_name="v"}
  %wrapped_sine = f32[1024]{0:S(1)} fusion(%param.1), kind=kLoop, calls=%wrapped_sine_computation, frontend_attributes={donate.group="x",donate.symmetric="symm_mem"}
  %all-gather-start = (f32[1024]{0:S(1)}, f32[8192]{0:S(1)}) all-gather-start(%param.1), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, metadata={op_name="jit(body)/all_gather"}
  %all-gather-done = f32[8192]{0:S(1)} all-gather-done(%all-gather-start)
  %all-reduce-start = f32[1024]{0:S(1)} all-reduce-start(%wrapped_sine), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%region_0.0, metadata={op_name="jit(body)/psum"}, backend_config={"collective_backend_config":{"is_sync":true,"collectives_mode":"COLLECTIVES_MODE_INVALID"}}
  %all-reduce-done = f32[1024]{0:S(1)} all-reduce-done(%all-reduce-start)
  %copy.4 = f32[1024]{0} copy(%all-reduce-done)
  ROOT %tuple.7 = (f32[1024]{0}, f32[8192]{0:S(1)}) tuple(%copy.4, %all-gather-done)
}
"""

# jaxlib 0.12: the same program; a synchronous all-reduce named after the JAX op, S(7), mesh
# replica groups, a nested tuple in the all-gather's start, host memory S(5) on the output.
SYNC_S7 = """\
HloModule jit_body, is_scheduled=true, num_partitions=8

%wrapped_sine_computation (param_0.2: f32[1024]) -> f32[1024] {
  %param_0.2 = f32[1024]{0} parameter(0)
  ROOT %sin.3.1 = f32[1024]{0} sine(%param_0.2), frontend_attributes={donate.group="x",donate.symmetric="symm_mem"}
}

%region_0.0 (psum.0: f32[], psum.1: f32[]) -> f32[] {
  %psum.1 = f32[] parameter(1), metadata={op_name="psum"}
  %psum.0 = f32[] parameter(0), metadata={op_name="psum"}
  ROOT %add.0.0 = f32[] add(%psum.0, %psum.1), metadata={op_name="add"}
}

ENTRY %main.0_spmd (param.1: f32[1024]) -> (f32[1024], f32[8192]) {
  %param.1 = f32[1024]{0} parameter(0), metadata={op_name="v"}
  %wrapped_sine = f32[1024]{0:S(7)} fusion(%param.1), kind=kLoop, calls=%wrapped_sine_computation, frontend_attributes={donate.group="x",donate.symmetric="symm_mem"}
  %all-gather-start = ((f32[1024]{0:S(7)}), f32[8192]{0:S(7)}) all-gather-start(%param.1), channel_id=1, replica_groups=mesh['x'=8] {'x'}, dimensions={0}, metadata={op_name="jit(body)/all_gather"}
  %all-gather-done = f32[8192]{0:S(7)} all-gather-done(%all-gather-start)
  %psum.7.2 = f32[1024]{0:S(7)} all-reduce(%wrapped_sine), channel_id=1, replica_groups=mesh['x'=8] {'x'}, to_apply=%region_0.0, metadata={op_name="jit(body)/psum"}, backend_config={"collective_backend_config":{"is_sync":true,"collectives_mode":"COLLECTIVES_SYMMETRIC_MEMORY"}}
  %copy.4 = f32[1024]{0:S(5)} copy(%psum.7.2)
  ROOT %tuple.7 = (f32[1024]{0:S(5)}, f32[8192]{0:S(7)}) tuple(%copy.4, %all-gather-done)
}
"""

WHILE = """\
HloModule jit_f, input_output_alias={ {0}: (1, {}, may-alias), {1}: (0, {}, must-alias) }

FileNames
1 "/src/f.py"

FunctionNames
1 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=7 end_line=7 column=2 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

%body (state: (s32[], f32[64])) -> (s32[], f32[64]) {
  %state = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %buf = f32[64]{0} get-tuple-element(%state), index=1, metadata={op_name="scan" stack_frame_id=1}
  %one = s32[] constant(1)
  %next = s32[] add(s32[] %i, s32[] %one)
  %upd = f32[64]{0} dynamic-update-slice(%buf, /*index=1*/%buf, %i)
  ROOT %out = (s32[], f32[64]{0}) tuple(%next, %upd)
}

%cond (state.1: (s32[], f32[64])) -> pred[] {
  %state.1 = (s32[], f32[64]{0}) parameter(0)
  %j = s32[] get-tuple-element(%state.1), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (x: f32[64], y: f32[64]) -> (f32[64], f32[64]) {
  %x = f32[64]{0} parameter(0)
  %y = f32[64]{0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[64]{0}) tuple(%zero, %x)
  %loop = (s32[], f32[64]{0}) while(%init), condition=%cond, body=%body, backend_config="{\\"known_trip_count\\":{\\"n\\":\\"8\\"}}", metadata={op_name="while" source_file="/src/f.py" source_line=5}
  %res = f32[64]{0} get-tuple-element(%loop), index=1
  ROOT %t = (f32[64]{0}, f32[64]{0}) tuple(%res, %y)
}
"""


def _collectives(module):
  """(opcode, kind, operand's memory space, mode) of every collective, as `_symm_report` reads."""
  return [(i.opcode, i.collective_kind, module.find(i.operands[0]).leaves[0].memory_space,
           i.collectives_mode) for i in module.instructions() if i.collective_kind]


def test_async_collectives_with_s1():
  m = _hlo.parse_module(ASYNC_S1)
  assert _collectives(m) == [("all-gather-start", "all-gather", 0, ""),
                             ("all-reduce-start", "all-reduce", 1, "COLLECTIVES_MODE_INVALID")]
  done = m.find("all-reduce-done")
  assert done.collective_kind is None and done.operands == ("all-reduce-start",)
  assert m.find("all-reduce-start").calls == ("region_0.0",)
  assert m.find("all-gather-start").memory_spaces == (1, 1)
  assert _hlo.collective_memory_spaces(m) == {1}


def test_sync_collective_with_s7_and_host_memory():
  m = _hlo.parse_module(SYNC_S7)
  assert _collectives(m) == [("all-gather-start", "all-gather", 0, ""),
                             ("all-reduce", "all-reduce", 7, "COLLECTIVES_SYMMETRIC_MEMORY")]
  start = m.find("all-gather-start")
  assert start.shape.elements[0].elements[0].memory_space == 7
  assert [(s.dims, s.memory_space) for s in start.leaves] == [((1024,), 7), ((8192,), 7)]
  assert m.find("copy.4").memory_spaces == (_hlo.HOST_MEMORY_SPACE,)
  assert _hlo.collective_memory_spaces(m) == {7}  # S(5) is host memory, never collective


@pytest.mark.parametrize("text", [ASYNC_S1, SYNC_S7], ids=["jaxlib-0.10", "jaxlib-0.12"])
def test_both_spellings_read_alike(text):
  m = _hlo.parse_module(text)
  reduce = next(i for i in m.instructions() if i.collective_kind == "all-reduce")
  fusion = m.find(reduce.operands[0])
  assert fusion.opcode == "fusion" and fusion.frontend == {"donate.group": "x",
                                                           "donate.symmetric": "symm_mem"}
  root = m.root(fusion.calls[0])
  assert root.name == "sin.3.1" and "donate.symmetric" in root.frontend
  assert m.computation_of(root.operands[0]) == fusion.calls[0] == "wrapped_sine_computation"
  assert m.find(root.operands[0], fusion.calls[0]).parameter_number == 0
  assert reduce.metadata_op == "jit(body)/psum" and m.entry.name == "main.0_spmd"
  assert [c.name for c in m.computations.values() if c.is_entry] == ["main.0_spmd"]


def test_names_without_percent_parse_alike():
  bare = SYNC_S7.replace("%", "")
  m, n = _hlo.parse_module(SYNC_S7), _hlo.parse_module(bare)
  assert list(m.computations) == list(n.computations)
  for a, b in zip(m.instructions(), n.instructions()):
    assert (a.name, a.opcode, a.operands, a.calls, a.shape) == \
        (b.name, b.opcode, b.operands, b.calls, b.shape)


def test_tuple_shapes():
  shape = _hlo.parse_shape("(s32[], (f32[4]{0}, bf16[2,3]{1,0:T(8,128)S(1)}), pred[0])")
  assert shape.nbytes == 4 + 16 + 12 + 0
  assert [(s.dtype, s.dims) for s in shape.leaves] == [("s32", ()), ("f32", (4,)),
                                                       ("bf16", (2, 3)), ("pred", (0,))]
  assert shape.element(1).element(1).layout == "{1,0:T(8,128)S(1)}"
  assert [s.memory_space for s in shape.leaves] == [0, 0, 1, 0]
  assert str(shape) == "(s32[], (f32[4], bf16[2,3]), pred[0])"
  assert _hlo.parse_shape("f32[<=8,4]").dims == (8, 4)


def test_while_loop_body_and_condition():
  m = _hlo.parse_module(WHILE)
  loop = m.entry.get("loop")
  assert loop.called == (("condition", "cond"), ("body", "body"))
  assert [(i.name, a) for i, a in m.callers["body"]] == [("loop", "body")]
  assert [(i.name, a) for i, a in m.callers["cond"]] == [("loop", "condition")]
  assert loop.trip_count() == 8  # backend_config printed as a quoted JSON string
  assert m.entry.get("res").index == 1 and m.computations["body"].get("i").index == 0
  body = m.computations["body"]
  assert body.root.name == "out" and body.parameter(0).name == "state"
  assert body.get("next").operands == ("i", "one")  # typed operands
  assert body.get("upd").operands == ("buf", "buf", "i")  # /*index=1*/ comments
  assert body.get("one").operands == () and body.get("one").inside == "1"
  assert [i.position for i in body.instructions] == list(range(7))
  assert m.users(body)["buf"] == [(body.get("upd"), 0), (body.get("upd"), 1)]
  assert m.computations["cond"].get("lt").attr("direction") == "LT"


def test_metadata_and_source_locations():
  m = _hlo.parse_module(WHILE)
  assert m.source(m.entry.get("loop")) == "/src/f.py:5"  # source_file / source_line
  buf = m.computations["body"].get("buf")
  assert buf.metadata() == {"op_name": "scan", "stack_frame_id": "1"}
  assert m.source(buf) == "/src/f.py:7 (f)"  # stack_frame_id through the tables
  assert m.source(m.entry.get("x")) is None


def test_input_output_alias_header():
  m = _hlo.parse_module(WHILE)
  assert m.name == "jit_f" and m.aliases == {1: (0,), 0: (1,)}
  assert _hlo.parse_module(SYNC_S7).aliases == {}
  header = (  # tuple output indices, a parameter's own index, spacing as printed or not
    "HloModule m, input_output_alias={ {0,1}: (2, {1}, may-alias),{2}: (0, {0, 1}, must-alias), "
    "{}: (3, {}, may-alias) }, entry_computation_layout={(f32[4]{0})->f32[4]{0}}"
  )
  assert _hlo.input_output_aliases(header) == {2: (0, 1), 0: (2,), 3: ()}
  wide = ", ".join(f"{{{k}}}: ({k}, {{}}, may-alias)" for k in range(2000))
  assert _hlo.input_output_aliases(f"HloModule m, input_output_alias={{ {wide} }}") == {
    k: (k,) for k in range(2000)
  }


# jaxlib 0.12's dumped module (`*after_optimizations.txt`; `as_text()` still prints the
# get-tuple-elements): an operand `%state#1` is element 1 of the tuple-shaped `state`.
ELEMENTS_012 = """\
HloModule jit_f, is_scheduled=true

%body (state: (s32[], f32[64])) -> (s32[], f32[64]) {
  %state = (s32[], f32[64]{0}) parameter(0)
  %one = s32[] constant(1)
  %next = s32[] add(%state#0, %one)
  ROOT %out = (s32[], f32[64]{0}) tuple(%next, %state#1)
}

%cond (state.1: (s32[], f32[64])) -> pred[] {
  %state.1 = (s32[], f32[64]{0}) parameter(0)
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%state.1#0, %n), direction=LT
}

ENTRY %main (x: f32[64]) -> (f32[64]) {
  %x = f32[64]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[64]{0}) tuple(%zero, %x)
  %while.1 = (s32[], f32[64]{0}) while(%init), condition=%cond, body=%body
  ROOT %t = (f32[64]{0}) tuple(%while.1#1)
}
"""


def test_tuple_elements_spelled_as_operands():
  m = _hlo.parse_module(ELEMENTS_012)
  assert m.entry.root.operands == ("while.1#1",)
  assert _hlo.tuple_element(m.entry.root.operands[0]) == ("while.1", 1)
  body = m.computations["body"]
  assert [_hlo.tuple_element(o) for o in body.get("next").operands] == [("state", 0),
                                                                      ("one", None)]
  assert _hlo.tuple_element("fusion#x") == ("fusion#x", None)
  assert m.find("while.1").shape.element(1).dims == (64,)


def test_no_entry_is_an_error():
  with pytest.raises(ValueError, match="ENTRY"):
    _hlo.parse_module(WHILE.replace("ENTRY ", ""))


BUFFER_ASSIGNMENT = """\
BufferAssignment:
allocation 0: size 4096, parameter 0, shape |f32[1024]| at ShapeIndex {}:
 value: <8 param.1 @0> (size=4096,offset=0): f32[1024]{0}
allocation 7: size 40960, color 7, page 0, preallocated-temp:
 value: <3 all_gather.3.1 @7> (size=32768,offset=0): f32[8192]{0:S(7)}
 value: <10 psum.7.2 @7> (size=4096,offset=36864): f32[1024]{0:S(7)}
 value: <12 while.1{1} (phi) @7> (size=4096,offset=32768): f32[1024]{0:S(7)}
 reused by buffers of a different color:
  value: <860 wrapped_concatenate @0> (color=0)

Total bytes used: 45056 (44.0KiB)
 value: <99 stray @0> (size=4,offset=0): f32[]
"""


def test_buffer_assignment():
  param, temp = _hlo_dump.parse_buffer_assignment(BUFFER_ASSIGNMENT)
  assert (param.index, param.size, param.color) == (0, 4096, 0)
  assert param.kind == "parameter 0, shape |f32[1024]| at ShapeIndex {}"
  assert (temp.index, temp.size, temp.color) == (7, 40960, 7)
  assert temp.values == (("all_gather.3.1", 32768, 0), ("psum.7.2", 4096, 36864),
                         ("while.1{1}", 4096, 32768))  # a value after the allocations is not


def test_buffer_assignment_refuses_a_value_it_cannot_read():
  with pytest.raises(ValueError, match="cannot read the value line"):
    _hlo_dump.parse_buffer_assignment(BUFFER_ASSIGNMENT.replace("(size=4096,offset=36864)",
                                                                "(size=4096)"))


def test_live_ranges():
  text = ("HloLiveRange (max 11):\n  InstructionSequence:\n    0:param.1\n  BufferLiveRange:\n"
          "    param.1{}:0-11\n    all-gather-start{0}:4-6\n  Live ranges at 9 (peak):\n"
          "    param.1{}: 4096 bytes\n")
  assert _hlo_dump.parse_live_ranges(text) == {"param.1{}": (0, 11), "all-gather-start{0}": (4, 6)}
