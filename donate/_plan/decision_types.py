"""The typed vocabulary of a donation plan: what a leaf's buffer becomes (`Action`), what kind of
value the leaf is (`Kind`), how its donation was asked for (`Request`) and why it was decided so
(`Cause`).

Each is a `StrEnum`: a member equals its value (`Action.ALIASED == "aliased"`) and prints as it, so
code written against the plain strings keeps working and the plan's text reads as before. Code
reads these fields; a decision's `reason` and `source` are the same facts in words, for people.
"""

from __future__ import annotations

import enum


class Action(enum.StrEnum):
  """What happens to one input leaf's buffer (`LeafDecision.action`).

  `ALIASED`: an output reuses the buffer. `DONOR`: given to XLA to reuse for any output.
  `KEPT`: not donated (not requested, or not a device buffer). `UNUSED`: requested, but the
  computation does not read it: it stays alive, as in `jax.jit`. `UNUSABLE`: requested, but
  nothing can reuse it: it stays alive. `REF`: a `jax.Ref`: the call writes it back into its own
  buffer.

  >>> import donate
  >>> donate.Action.ALIASED == "aliased", str(donate.Action.DONOR)
  (True, 'donor')
  """

  ALIASED = "aliased"
  DONOR = "donor"
  KEPT = "kept"
  UNUSABLE = "unusable"
  UNUSED = "unused"
  REF = "ref"


class Kind(enum.StrEnum):
  """What kind of value an input leaf is (`LeafDecision.info.kind`).

  `DEVICE`: a `jax.Array` (donating consumes it). `ABSTRACT`: a `jax.ShapeDtypeStruct`, planned
  as if it were an array. `REF`: a `jax.Ref` (or a `ShapeDtypeStruct(..., is_ref=True)`): the
  call writes its new value back into its own buffer, so it is never donated nor paired. `HOST`:
  a numpy array, a Python or numpy scalar: `jax.jit` copies it to the device, so the caller's
  value is never consumed.

  >>> import jax.numpy as jnp, donate
  >>> plan = donate.jit(lambda a, s: a * s, donate_argnums=0).plan(jnp.ones(4), 2.0)
  >>> [d.info.kind for d in plan.decisions] == [donate.Kind.DEVICE, donate.Kind.HOST]
  True
  """

  DEVICE = "device"
  ABSTRACT = "abstract"
  REF = "ref"
  HOST = "host"


class Request(enum.StrEnum):
  """How a leaf's donation was asked for (`LeafDecision.request`; None: it was not).

  `DONATE_ARGNUMS`, `DONATE_ARGNAMES`: `donate.jit`'s keywords. `DONATE_BUFFER`, `ALIAS`: the
  in-function annotations (`donate.donate_buffer`, `donate.alias`, and `g.into(out)`, an alias
  of each preallocated buffer). `INNER_JIT`: `jax.jit(..., donate_argnums=...)` of an inner call
  (adopted with `adopt_inner_donation=True`). `DONATE_JIT`: an inner `donate.jit` call. The
  annotations and inner calls name their source line in `LeafDecision.where`.

  >>> import jax.numpy as jnp, donate
  >>> def f(x):
  ...   return donate.donate_buffer(x) * 2
  >>> d, = donate.jit(f).plan(jnp.ones(4)).decisions
  >>> d.request, d.request == "donate_buffer", d.source == f"donate_buffer at {d.where}"
  (<Request.DONATE_BUFFER: 'donate_buffer'>, True, True)
  """

  DONATE_ARGNUMS = "donate_argnums"
  DONATE_ARGNAMES = "donate_argnames"
  DONATE_BUFFER = "donate_buffer"
  ALIAS = "alias"
  INNER_JIT = "inner_jit"
  DONATE_JIT = "donate_jit"

  @property
  def label(self) -> str:
    """The request in words, as the plan's text names it."""
    return _LABELS.get(self, self.value)


_LABELS = {Request.INNER_JIT: "inner jit donation", Request.DONATE_JIT: "inner donate.jit"}


class Cause(enum.StrEnum):
  """Why a leaf was decided as it was (`LeafDecision.cause`), for code: the `reason` beside it
  says the same in words, with the paths, shapes and shardings involved.

  Kept: `NOT_REQUESTED`, `INNER_JIT_IGNORED` (an inner `jax.jit` donated it, the caller did not),
  `NOT_A_DEVICE_BUFFER` (a host value), `JAX_DEBUG_NANS` (JAX donates nothing while
  `jax_debug_nans` is on). Unused: `UNUSED` (the computation does not read it).

  Aliased, by the dataflow link that paired it: `EXPLICIT_ALIAS`, `RETURNED_UNCHANGED`,
  `UPDATED_IN_PLACE`, `LOOP_CARRY`, `ELEMENTWISE_UPDATE`, `DERIVED_KEY` (a PRNG key made from
  this key by `jax.random.split` / `fold_in`), `SAME_SHAPE_AND_DTYPE` (no link); after
  compiling, `XLA_OTHER_OUTPUT` (XLA put another output in it than planned) and `DONOR_REUSED`
  (a donor XLA reused, or a requested leaf the compiled program aliases all the same).

  Donor: `XLA_PAIRS_AFTER_PARTITIONING` (several devices, output shardings left to XLA),
  `SAME_SIZE` (a free output of as many elements, not of its shape and dtype).

  Unusable: `SHARDING_DIFFERS`, `MEMORY_DIFFERS` (the output of its shape and dtype is in other
  memory: another memory space or memory kind), `OUTPUT_TAKEN` (the output of its type reuses
  another input),
  `NO_OUTPUTS` (the function returns nothing), `NO_MATCHING_OUTPUT` (no output of its shape and
  dtype); after compiling, `ALIAS_NOT_MADE` (XLA did not make a planned alias) and
  `DONOR_NOT_REUSED` (XLA reused a donor for no output).

  Refs: `WRITTEN_BACK`, `REF_UNUSED` (the computation does not use it), `REF_OFFERED_AS_DONOR`
  (in `donate_argnums`, `jax.jit` offers it to XLA as a donor, which XLA rejects) and
  `REF_NOT_DONATED` (in `donate_argnums`: a ref is never donated; unusable).

  >>> import jax.numpy as jnp, donate
  >>> f = donate.jit(lambda w, x: (w - x, x), donate_argnums=(0, 1))
  >>> [str(d.cause) for d in f.plan(jnp.ones(4), jnp.ones(4)).decisions]
  ['elementwise_update', 'returned_unchanged']
  >>> f.plan(jnp.ones(4), jnp.ones(4)).decisions[0].cause == donate.Cause.ELEMENTWISE_UPDATE
  True
  """

  NOT_REQUESTED = enum.auto()
  INNER_JIT_IGNORED = enum.auto()
  NOT_A_DEVICE_BUFFER = enum.auto()
  JAX_DEBUG_NANS = enum.auto()
  UNUSED = enum.auto()
  EXPLICIT_ALIAS = enum.auto()
  RETURNED_UNCHANGED = enum.auto()
  UPDATED_IN_PLACE = enum.auto()
  LOOP_CARRY = enum.auto()
  ELEMENTWISE_UPDATE = enum.auto()
  DERIVED_KEY = enum.auto()
  SAME_SHAPE_AND_DTYPE = enum.auto()
  XLA_OTHER_OUTPUT = enum.auto()
  DONOR_REUSED = enum.auto()
  XLA_PAIRS_AFTER_PARTITIONING = enum.auto()
  SAME_SIZE = enum.auto()
  SHARDING_DIFFERS = enum.auto()
  MEMORY_DIFFERS = enum.auto()
  OUTPUT_TAKEN = enum.auto()
  NO_OUTPUTS = enum.auto()
  NO_MATCHING_OUTPUT = enum.auto()
  ALIAS_NOT_MADE = enum.auto()
  DONOR_NOT_REUSED = enum.auto()
  WRITTEN_BACK = enum.auto()
  REF_UNUSED = enum.auto()
  REF_OFFERED_AS_DONOR = enum.auto()
  REF_NOT_DONATED = enum.auto()
