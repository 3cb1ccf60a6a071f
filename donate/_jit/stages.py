"""Staged objects of a `donate.jit` function: `Traced` -> `Lowered` -> `Compiled`.

Each wraps the `jax.stages` object that really does the work and answers every member of it
(`args_info`, `out_info`, `in_tree`, `cost_analysis`, `input_shardings`, `runtime_executable`,
...), in terms of the user's own arguments and outputs, plus the donation `plan`. When the
program is `jax.jit`'s lowering of the call (its own pairs, or the plan's set on its module) the
answers are its own; when donate replays a marked program over the flat leaves (results in the
user's order), the inputs' answers are put back into the user's pytrees.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax import tree_util

from donate import _profile
from donate._base import errors as _errors
from donate._jit import binding as _binding
from donate._jit import compiled as _compiled
from donate._jit.program import Program, Signature
from donate._jit.signature import Prepared


def _inputs_flat(tree) -> list:
  """The flat inputs of the replayed computation, whose arguments are `((leaves...), {})`."""
  return list(tree[0]) if isinstance(tree, tuple) and len(tree) == 2 else list(tree)


class _Stage:
  """The members shared by the three stages, answered in the user's pytrees."""

  def __init__(self, prep: Prepared, jax_stage, jax_native: bool = False):
    self._prep, self._jax = prep, jax_stage
    self._jax_native = jax_native  # made by jax.jit's own lowering, whatever the plan's path

  @property
  def _native(self) -> bool:
    return self._prep.native or self._jax_native

  @property
  def in_tree(self):
    """Tree structure of the pair (positional arguments, keyword arguments)."""
    return self._prep.traced.in_tree

  @property
  def out_tree(self):
    return self._prep.traced.out_tree

  @property
  def args_info(self):
    """One `jax.stages.ArgInfo` per argument leaf; `.donated` is true where the program donates."""
    if self._native:
      return self._jax.args_info
    donated = self._prep.donated
    flat = tree_util.tree_leaves(self._prep.traced.args_info)
    return tree_util.tree_unflatten(
      self.in_tree, [jax.stages.ArgInfo(a._aval, i in donated) for i, a in enumerate(flat)]
    )

  @property
  def in_avals(self):
    if self._native or isinstance(self, Traced):
      return self._jax.in_avals
    return tree_util.tree_unflatten(self.in_tree, _inputs_flat(self._jax.in_avals))

  @property
  def donate_argnums(self) -> tuple[int, ...]:
    """Flat indices of the donated argument leaves."""
    return tuple(i for i, a in enumerate(tree_util.tree_leaves(self.args_info)) if a.donated)

  def _user_outputs(self, flat_tree):
    """Outputs of the replayed computation (a flat list, in the user's order) as the user's
    output pytree."""
    flat = list(flat_tree)
    return self._prep.inner.outputs(flat)

  @property
  def out_info(self):
    if self._native:
      return self._jax.out_info
    return self._user_outputs(self._jax.out_info)

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return getattr(self._jax, name)


class Traced(_Stage):
  """The traced computation of a `donate.jit` call (like `jax.stages.Traced`), with its plan.

  >>> import jax.numpy as jnp, donate
  >>> traced = donate.jit(lambda x: x * 2).trace(jnp.ones(4))
  >>> [e.primitive.name for e in traced.jaxpr.eqns], traced.fun_name
  (['mul'], '<lambda>')
  """

  def __init__(self, signature: Signature, call: _binding.Call):
    super().__init__(signature.prepared, signature.prepared.traced)
    self._signature, self._call = signature, call

  @property
  def plan(self):
    """The donation plan, before compiling (`Compiled.plan` has what XLA made of it)."""
    return self._prep.plan

  @property
  def jaxpr(self):
    return self._prep.traced.jaxpr

  @property
  def fun_name(self) -> str:
    return self._prep.traced.fun_name

  def lower(
    self, *, lowering_platforms: tuple[str, ...] | None = None, _private_parameters: Any = None
  ) -> Lowered:
    """Lowers to StableHLO carrying the plan's `tf.aliasing_output` and `jax.buffer_donor`.

    With `lowering_platforms` or JAX's private lowering parameters (as `jax.export` passes),
    `jax.jit`'s own lowering of the function is used, in the user's argument and result order,
    carrying the plan's aliases and donors (`_lower_for_export`).
    """
    kwargs = {
      k: v
      for k, v in (
        ("lowering_platforms", lowering_platforms),
        ("_private_parameters", _private_parameters),
      )
      if v is not None
    }
    sig = self._signature
    if kwargs:  # as `jax.export` lowers: `jax.jit`'s lowering, the plan's aliases and donors set
      prep = sig.prepared
      prep = dataclasses.replace(prep, inner=None, realiased=not prep.jax_own)
      return Lowered(sig, self._call, prep.lower(self._call, kwargs), jax_native=True)
    return Lowered(sig, self._call, sig.lower(self._call))

  def __call__(self, *args, **kwargs):
    return self._prep.traced(*args, **kwargs)

  def __donate_program__(self) -> _profile.Source:
    return self.lower().__donate_program__()


class Lowered(_Stage):
  """The lowered computation of a `donate.jit` call (like `jax.stages.Lowered`), with its plan.

  `as_text()` is the StableHLO module with the plan's `tf.aliasing_output` and `jax.buffer_donor`
  attributes; `compile(compiler_options=...)` gives a `Compiled` that takes the function's own
  arguments and checks the aliases XLA made.

  >>> import jax.numpy as jnp, donate
  >>> lowered = donate.jit(lambda x: x + 1, donate_argnums=0).lower(jnp.ones(4))
  >>> "tf.aliasing_output = 0" in lowered.as_text(), lowered.plan.requested_bytes
  (True, 16)
  """

  def __init__(
    self, signature: Signature, call: _binding.Call, jax_lowered, jax_native: bool = False
  ):
    super().__init__(signature.prepared, jax_lowered, jax_native)
    self._signature, self._call = signature, call

  @property
  def plan(self):
    return self._prep.plan

  def as_text(self, dialect: str | None = None, *, debug_info: bool = False) -> str:
    return self._jax.as_text(dialect, debug_info=debug_info)

  def compiler_ir(self, dialect: str | None = None):
    return self._jax.compiler_ir(dialect)

  def cost_analysis(self):
    return self._jax.cost_analysis()

  def compile(self, compiler_options=None, *, device_assignment=None) -> Compiled:
    """Compiles; the returned `Compiled.plan` has the aliases XLA really made."""
    if self._jax_native:
      compiled = self._jax.compile(compiler_options, device_assignment=device_assignment)
      return Compiled(self._as_program(compiled), self._call, compiler_options, jax_native=True)
    program = self._signature.compile(self._call, compiler_options, device_assignment)
    return Compiled(program, self._call, compiler_options)

  def __donate_program__(self) -> _profile.Source:
    return _compiled.source_of(self._as_program(), call=self._call)

  def _as_program(self, compiled=None) -> Program:
    """This lowering with the plan as planned (`compiled`: its executable, when compiled)."""
    paths = _compiled.parameters(self._prep, self._jax).paths
    return Program(self._prep, self._jax, compiled, self._prep.plan, paths)


class Compiled(_Stage):
  """A compiled `donate.jit` computation (like `jax.stages.Compiled`); call it with the
  function's own arguments.

  >>> import jax.numpy as jnp, donate
  >>> compiled = donate.jit(lambda x: x + 1, donate_argnums=0).lower(jnp.ones(4)).compile()
  >>> x = jnp.ones(4)
  >>> compiled(x).tolist(), x.is_deleted(), compiled.memory_analysis().temp_size_in_bytes
  ([2.0, 2.0, 2.0, 2.0], True, 0)
  """

  def __init__(
    self, program: Program, call: _binding.Call, compiler_options=None, jax_native: bool = False
  ):
    super().__init__(program.prep, program.compiled, jax_native)
    self._program, self._plan = program, program.plan
    self._call, self._compiler_options = call, compiler_options
    self._profiled: Program | None = None  # with its memory profile, made once when first asked

  @property
  def plan(self):
    """The plan with the aliases the compiled program really has and its memory figures; as
    `donate.jit(f).plan(*args)` gives it, with the memory profile when an aliased leaf has at
    least `copy_threshold` bytes (compiled once, the first time `plan` or `memory_profile()` is
    asked, so both give the same words and figures in either order)."""
    return self._with_profile().plan

  def _with_profile(self) -> Program:
    if self._profiled is None:
      self._profiled = self._program.with_profile(self._call, self._compiler_options)
    return self._profiled

  def as_text(self):
    return self._jax.as_text()

  def copies(self, threshold: int | None = None) -> tuple:
    """The copies XLA inserted of at least `threshold` bytes (default: the function's
    `copy_threshold`), one `CopyRecord` each: size, how often it runs (which loop, its trip
    count), the input leaf or loop carry it copies, the lines that force it, why, and a fix.

    >>> import jax, jax.numpy as jnp, donate
    >>> def f(buf, xs):
    ...   def body(c, x):
    ...     old = c[0]              # read before the in-place update: XLA must copy c
    ...     c = c.at[0].set(x)
    ...     return c, old + c[1]
    ...   return jax.lax.scan(body, buf, xs)
    >>> compiled = donate.jit(f, donate_argnums=0).lower(jnp.zeros(2**16), jnp.ones(4)).compile()
    >>> [(r.nbytes, r.count, r.input_path) for r in compiled.copies()][:1]
    [(262144, 4, 'buf')]
    """
    return self._program.copies(self._plan.copy_threshold if threshold is None else threshold)

  def cost_analysis(self):
    return self._jax.cost_analysis()

  def memory_analysis(self):
    return self._jax.memory_analysis()

  def memory_profile(self):
    """Where this program's memory goes, from XLA's buffer assignment (`donate.MemoryProfile`).

    A CPU program carries its buffer assignment (`memory_analysis()`), which is read as it is.
    Other compiles (an H100 program compiled ahead of time) carry none: the lowered program is
    compiled again with XLA's dump of it (a per-compile option; the program is the same), which
    costs one compile, and only when asked. What the donations saved at the peak is measured by
    compiling the program once more without them (`MemoryProfile.donation_saved_bytes`).

    >>> import jax.numpy as jnp, donate
    >>> compiled = donate.jit(lambda x: jnp.exp(x) + 1, donate_argnums=0).lower(
    ...     jnp.ones(1024)).compile()
    >>> p = compiled.memory_profile()
    >>> p.alias_bytes == compiled.memory_analysis().alias_size_in_bytes == 4096
    True
    """
    profiled = self._with_profile().plan.profile
    return (
      profiled if profiled is not None else _profile.profile_of_source(self.__donate_program__())
    )

  def __donate_program__(self) -> _profile.Source:
    return _compiled.source_of(
      self._program, call=self._call, compiler_options=self._compiler_options
    )

  def runtime_executable(self):
    return self._jax.runtime_executable()

  @property
  def input_shardings(self):
    if self._native:
      return self._jax.input_shardings
    return tree_util.tree_unflatten(self.in_tree, _inputs_flat(self._jax.input_shardings))

  @property
  def input_formats(self):
    if self._native:
      return self._jax.input_formats
    return tree_util.tree_unflatten(self.in_tree, _inputs_flat(self._jax.input_formats))

  @property
  def output_shardings(self):
    if self._native:
      return self._jax.output_shardings
    return self._user_outputs(self._jax.output_shardings)

  @property
  def output_formats(self):
    if self._native:
      return self._jax.output_formats
    return self._user_outputs(self._jax.output_formats)

  def __call__(self, *args, **kwargs):
    if self._native:  # jax.jit's own compiled call, with its own argument checks
      if self._plan.requested_bytes:
        self._check_duplicates(self._prep.fn.binding.bind_dynamic(args, kwargs))
      return self._jax(*args, **kwargs)
    call = self._prep.fn.binding.bind_dynamic(args, kwargs)
    if call.treedef != self._prep.call.treedef:
      raise _errors.DonationTypeError(
        _errors.message(
          f"{self._prep.fn.name}: Function compiled with input pytree does not match the input "
          "pytree it was called with",
          expected=str(self._prep.call.treedef),
          got=str(call.treedef),
          fix="call it with arguments of the structure it was lowered "
          "for (static arguments are not passed again), or call the donate.jit function itself",
        )
      )
    self._check_duplicates(call)
    return self._prep.inner.outputs(self._jax(*call.leaves))

  def _check_duplicates(self, call):
    self._prep.check_duplicates(call, self._plan)
