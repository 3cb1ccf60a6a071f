"""The copies XLA inserts, read from real compiled programs (`jax.jit(...).lower().compile()`).

Each program is compiled by XLA on this machine; the reported copies are checked against the
compiled program's own temporaries (`memory_analysis()`), and their lines against this file.
"""

import importlib.util
import inspect
import json
import re

import jax
import jax.numpy as jnp
import pytest

from donate._xla import copies as _copies
from donate._xla import hlo as _hlo

N = 2**20  # a 4 MiB float32 carry
XS = jnp.arange(8.0)


def _line(marker: str) -> str:
  """"this_file:N" of the line that carries `# <marker>`."""
  lines = inspect.getsource(inspect.getmodule(_line)).splitlines()
  number = next(k for k, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))
  return f"{__file__}:{number}"


def read_then_update(buf, xs):
  def body(c, x):
    old = c[0]  # READ
    c = c.at[0].set(x)  # UPDATE
    return c, old + c[1]
  return jax.lax.scan(body, buf, xs)  # SCAN


def update_then_read(buf, xs):
  def body(c, x):
    c = c.at[0].set(x)
    return c, c[1]
  return jax.lax.scan(body, buf, xs)


def aliased_read_later(x, i):
  y = jax.lax.dynamic_update_slice(x, jnp.ones(8), (i,))  # ALIAS-UPDATE
  return y, x[::2] + y[::2]  # ALIAS-READ


def fori(buf):
  def body(i, c):
    old = c[i]  # FORI-READ
    c = c.at[i].set(2.0)
    return c.at[i + 1].add(old)
  return jax.lax.fori_loop(0, 10, body, buf)  # FORI


def while_loop(buf, n):
  def body(s):
    i, c = s
    old = c[i]  # WHILE-READ
    c = c.at[i].set(2.0)
    return i + 1, c.at[i + 1].add(old)
  return jax.lax.while_loop(lambda s: s[0] < n, body, (0, buf))[1]  # WHILE


def nested(buf, xs):
  def outer(c, x):
    def inner(c2, y):
      old = c2[0]  # NESTED-READ
      c2 = c2.at[0].set(y)
      return c2, old + c2[1]
    c, ys = jax.lax.scan(inner, c, jnp.arange(3.0) + x)  # INNER
    return c, ys.sum()
  return jax.lax.scan(outer, buf, xs)  # OUTER


def cond_in_loop(buf, xs):
  def body(c, x):
    def then(c):
      old = c[0]  # COND-READ
      c = c.at[0].set(x)
      return c, old + c[1]
    return jax.lax.cond(x > 0, then, lambda c: (c, c[2]), c)  # COND
  return jax.lax.scan(body, buf, xs)  # COND-LOOP


def kv_decode(cache_k, cache_v, q):
  def step(carry, t):
    k, v, q = carry
    prev = v[t - 1]  # KV-READ
    k = jax.lax.dynamic_update_slice(k, jnp.tanh(q)[None], (t, 0))
    v = jax.lax.dynamic_update_slice(v, q[None], (t, 0))  # KV-UPDATE
    q = jnp.tanh(jax.nn.softmax(k @ q) @ v + prev)
    return (k, v, q), q[0]
  return jax.lax.scan(step, (cache_k, cache_v, q), jnp.arange(1, 5))


def _compile(fn, *args, donate=0, threshold=65536):
  compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
  paths = list(inspect.signature(fn).parameters)
  records = _copies.find_copies(compiled.as_text(), in_paths=paths, threshold=threshold,
                                jaxpr=jax.make_jaxpr(fn)(*args))
  return records, compiled


def _where(line: str) -> str:
  return line.split(" (")[0]


def test_carry_read_before_update_is_copied_every_iteration():
  records, compiled = _compile(read_then_update, jnp.zeros(N), XS)
  assert records, "the 4 MiB carry copy was not found"
  for r in records:
    assert (r.nbytes, r.shape, r.dtype, r.count) == (4 * N, (N,), "f32", 8)
    assert r.input_path == "buf" and r.donated and r.carry is not None
    assert r.loop.trip_count == 8 and _where(r.loop.line) == _line("SCAN")
    assert r.loop.kind == "scan" and "carry[0] of scan" in r.value
    assert {_line("READ"), _line("UPDATE")} <= {_where(ln) for ln in r.lines}
    assert "read at" in r.reason and "updated in place" in r.reason and r.fix
  # XLA really holds the copy: the program's temporaries include the 4 MiB buffer.
  assert compiled.memory_analysis().temp_size_in_bytes >= 4 * N


def test_update_then_read_has_no_copy_above_threshold():
  records, compiled = _compile(update_then_read, jnp.zeros(N), XS)
  assert records == ()
  small, _ = _compile(update_then_read, jnp.zeros(N), XS, threshold=0)
  assert small and all(r.nbytes < 65536 for r in small)  # the loop counter's copies are seen
  assert compiled.memory_analysis().temp_size_in_bytes < 65536


def test_aliased_output_whose_input_is_read_later():
  records, compiled = _compile(aliased_read_later, jnp.zeros(N), 3)
  assert "input_output_alias={ {0}: (0," in compiled.as_text()
  assert records
  for r in records:
    assert (r.nbytes, r.count, r.loops, r.input_path, r.donated) == (4 * N, 1, (), "x", True)
    assert r.reason.startswith("x is read at") and "do not donate x" in r.fix
    assert {_line("ALIAS-READ"), _line("ALIAS-UPDATE")} <= {_where(ln) for ln in r.lines}
  assert compiled.memory_analysis().temp_size_in_bytes >= 4 * N


@pytest.mark.parametrize("fn, args, marker, kind, trips", [
    (fori, (jnp.zeros(N),), "FORI", "scan", 10),
    (while_loop, (jnp.zeros(N), 5), "WHILE", "while_loop", None),
])
def test_fori_and_while_loop_copies_name_their_loop(fn, args, marker, kind, trips):
  records, _ = _compile(fn, *args)
  assert records
  for r in records:
    assert len(r.loops) == 1 and _where(r.loop.line) == _line(marker)
    assert (r.loop.kind, r.loop.trip_count, r.nbytes) == (kind, trips, 4 * N)
    assert r.count == (None if trips is None else trips)
    assert _line(f"{marker}-READ") in {_where(ln) for ln in r.lines}


def test_nested_scan_copy_runs_per_inner_iteration():
  records, _ = _compile(nested, jnp.zeros(N), XS)
  assert records
  for r in records:
    assert [_where(loop.line) for loop in r.loops] == [_line("OUTER"), _line("INNER")]
    assert [loop.trip_count for loop in r.loops] == [8, 3] and r.count == 24
    assert r.input_path == "buf" and _line("NESTED-READ") in {_where(ln) for ln in r.lines}


def test_cond_inside_a_loop():
  records, _ = _compile(cond_in_loop, jnp.zeros(N), XS)
  assert records
  assert all(_where(r.loop.line) == _line("COND-LOOP") and r.count == 8 for r in records)
  reasons = " ".join(r.reason for r in records)
  assert _line("COND-READ") in reasons and "cond" in reasons


def test_two_carries_of_one_shape_are_told_apart():
  cache = jnp.zeros((256, 128))
  records, _ = _compile(kv_decode, cache, cache, jnp.ones(128), donate=(0, 1))
  assert records
  for r in records:
    assert r.input_path == "cache_v" and "carry[1] of scan" in r.value and r.count == 4
    assert {_line("KV-READ"), _line("KV-UPDATE")} <= {_where(ln) for ln in r.lines}


def test_older_spellings_parse_alike():
  """Quoted backend_config and source_file/source_line metadata (older XLA) give the same report."""
  text = jax.jit(read_then_update, donate_argnums=0).lower(jnp.zeros(N), XS).compile().as_text()
  module = _hlo.parse_module(text)
  frames = {f"stack_frame_id={k}": v for k, v in module.frames.items()}
  older = re.sub(r"backend_config=(\{.*\})", lambda m: "backend_config=" + json.dumps(m.group(1)),
                 text)
  older = re.sub(r"stack_frame_id=\d+", lambda m: 'source_file="{}" source_line={}'.format(
      *module.locations[frames[m.group(0)]].split(" (")[0].rsplit(":", 1)), older)
  assert "stack_frame_id" not in older and 'backend_config="{' in older
  key = lambda r: (r.instruction, r.nbytes, r.count, r.loop.trip_count, r.input_path,
                   tuple(_where(ln) for ln in r.lines))
  assert [key(r) for r in _copies.find_copies(older, in_paths=["buf", "xs"])] == \
      [key(r) for r in _copies.find_copies(text, in_paths=["buf", "xs"])]


def test_text_and_html_sections():
  records, _ = _compile(read_then_update, jnp.zeros(N), XS)
  text = "\n".join(_copies.format_copies(records))
  assert text.startswith(f"copies XLA added ({len(records)} of at least 64.0 KiB, "
                         f"{len(records) * 32}.0 MiB copied per call):")
  assert "8x per call: each iteration of scan at" in text and _line("READ") in text
  assert "<table>" in _copies.copies_html(records) and _copies.format_copies(()) == []


def test_strict_names_the_copied_donated_buffer():
  records, _ = _compile(read_then_update, jnp.zeros(N), XS)
  problems = _copies.strict_problems(records, "read_then_update")
  assert len(problems) == len(records)
  assert problems[0].startswith("donate: read_then_update: XLA copies a loop carry (4.0 MiB, 8x per")
  assert f" at buf (carry[0] of scan at {_line('SCAN')}" in problems[0]
  assert "Fix: carry" in problems[0]
  assert _copies.strict_problems(_compile(update_then_read, jnp.zeros(N), XS)[0], "g") == []


def _h100_mesh():
  from donate import targets  # noqa: PLC0415
  return targets.gpu_mesh("h100", 1)


def _has_cuda_plugin() -> bool:
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ImportError:
    return False


@pytest.mark.skipif(not _has_cuda_plugin(), reason="jax-cuda12-plugin is not installed")
def test_h100_compile_reports_the_same_copies():
  mesh = _h100_mesh()
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  args = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding) for x in (jnp.zeros(N), XS)]
  gpu = jax.jit(read_then_update, donate_argnums=0).lower(*args).compile()
  assert {d.platform for d in mesh.devices.flat} <= {"gpu", "cuda"}  # an H100 executable
  key = lambda r: (r.nbytes, r.count, r.input_path, r.loop.trip_count,
                   frozenset(_where(ln) for ln in r.lines))
  on_gpu = _copies.find_copies(gpu.as_text(), in_paths=["buf", "xs"],
                               jaxpr=jax.make_jaxpr(read_then_update)(jnp.zeros(N), XS))
  on_cpu, _ = _compile(read_then_update, jnp.zeros(N), XS)
  assert on_gpu and sorted(map(key, on_gpu), key=str) == sorted(map(key, on_cpu), key=str)


# ---- through donate.jit: Compiled.copies(), the plan's section, strict="copies" ---------------

def test_donate_jit_reports_the_copies_in_the_plan_and_compiled():
  import donate
  g = donate.jit(read_then_update, donate_argnums=0)
  compiled = g.lower(jnp.zeros(N), XS).compile()
  records = compiled.copies()
  assert records and all(r.input_path == "buf" and r.count == 8 for r in records)
  assert compiled.plan.copies == records
  text = str(compiled.plan)
  assert "copies XLA added (2 of at least 64.0 KiB" in text
  assert _line("READ") in text and max(map(len, text.splitlines())) <= 100
  assert "copies XLA added" in compiled.plan._repr_html_()
  assert compiled.copies(threshold=10 * N) == ()  # nothing that large
  clean = donate.jit(update_then_read, donate_argnums=0).plan(jnp.zeros(N), XS)
  assert clean.copies == () and "copies XLA added" not in str(clean)


def test_strict_copies_raises_before_anything_is_consumed():
  import donate
  buf = jnp.zeros(N)
  with pytest.raises(donate.DonationError, match=r"XLA copies a loop carry \(4.0 MiB, 8x per "
                     r"call: each iteration of scan at .*\) at buf .*expected no copy"):
    donate.jit(read_then_update, donate_argnums=0, strict="copies")(buf, XS)
  assert not buf.is_deleted()
  out = donate.jit(update_then_read, donate_argnums=0, strict=("unusable", "copies"))(buf, XS)
  assert buf.is_deleted() and out[0].shape == (N,)
  with pytest.raises(donate.DonationError, match="unknown strict mode"):
    donate.jit(update_then_read, strict="always")
