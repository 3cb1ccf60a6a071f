"""Pairing that is never worse than `jax.jit`'s first come, first served: an input hosts an
output only when nothing that depends on the output still reads it, and sharding annotations do
not hide an in-place update. Each case compiles both and compares the temporaries XLA needs."""

import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import donate
from donate._base.text import format_bytes

N = 1 << 18  # 1 MiB of float32


def tie(p, m):
  """out[0] reads both inputs; p is read again by out[1], which depends on out[0]."""
  m = 0.9 * m + (jnp.cos(p) + 1e-4 * p)
  return m, p - 0.1 * m


def mesh(n, kind=AxisType.Auto):
  return jax.make_mesh((n,), ("x",), axis_types=(kind,), devices=jax.devices()[:n])


def swapped_wsc(sharding):
  def f(a, b):
    c = jax.lax.with_sharding_constraint(b.at[0].set(1.0), sharding)
    return c, jax.lax.with_sharding_constraint(a + 1.0, sharding)
  return f


def swapped_reshard(sharding):
  def f(a, b):
    c = jax.sharding.reshard(b.at[0].set(1.0, out_sharding=sharding), sharding)
    return c, jax.sharding.reshard(a + 1.0, sharding)
  return f


def swapped_explicit(sharding):
  def f(a, b):
    return b.at[0].set(1.0, out_sharding=sharding), a + 1.0
  return f


def temps(jit, fun, args):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    compiled = jit(fun, donate_argnums=(0, 1)).lower(*args).compile()
  return compiled.memory_analysis().temp_size_in_bytes, compiled


def args_on(sharding):
  return (jax.device_put(jnp.linspace(0.0, 1.0, N), sharding),
          jax.device_put(jnp.linspace(1.0, 2.0, N), sharding))


@pytest.mark.parametrize("n", [1, 8])
def test_a_tie_goes_to_the_input_that_dies_into_the_output(n):
  sharding = NamedSharding(mesh(n), P("x"))
  args = args_on(sharding)
  ours, compiled = temps(donate.jit, tie, args)
  theirs, _ = temps(jax.jit, tie, args)
  assert compiled.plan.aliases == {"out[0]": "m", "out[1]": "p"}
  assert theirs >= N * 4 // n  # first come, first served copies p
  assert ours < 1024
  got = donate.jit(tie, donate_argnums=(0, 1))(*args_on(sharding))
  want = jax.jit(tie)(*args_on(sharding))
  for x, y in zip(got, want):
    assert jnp.array_equal(x, y)


CASES = {
    "with_sharding_constraint": (swapped_wsc, AxisType.Auto),
    "reshard": (swapped_reshard, AxisType.Explicit),
    "explicit out_sharding": (swapped_explicit, AxisType.Explicit),
}


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("case", CASES)
def test_sharding_annotations_keep_the_in_place_update(case, n):
  make, kind = CASES[case]
  m = mesh(n, kind)
  sharding = NamedSharding(m, P("x"))
  fun = make(sharding)
  with jax.set_mesh(m) if kind == AxisType.Explicit else _nothing():
    args = args_on(sharding)
    ours, compiled = temps(donate.jit, fun, args)
    theirs, _ = temps(jax.jit, fun, args)
    assert compiled.plan.aliases == {"out[0]": "b", "out[1]": "a"}, compiled.plan
    assert ours <= theirs and ours < 1024
    assert theirs >= N * 4 // n
    a, b = args_on(sharding)
    x, y = donate.jit(fun, donate_argnums=(0, 1))(a, b)
    want = jax.jit(fun)(*args_on(sharding))
  assert a.is_deleted() and b.is_deleted()
  assert jnp.array_equal(x, want[0]) and jnp.array_equal(y, want[1])


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def test_where_xla_copies_a_re_paired_buffer_the_lower_peak_of_both_programs_is_kept():
  def f(a, b):
    out0 = a * 2.0  # elementwise from a, but a is read again by out1, which needs out0
    return out0, b + a * out0

  args = args_on(jax.devices()[0])
  ours, compiled = temps(donate.jit, f, args)
  theirs, _ = temps(jax.jit, f, args)
  assert ours <= theirs
  notes = [n for n in compiled.plan.notes if "in the re-paired program: peak" in n]
  assert len(notes) == 1 and "jax.jit's own is kept" in notes[0]
  assert compiled.plan.aliases == {"out[0]": "a", "out[1]": "b"}  # first come, first served
  got = donate.jit(f, donate_argnums=(0, 1))(*args_on(jax.devices()[0]))
  want = jax.jit(f)(*args_on(jax.devices()[0]))
  assert all(jnp.array_equal(x, y) for x, y in zip(got, want))


def peak_of(compiled):
  m = compiled.memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)


def test_an_input_returned_unchanged_in_place_is_checked_against_first_come():
  """First come, first served gives `a` to out[0] (and copies `a` into out[2]); donate keeps
  `a` in place as out[2]. XLA lays the rest out otherwise, here in more memory: both programs
  are compiled and the lower peak kept."""

  def f(a, b):
    ones = a * 0.0 + 1.0
    triple = ones + ones * 2.0
    shifted = ones + jnp.sum(ones.at[0].set(7.0))
    return jnp.flip(shifted), triple, a, triple

  args = (jnp.linspace(0.0, 1.0, 1 << 14), jnp.linspace(1.0, 2.0, 1 << 14))
  _, ours = temps(donate.jit, f, args)
  _, theirs = temps(jax.jit, f, args)
  assert peak_of(ours) <= peak_of(theirs)
  said = ("a returned unchanged as out[2] (first come, first served: out[0]) in the re-paired "
          "program: peak ")
  (note,) = [n for n in ours.plan.notes if said in n]
  kept_ours = note.endswith("; the re-paired program is kept")
  assert kept_ours or "; jax.jit's own is kept" in note
  assert ours.plan.aliases.get("out[2]" if kept_ours else "out[0]") == "a"
  a, b = (jnp.linspace(0.0, 1.0, 1 << 14), jnp.linspace(1.0, 2.0, 1 << 14))
  got = donate.jit(f, donate_argnums=(0, 1))(a, b)
  want = jax.jit(f)(*args)
  assert a.is_deleted() and not b.is_deleted()  # b is unused: kept, as jax.jit keeps it
  assert all(jnp.array_equal(x, y) for x, y in zip(got, want))


_BACKEND_COMPILES = [0]  # XLA compiles so far (JAX's backend-compile events)


def _heard(event, duration, **kwargs):
  if event == "/jax/core/compile/backend_compile_duration":
    _BACKEND_COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_heard)


def compiles_of(thunk):
  """`(thunk(), how many programs XLA compiled for it)`."""
  before = _BACKEND_COMPILES[0]
  result = thunk()
  return result, _BACKEND_COMPILES[0] - before


def leapfrog(u, u_prev):
  return 2.0 * u - u_prev + 0.01 * jnp.roll(u, 1), u


def leapfrog_stencil(u, u_prev):  # a temporary (4 bytes for its energy factor on jax 0.10)
  lap = jnp.roll(u, 1) + jnp.roll(u, -1) - 2.0 * u
  return 2.0 * u - u_prev + 0.01 * lap * jnp.sum(u * u_prev), u * 1.0


@pytest.mark.parametrize("step", [leapfrog, leapfrog_stencil])
def test_a_re_paired_program_at_the_least_peak_is_compiled_once(step):
  """(u, u_prev) -> (u_next, u): the re-paired program (u stays as out[1], u_prev takes u_next)
  reuses both buffers. With no temporaries no pairing can have a lower peak: it is compiled
  once, with no check against first come, first served (which copies u). With a temporary,
  even of 4 bytes, `jax.jit`'s own is compiled too, and the lower peak kept."""
  args = args_on(jax.devices()[0])
  _, theirs = temps(jax.jit, step, args)
  (_, ours), count = compiles_of(lambda: temps(donate.jit, step, args))
  least = ours.memory_analysis().temp_size_in_bytes == 0
  assert least == (step is leapfrog)
  assert count == (1 if least else 2)
  assert peak_of(ours) < peak_of(theirs)
  assert ours.plan.aliases == {"out[0]": "u_prev", "out[1]": "u"}
  notes = [n for n in ours.plan.notes if "re-paired program" in n]
  temp = format_bytes(ours.memory_analysis().temp_size_in_bytes)
  assert notes == ([] if least else [
    f"the re-paired program needs {temp} of temporaries: peak {format_bytes(peak_of(ours))}, "
    f"first come, first served {format_bytes(peak_of(theirs))}; the re-paired program is kept"])
  fresh = lambda u, u_prev: step(u, u_prev)  # noqa: E731: a new function, none of its caches
  fresh_args = args_on(jax.devices()[0])
  (x, y), count = compiles_of(lambda: donate.jit(fresh, donate_argnums=(0, 1))(*fresh_args))
  assert count == (1 if least else 2)  # the first call compiles as often
  want = jax.jit(step)(*args_on(jax.devices()[0]))
  assert jnp.array_equal(x, want[0]) and jnp.array_equal(y, want[1])


def cumsum_first(a, b):  # the cumulative sum needs a temporary; the re-paired peak is lower
  return jnp.cumsum(b) + 1.0, a * 2.0


def cumsum_shared(a, b):  # both programs peak alike: the re-paired one (no copy) is kept
  c = jnp.cumsum(a)
  return b + c[::-1], a * 2.0 + c


@pytest.mark.parametrize("step", [cumsum_first, cumsum_shared])
def test_a_re_paired_program_with_temporaries_is_checked_against_first_come(step):
  """Pairs b -> out[0] and a -> out[1] (first come, first served: a -> out[0]); the re-paired
  program needs a temporary of 1 MiB, so `jax.jit`'s own is compiled too (two compiles) and the
  lower peak kept, the re-paired one on a tie; the plan says so."""
  args = args_on(jax.devices()[0])
  _, theirs = temps(jax.jit, step, args)
  (_, ours), count = compiles_of(lambda: temps(donate.jit, step, args))
  assert count == 2
  assert peak_of(ours) <= peak_of(theirs)
  assert ours.plan.aliases == {"out[0]": "b", "out[1]": "a"}
  (note,) = [n for n in ours.plan.notes if "re-paired program" in n]
  assert note.startswith("the re-paired program needs 1.1 MiB of temporaries: peak ")
  assert note.endswith("; the re-paired program is kept")
  a, b = args_on(jax.devices()[0])
  got = donate.jit(step, donate_argnums=(0, 1))(a, b)
  want = jax.jit(step)(*args_on(jax.devices()[0]))
  assert a.is_deleted() and b.is_deleted()
  assert all(jnp.array_equal(x, y) for x, y in zip(got, want))


def test_a_re_paired_program_xla_rejects_runs_as_jax_jits_own():
  """Over 8 devices `a * 0 + 1` is an elementwise update of the sharded `a`, but XLA folds it to
  a constant and replicates it, so an alias of `a`'s shards to it is rejected when compiling: the
  signature runs `jax.jit`'s own program, and the plan says why."""
  sharding = NamedSharding(mesh(8), P("x"))

  def f(a):
    return jnp.flip(a), a * 0 + 1

  def make():
    return jax.device_put(jnp.arange(128 * 128, dtype=jnp.int32).reshape(128, 128), sharding)

  compiled = donate.jit(f, donate_argnums=0).lower(make()).compile()
  theirs = jax.jit(f, donate_argnums=0).lower(make()).compile()
  (note,) = [n for n in compiled.plan.notes if "XLA rejects the re-paired program" in n]
  assert note.endswith("jax.jit's own is kept; outputs reuse donated buffers first come, first "
                       "served")
  assert compiled.plan.aliases == {"out[0]": "a"}
  assert peak_of(compiled) == peak_of(theirs)
  a = make()
  got = donate.jit(f, donate_argnums=0)(a)
  want = jax.jit(f)(make())
  assert a.is_deleted()
  for x, y in zip(got, want, strict=True):
    assert jnp.array_equal(x, y) and x.sharding == y.sharding


def test_where_jax_jits_own_program_does_not_compile_the_re_paired_one_runs():
  """An uncommitted state array beside sharded parameters, every output replicated: `jax.jit`
  aliases the state's buffer (sharded by XLA's propagation) to a replicated output of its global
  shape, and XLA rejects its own program (an internal error, on jax 0.10 and 0.12). The peak
  check of the re-paired program (which needs temporaries) compiles that program too: its
  failure is said in the plan, and the re-paired program runs, with `jax.jit`'s results."""
  over = mesh(8)
  params, replicated = NamedSharding(over, P("x")), NamedSharding(over, P())

  def step(w, m):
    m = 0.9 * m + w
    return jnp.sum(m), w - 0.1 * m, m

  def make():
    return jax.device_put(jnp.ones(2**14), params), jnp.zeros(2**14)  # m uncommitted

  with pytest.raises(jax.errors.JaxRuntimeError, match="aliased input"):
    jax.jit(step, donate_argnums=1, out_shardings=replicated)(*make())
  f = donate.jit(step, donate_argnums=1, out_shardings=replicated)
  w, m = make()
  got = f(w, m)
  want = jax.jit(step, out_shardings=replicated)(*make())
  for x, y in zip(got, want, strict=True):
    assert jnp.array_equal(x, y) and x.sharding == y.sharding
  assert not w.is_deleted()
  (note,) = [n for n in f.plan(*make()).notes if "jax.jit's own does not compile" in n]
  assert note.endswith("; the re-paired program is kept") and "aliased input" in note
