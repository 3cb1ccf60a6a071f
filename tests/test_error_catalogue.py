"""The bad-input catalogue (docs/errors.md) and the library cannot drift apart (issue 7).

The table in docs/errors.md is parsed: every row names an error id, the function that raises it
and the message a user sees (`…` stands for a part that varies: a file, a line, a repr). For every
row this file has a trigger that provokes the error through the public API; the test checks the
message matches the row. Two more tests keep the table complete: every `raise DonationError(...)`
in `donate/` is listed, and every listed site still raises.
"""

import ast
import os
import re
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import donate
from donate import planner, symm, targets
from donate._symm import prim as symm_prim
from donate._symm import size as symm_size
from donate._symm import xla as symm_xla

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "errors.md")
ELLIPSIS = "…"


def parse_catalogue(path=DOC):
  """Rows of the table: {id: (site, message)}; `<br>` in a message is a line break."""
  rows = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") \
          else []
      if len(cells) != 4 or not re.fullmatch(r"`[a-z0-9-]+`", cells[0]):
        continue
      ident, site, _, msg = cells
      assert msg.startswith("`") and msg.endswith("`"), line
      assert ident not in rows, f"duplicate row {ident}"
      rows[ident.strip("`")] = (site.strip("`"), msg[1:-1].replace("<br>", "\n"))
  return rows


def pattern(message: str) -> re.Pattern:
  parts = [re.escape(p) for p in message.split(ELLIPSIS)]
  return re.compile(".*?".join(parts), re.S)


def raise_sites():
  """(file, function) of every `raise ...DonationError(...)` in the package and its subpackages."""
  sites = set()
  pkg = os.path.join(ROOT, "donate")
  paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(pkg) for f in fs if f.endswith(".py"))
  for path in paths:
    name = os.path.relpath(path, pkg).replace(os.sep, "/")  # e.g. _symm/prim.py
    tree = ast.parse(open(path, encoding="utf-8").read())

    def visit(node, func):
      for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
        if isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call):
          callee = child.exc.func
          callee = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
          if callee in ("DonationError", "DonationTypeError", "DonationRuntimeError",
                        "keyword_error"):
            sites.add(f"donate/{name}:{func}")
        visit(child, inner)

    visit(tree, "<module>")
  return sites


# ---- helpers for the triggers -----------------------------------------------------------------

def arr(n=8, dtype=jnp.float32):
  return jax.jit(jnp.copy)(jnp.zeros((n,), dtype))


def h100_arg(n=8):
  """An abstract array on one H100 compiled for ahead of time (needs the gpu-aot extra)."""
  sharding = jax.sharding.NamedSharding(targets.gpu_mesh("h100", 1), jax.P())
  return jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sharding)


def mesh(n=2):
  return jax.make_mesh((n,), ("i",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:n])


def in_shard_map(body, x=None):
  m = mesh()
  x = jnp.ones((2, 4)) if x is None else x
  return jax.jit(jax.shard_map(body, mesh=m, in_specs=jax.P("i"), out_specs=jax.P("i")))(x)


def swapped(a, b):
  return b.at[0].set(1.0), a + 1.0


def marked(a, b):
  """A collective whose input `requires_symmetric` marks: the call replays its marked program."""
  return jax.shard_map(lambda x, y: (y.at[0].set(1.0), lax.psum(x + 1.0, "i")), mesh=mesh(),
                       in_specs=jax.P("i"), out_specs=(jax.P("i"), jax.P()))(a, b)


def compiled_structure_mismatch():
  donate.requires_symmetric(lax.psum)
  try:
    compiled = donate.jit(marked, donate_argnums=(0, 1)).lower(arr(), arr()).compile()
  finally:
    symm.clear_requirements()  # the registry is process-wide
  compiled((arr(), arr()))


def shardings_differ():
  m = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  row = jax.sharding.NamedSharding(m, jax.P("x"))
  rep = jax.sharding.NamedSharding(m, jax.P())
  x = jax.device_put(jnp.arange(64.0), rep)
  donate.jit(lambda a: a + 1, donate_argnums=0, out_shardings=row, strict=True)(x)


def sgd_step(w, x):
  g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
  return w - 0.1 * g


def attention_grad_step(wq, x):
  def loss(wq):
    q = x @ wq
    return jnp.sum(jax.nn.softmax(q @ q.T) @ q)
  return wq - 0.1 * jax.grad(loss)(wq)


def carry_read_after_update(buf, xs):
  def body(c, x):
    old = c[0]
    c = c.at[0].set(x)
    return c, old + c[1]
  return lax.scan(body, buf, xs)


def into_sharding_differs():
  m = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
  row = jax.sharding.NamedSharding(m, jax.P("i"))
  g = donate.jit(lambda x: x * 2, out_shardings=row)
  g.into(jnp.empty(64))(jax.device_put(jnp.ones(64), row))


def read_after_donate(w):
  v = donate.donate_buffer(w)
  return v + w


def returned_after_donate(w):
  v = donate.donate_buffer(w)
  return v * 2, w


def alias_two_outputs(a):
  b = donate.alias(a, a + 1.0)
  return b, b * 1.0


def comm_output_strict():
  def f(x):
    y = symm.with_symmetric(x * 2.0, "i")
    return lax.psum(y, "i"), y

  m = mesh()
  g = jax.shard_map(f, mesh=m, in_specs=jax.P("i"), out_specs=(jax.P(), jax.P("i")))
  planner.plan_memory(g, jnp.ones((2, 4)), strict=True)


def two_pools():
  """Internal check: one value in two pools (the public markers always make distinct values)."""
  buffer = lambda group: types.SimpleNamespace(kind="symm_mem", group=group, var="v",
                                               producer="mul")
  liveness = types.SimpleNamespace(instances={"v": [7]})
  planner._comm_values([buffer(("i",)), buffer(("j",))], liveness)


def context_axis_unbound():
  def fn(x):
    with symm.symmetric_memory("nope"):  # no shard_map binds 'nope'
      return x * 2.0

  symm.mark_required(jax.make_jaxpr(fn)(jnp.ones(3)))


def context_axis_unbound_at_entry():
  def body(x):
    with symm.symmetric_memory("nope"):
      return lax.psum(x * 2.0, "i")

  in_shard_map(body)


def call_without_axis_name():
  wrapped = symm.requires_symmetric(lambda x, group: lax.psum(x, group))
  in_shard_map(lambda x: wrapped(x, "i"))


def placement_missing():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("i",))
  f = jax.shard_map(lambda x: lax.psum(symm.with_symmetric(jnp.sin(x), "i"), "i"), mesh=mesh,
                    in_specs=jax.P("i"), out_specs=jax.P())
  x = jnp.ones((1, 4))
  bufs = symm.comm_buffers(jax.make_jaxpr(f)(x))
  symm.placement_report(jax.jit(f).lower(x).compile().as_text(), bufs).check(strict=True)


def debug_nans_strict():
  with jax.debug_nans(True):
    donate.jit(lambda x: x * 2, donate_argnums=0, strict=True)(arr())


TRIGGERS = {
    # donate.jit arguments
    "argnums-not-int": lambda: donate.jit(lambda a, b: a, donate_argnums="0"),
    "argnums-out-of-range": lambda: donate.jit(lambda a, b: a, donate_argnums=2),
    "argnames-unknown": lambda: donate.jit(lambda a, b: a, donate_argnames="c"),
    "static-and-donated": lambda: donate.jit(lambda a, b: a, donate_argnums=0, static_argnums=0),
    # calls
    "strict-host-leaf": lambda: donate.jit(lambda cfg, x: x * cfg["scale"], donate_argnums=0,
                                           strict=True)({"scale": 2.0}, arr()),
    "strict-debug-nans": lambda: debug_nans_strict(),
    "same-array-twice": lambda: (lambda x: donate.jit(lambda p, q: (p["w"] + 1, q + 1),
                                                      donate_argnums=0)({"w": x}, x))(arr()),
    "strict-unusable": lambda: donate.jit(lambda x, y: (x + 1, y.sum()), donate_argnums=(0, 1),
                                          strict=True)(arr(), arr()),
    "strict-sharding-differs": shardings_differ,
    "strict-unusable-export": lambda: jax.export.export(donate.jit(
        lambda x: x[:1] * 2, donate_argnums=0, strict=True))(
            jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 4"), jnp.float32)),
    "strict-not-made": lambda: donate.jit(lambda x: x.astype(jnp.bfloat16), donate_argnums=0,
                                          strict=True)(arr(4)),
    "compiled-structure": compiled_structure_mismatch,
    "strict-copies": lambda: donate.jit(carry_read_after_update, donate_argnums=0,
                                        strict="copies")(jnp.zeros(2**16), jnp.ones(4)),
    "strict-peak": lambda: donate.jit(sgd_step, donate_argnums=0, strict="copies")(
        jnp.ones((256, 256)), jnp.ones((8, 256))),
    "strict-peak-not-lower": lambda: donate.jit(attention_grad_step, donate_argnums=0,
                                                strict="copies")(
        jnp.full((256, 256), 0.01), jnp.ones((256, 256))),
    "strict-mode-unknown": lambda: donate.jit(lambda x: x, strict="always"),
    # annotations
    "alias-type-mismatch": lambda: donate.jit(lambda a, b: donate.alias(a, b))(arr(), arr(4)),
    "alias-two-inputs": lambda: donate.jit(lambda a, b: donate.alias(a, b))(arr(), arr()),
    "alias-two-outputs": lambda: donate.jit(alias_two_outputs)(arr()),
    "read-after-donation": lambda: donate.jit(read_after_donate)(arr()),
    "returned-after-donation": lambda: donate.jit(returned_after_donate)(arr()),
    # preallocated outputs
    "into-not-array": lambda: donate.jit(lambda a: a + 1).into(np.zeros(8, np.float32)),
    "into-structure": lambda: donate.jit(lambda a: a + 1).into((arr(), arr()))(arr()),
    "into-shape": lambda: donate.jit(lambda a: a + 1).into(arr(4))(arr()),
    "into-sharding": into_sharding_differs,
    # symmetric memory
    "symm-axis-name": lambda: symm.with_symmetric(jnp.ones(3), ""),
    "symm-kind": lambda: symm.with_symmetric(jnp.ones(3), "i", kind=""),
    "symm-axis-unbound": lambda: jax.jit(lambda x: symm.with_symmetric(x, "i"))(jnp.ones(3)),
    "symm-context-axis-unbound": context_axis_unbound_at_entry,
    "symm-context-axis-unbound-at-equation": context_axis_unbound,
    "symm-unknown-source": lambda: symm_prim.mark(1.0, "i", kind="symm_mem", source="bogus"),
    "requires-not-collective": lambda: symm.requires_symmetric(3),
    "requires-builtin-argnums": lambda: symm.requires_symmetric(lax.psum, argnums=1),
    "requires-bad-argnums": lambda: symm.requires_symmetric(lambda x, axis_name: x, argnums=-1),
    "requires-no-axis": call_without_axis_name,
    "collective-memory-item": lambda: symm_size.collective_memory_bytes(["x"]),
    "configure-spec": lambda: symm.configure("Broadcast"),
    "configure-too-late": lambda: (jnp.ones(1), symm.configure("AllReduce")),
    "configure-old-jaxlib": lambda: symm_xla.require_spec_support("0.10.2"),
    "placement-missing": placement_missing,
    # GPU targets
    "gpu-unknown": lambda: targets.gpu_mesh("a100", 8),
    "gpu-count": lambda: targets.gpu_topology("h100", 0),
    "gpu-hosts": lambda: targets.gpu_topology("h100", 12),
    "gpu-mesh-shape": lambda: targets.gpu_mesh("h100", 8, ("dp", "tp")),
    "gpu-plugin-missing": lambda: targets._check_plugin(None),
    "gpu-plugin-unregistered": lambda: targets._raise_unregistered(
        NotImplementedError("topology not implemented for cuda")),
    # the memory planner
    "planner-argnums": lambda: planner.plan_memory(lambda x: x * 2, jnp.ones(4), donate_argnums=3),
    "planner-alignment": lambda: planner.plan_memory(lambda x: x * 2, jnp.ones(4), alignment=0),
    "planner-comm-output": comm_output_strict,
    "planner-two-pools": two_pools,
    "offsets-lengths": lambda: planner.assign_offsets([1, 2], [0], [1]),
    "offsets-negative-size": lambda: planner.assign_offsets([-1], [0], [1]),
    "offsets-empty-range": lambda: planner.assign_offsets([8], [3], [3]),
    "offsets-alignment": lambda: planner.assign_offsets([8], [0], [1], alignment=0),
    "offsets-capacity": lambda: planner.assign_offsets([8], [0], [1], capacity=-1),
    "offsets-time-limit": lambda: planner.assign_offsets([8], [0], [1], time_limit=-1),
    "offsets-not-sequence": lambda: planner.assign_offsets(8, [0], [1]),
    "offsets-not-int": lambda: planner.assign_offsets([1.5], [0], [1]),
    # memory profiles
    "profile-not-jitted": lambda: donate.memory_profile(lambda x: x, 1.0),
    "profile-an-array": lambda: donate.memory_profile(jnp.ones(3)),
    "profile-no-buffer-assignment": lambda: donate.memory_profile(
        jax.jit(jnp.sin).lower(h100_arg()).compile()),
    "profile-unknown-device": lambda: donate.memory_profile(jax.jit(jnp.sin), arr()).fits("a100"),
    "profile-no-program": lambda: donate.memory_profile(
        jax.jit(jnp.sin).lower(arr()).compile()).advice(),
}

ROWS = parse_catalogue()
NEEDS_GPU_AOT = {"profile-no-buffer-assignment"}  # compiles for an H100 (`h100_arg`)


def test_every_row_has_a_trigger_and_every_trigger_a_row():
  assert sorted(ROWS) == sorted(TRIGGERS)


def test_every_raise_site_is_catalogued():
  listed = {site for site, _ in ROWS.values()}
  missing = raise_sites() - listed
  assert not missing, f"raise sites missing from docs/errors.md: {sorted(missing)}"


def test_every_catalogued_site_exists():
  stale = {site for site, _ in ROWS.values()} - raise_sites()
  assert not stale, f"docs/errors.md lists sites that no longer raise: {sorted(stale)}"


@pytest.mark.parametrize("ident", sorted(ROWS))
def test_the_documented_message_is_what_the_user_sees(ident):
  if ident in NEEDS_GPU_AOT and not targets.available():
    pytest.skip("needs the gpu-aot extra")
  _, message = ROWS[ident]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with pytest.raises(donate.DonationError) as info:
      TRIGGERS[ident]()
  text = str(info.value).split("\n--------------------\n")[0]  # JAX's traceback-filter note
  assert pattern(message).fullmatch(text), f"\ndocumented: {message}\nraised:     {text}"
  assert text.startswith("donate: ")


def test_no_message_says_expected_none():
  """A missing half of "expected X, got Y" is left out, never printed as None."""
  assert not [ident for ident, (_, message) in ROWS.items()
              if re.search(r"(expected|got) None[,.]", message)]
