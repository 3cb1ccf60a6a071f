"""`memory_profile(jitted, *args, **kwargs)`: read XLA's buffer assignment of a compiled program
and name every buffer in the user's terms.

Two sources give the same `reading.Dump`:

- a compiled program that carries its buffer assignment (`memory_analysis()
  .serialized_buffer_assignment_proto`, filled for CPU programs) is read as it is, no compile
  (`liverange`: the live ranges are recomputed with XLA's rules);
- otherwise XLA writes its buffer assignment and live ranges when asked to (`xla_dump_to`, a
  per-compile option, so nothing else in the process changes): the lowered program is compiled
  once with that option into a temporary folder, which is read and removed. The compiled program
  is the same one (the dump options change what XLA writes, not what it compiles). A
  `jax.stages.Compiled` without a buffer assignment (an H100 program compiled ahead of time) has
  no lowered program to compile again: it is refused with a catalogued error.

Where the traced program is at hand, `measured` gives the profile a `Saving` that compiles it
once more without its donations (`baseline`) the first time it is asked: what the donations
saved.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import shutil
import tempfile
from typing import Any

import jax
from jax import tree_util

from donate._base import compat as _compat
from donate._profile import baseline as _baseline
from donate._profile import errors, liverange, naming, proto, reading
from donate._profile import variants as _variants
from donate._profile.assemble import assemble
from donate._profile.profile import MemoryProfile, Saving
from donate._profile.source import DonateProgram, Source
from donate._xla import hlo as _hlo
from donate._xla import hlo_dump as _hlo_dump


def memory_profile(jitted, *args, **kwargs) -> MemoryProfile:
  """Where the memory of a compiled step goes, per device, from XLA's own buffer assignment.

  Args:
    jitted: a `jax.jit` or `donate.jit` function (then `args`/`kwargs` are its call arguments,
      arrays or `jax.ShapeDtypeStruct`s, as for `.lower`), a `Lowered` of one, a `donate.jit`
      `Compiled`, or a `jax.stages.Compiled` that carries its buffer assignment (CPU programs).
    *args, **kwargs: the call arguments.

  Returns:
    A `donate.MemoryProfile`. Where it has the traced program (a function with its arguments, a
    `donate.jit` stage), what the donations saved at the peak is measured: the same program is
    compiled once more without them the first time `donation_saved_bytes` (or a view) is asked;
    a `jax.stages.Compiled` or
    `Lowered` alone says why not (`saving_not_measured`).

  Raises:
    DonationError: `jitted` cannot be lowered (an array, a plain function), or is a
      `jax.stages.Compiled` without a buffer assignment (an H100 program compiled ahead of time:
      pass the function and its arguments, or its `Lowered`). A function that does not trace or
      compile raises JAX's error.

  >>> import jax, jax.numpy as jnp, donate
  >>> def f(x):
  ...   y = jnp.exp(x)          # a 4 MiB temporary beside the donated buffer
  ...   return y + y.sum()
  >>> p = donate.memory_profile(jax.jit(f, donate_argnums=0), jnp.ones(2**20))
  >>> p.temp_bytes >= 2**22, p.alias_bytes
  (True, 4194304)
  >>> [e.kind for e in p.at_peak][:2]
  ['argument', 'temporary']
  >>> compiled = jax.jit(f, donate_argnums=0).lower(jnp.ones(2**20)).compile()
  >>> donate.memory_profile(compiled).peak_bytes == p.peak_bytes  # read, not compiled again
  True
  >>> p.donation_saved_bytes  # compiled without the donation it peaks as high: exp's temporary
  0
  >>> print(donate.memory_profile(compiled).saving_not_measured)
  a jax.stages.Compiled keeps no traced program to compile again without its donations (profile \
the function with its arguments)
  """
  if isinstance(jitted, jax.Array | jax.ShapeDtypeStruct):  # its `trace` is the matrix trace
    errors.an_array(jitted)
  if isinstance(jitted, DonateProgram):  # a donate.jit stage names its own program
    return profile_of_source(jitted.__donate_program__())
  if isinstance(jitted, jax.stages.Compiled):
    return profile_of_compiled(jitted, baseline=_baseline.Baseline(why=_baseline.COMPILED_ALONE))
  if isinstance(jitted, jax.stages.Lowered):
    lowered, baseline = jitted, _baseline.Baseline(why=_baseline.LOWERED_ALONE)
  elif callable(getattr(jitted, "trace", None)):
    traced = jitted.trace(*args, **kwargs)
    if isinstance(traced, DonateProgram):
      profile = profile_of_source(traced.__donate_program__())
      assert isinstance(profile.program, _variants.Program)
      program = _retraceable(profile.program, jitted, args, kwargs)
      return dataclasses.replace(profile, program=program)
    lowered, baseline = traced.lower(), _baseline.of_traced(traced)
    if isinstance(traced, jax.stages.Traced):
      profile = profile_of_lowered(lowered, signature=_signature(jitted), baseline=baseline)
      program = _program(lowered, profile.platform, traced)
      program = _retraceable(program, jitted, args, kwargs)
      return dataclasses.replace(profile, program=program)
  elif callable(getattr(jitted, "lower", None)):
    lowered, baseline = jitted.lower(*args, **kwargs), _baseline.Baseline(why=_baseline.NO_TRACE)
  else:
    errors.not_a_jitted_function(jitted)
  profile = profile_of_lowered(lowered, signature=_signature(jitted), baseline=baseline)
  return dataclasses.replace(profile, program=_program(lowered, profile.platform))


def _program(
  lowered, platform: str, traced=None, options=None, lower_donating=None, donated=()
) -> _variants.Program:
  """How `advice()` and the plan compile the profiled program again (`variants.Program`): with
  more donations (from `traced`, else `lower_donating`, a `donate.jit` program's), with its own
  compiler `options` (XLA's dump options left out) and the candidate's."""

  def read(lowered_again, options_again: dict) -> tuple[int, int, Any]:
    return _read(lowered_again, options_again, platform)

  if traced is not None:
    args = [tree_util.tree_leaves(a) for a in traced.args_info[0]]
    donated = tuple(n for n, a in enumerate(args) if a and all(x.donated for x in a))
  made = _variants.Made(traced, lowered, lower_donating)
  return _variants.Program(made, read, options, donated)


def _retraceable(program: _variants.Program, jitted, args, kwargs) -> _variants.Program:
  """`program` able to trace `jitted` again on other arguments or with checkpoint policies."""

  def retrace(args_again: tuple, kwargs_again: dict) -> _variants.Made:
    traced = jitted.trace(*args_again, **kwargs_again)
    if isinstance(traced, DonateProgram):
      src = traced.__donate_program__()
      return _variants.Made(src.traced, src.lowered, src.lower_donating)
    return _variants.Made(traced, traced.lower())

  made, read = program.made, program.read
  return _variants.Program(
    made, read, program.options, program.donated_argnums, retrace, tuple(args), dict(kwargs)
  )


def _signature(fn):
  try:
    return inspect.signature(fn)
  except (TypeError, ValueError):
    return None


def signature_of(function) -> inspect.Signature | None:
  """The signature of a `donate.jit` function's user function (for `donate_argnums` advice)."""
  return _signature(getattr(function, "fun", function))


def dump_of_compiled(compiled) -> reading.Dump | None:
  """The buffer assignment `compiled` carries, with XLA's live ranges and schedule, as the dump
  files give them (`liverange`); None when it carries none (an empty proto).

  Raises:
    liverange.Unsupported: the program has asynchronous instructions.
  """
  stats = compiled.memory_analysis()
  data = getattr(stats, "serialized_buffer_assignment_proto", b"") if stats is not None else b""
  if not data:
    return None
  executable = compiled.runtime_executable()
  hlo = executable.hlo_modules()[0].as_serialized_hlo_module_proto()
  return liverange.dump_of(
    proto.buffer_assignment(data), proto.module(hlo), executable.client.platform
  )


def profile_of_compiled(
  compiled, signature=None, lowered=None, compiler_options=None, baseline=None
):
  """The profile of `compiled` from the buffer assignment it carries; without one, `lowered`
  (its lowered program) compiled again with XLA's dump, else `errors.no_buffer_assignment`.
  `baseline` (`baseline.Baseline`) measures what the donations saved (`measured`)."""
  missing = (
    "this one carries none: its memory_analysis().serialized_buffer_assignment_proto is "
    "empty (jaxlib fills it for CPU programs, not for GPU programs compiled ahead of "
    "time), and a jax.stages.Compiled keeps no lowered program to compile again with "
    "XLA's dump"
  )
  try:
    dump = dump_of_compiled(compiled)
  except liverange.Unsupported as e:
    dump, missing = (
      None,
      (
        f"this one has no live ranges and asynchronous instructions ({e}), "
        "whose live ranges cannot be recomputed from the program alone"
      ),
    )
  if dump is None and lowered is not None:
    profile = profile_of_lowered(lowered, compiler_options, signature, baseline)
  elif dump is None:
    errors.no_buffer_assignment(compiled, missing)
  else:
    module = _hlo.parse_module(compiled.as_text())
    profile = measured(_profile(compiled, dump, module, signature), baseline, compiler_options)
  if lowered is None:
    return profile
  return dataclasses.replace(
    profile, program=_program(lowered, profile.platform, options=compiler_options)
  )


def profile_of_lowered(lowered, compiler_options=None, signature=None, baseline=None):
  """Compiles `lowered` with a buffer-assignment dump and profiles the result (`baseline`: as
  for `profile_of_compiled`).

  With `xla_dump_to` among `compiler_options` the dump is written there and kept.
  """
  compiled, dump, module = _compile_with_dump(lowered, compiler_options)
  return measured(_profile(compiled, dump, module, signature), baseline, compiler_options)


def profile_of_source(src: Source) -> MemoryProfile:
  """The profile of a `donate.jit` program (`Source`): its compiled program read as it is where
  it carries its buffer assignment, else its lowering compiled again with XLA's dump; parameters
  and outputs named by its plan; what its donations saved measured by lowering it again without
  them, when that is at hand."""
  options = src.compiler_options
  compiled, dump, module = _assignment(src.compiled, src.lowered, options)
  names = _donate_names(src.plan, src.in_paths)
  profile = _profile(compiled, dump, module, src.signature, src.name, names)
  baseline = _baseline.Baseline(src.lower_without_donation, _baseline.COMPILED_ALONE)
  profile = measured(profile, baseline, options)
  program = _program(
    src.lowered, profile.platform, src.traced, options, src.lower_donating, src.donated_argnums
  )
  return dataclasses.replace(profile, program=program)


def measured(profile: MemoryProfile, baseline, compiler_options=None) -> MemoryProfile:
  """`profile` with what its donations saved (`Saving`): the peak of the same program compiled
  without them (`baseline.lower()`, the same compiler options without XLA's dump), read as the
  profile's own (from the buffer assignment a CPU program carries, else from XLA's dump), the
  first time it is asked. A program that aliases nothing is its own baseline. Not measured
  (`saving_not_measured` says why) without a baseline, or when the program without its
  donations does not compile."""
  if profile.alias_bytes == 0:
    return dataclasses.replace(profile, saving=Saving(result=(profile.peak_bytes, "")))
  if baseline is None or baseline.lower is None:
    why = baseline.why if baseline is not None else _baseline.COMPILED_ALONE
    return dataclasses.replace(profile, saving=Saving(result=(None, why)))
  options = {k: v for k, v in (compiler_options or {}).items() if not k.startswith("xla_dump")}
  peak_bytes, platform = profile.peak_bytes, profile.platform

  def measure() -> tuple[int | None, str]:
    try:
      lowered = baseline.lower()
      return (peak_bytes if lowered is None else _peak(lowered, options, platform)), ""
    except Exception as e:  # the profile stands without the comparison, saying why
      return None, (f"compiling it again without its donations failed ({type(e).__name__}: {e})")

  return dataclasses.replace(profile, saving=Saving(measure))


def _read(lowered, options: dict, platform: str) -> tuple[int, int, Any]:
  """`(peak, bytes held, compiled)` of `lowered` compiled with `options`: on CPU from the buffer
  assignment the compiled program carries, elsewhere from XLA's dump of the compile."""
  compiled = lowered.compile(compiler_options=options or None) if platform == "cpu" else None
  compiled, dump, module = _assignment(compiled, lowered, options or None)
  profile = _profile(compiled, dump, module, None)
  return profile.peak_bytes, max(profile.peak_bytes, profile.reserved_bytes), compiled


def _peak(lowered, options: dict, platform: str) -> int:
  """The peak of `lowered` compiled with `options` (`_read`)."""
  return _read(lowered, options, platform)[0]


def _assignment(compiled, lowered, compiler_options) -> tuple[Any, reading.Dump, _hlo.Module]:
  """`(compiled, dump, module)`: the buffer assignment `compiled` carries (CPU programs without
  asynchronous instructions), else `lowered` compiled again with XLA's dump of it."""
  dump = None
  if compiled is not None:
    try:
      dump = dump_of_compiled(compiled)
    except liverange.Unsupported:
      dump = None
  if dump is None:
    return _compile_with_dump(lowered, compiler_options)
  return compiled, dump, _hlo.parse_module(compiled.as_text())


def _compile_with_dump(lowered, compiler_options):
  given = (compiler_options or {}).get("xla_dump_to")  # kept: the caller reads it too
  folder = given or tempfile.mkdtemp(prefix="donate-profile-")
  try:
    options = {**(compiler_options or {}), **_hlo_dump.dump_options(folder)}
    compiled = lowered.compile(compiler_options=options)
    module = _hlo.parse_module(compiled.as_text())
    try:
      dump = reading.read_dump(folder, module.name)
    except FileNotFoundError:  # from JAX's persistent compilation cache: nothing was compiled
      compiled, dump, module = _uncached(lowered, compiled, options, folder)
    if dump.hlo_text is not None and not _names_every_value(module, dump):
      module = _hlo.parse_module(dump.hlo_text)
  finally:
    if not given:
      shutil.rmtree(folder, ignore_errors=True)
  return compiled, dump, module


_UNCACHED = itertools.count(1 << 20)


def _uncached(lowered, compiled, options: dict, folder: str):
  """`(compiled, dump, module)` of a program JAX's persistent compilation cache returned, which
  no compile wrote a dump of: the buffer assignment the executable carries (CPU), else the
  program compiled again with the dump and a cache key of its own. JAX leaves XLA's dump options
  out of its cache key; `xla_debug_buffer_assignment_show_max` (how many buffers XLA's debug text
  lists, no effect on the program) is in it, so a fresh value makes the compile miss the cache."""
  try:
    dump = dump_of_compiled(compiled)
  except liverange.Unsupported:
    dump = None
  if dump is not None:
    return compiled, dump, _hlo.parse_module(compiled.as_text())
  options = {**options, "xla_debug_buffer_assignment_show_max": next(_UNCACHED)}
  compiled = lowered.compile(compiler_options=options)
  module = _hlo.parse_module(compiled.as_text())
  try:
    return compiled, reading.read_dump(folder, module.name), module
  except FileNotFoundError:
    errors.no_buffer_assignment(
      compiled,
      "XLA wrote no buffer assignment for it, compiled "
      "again outside JAX's persistent compilation cache",
    )


def _names_every_value(module, dump) -> bool:
  """Whether `module` (`as_text()`, which a compiled program alone also has) defines every value
  of the buffer assignment. XLA:GPU's dumped module also has the kernels of asynchronous fusions
  that `as_text()` leaves out; where nothing is missing, both sources read the same text."""
  return all(
    module.find(naming.instruction_name(v[0])) is not None
    for a in dump.allocations
    for v in a.values
  )


def _profile(compiled, dump, module, signature, name=None, names=None) -> MemoryProfile:
  """The profile of a compile and its dump (a `jax.jit` program's names unless `names`)."""
  names = _jax_names(compiled, module) if names is None else names
  return assemble(
    dump,
    module,
    compiled.memory_analysis(),
    platform=dump.platform,
    function=name or module.name.removeprefix("jit_"),
    signature=signature,
    **names,
  )


def _jax_names(compiled, module) -> dict:
  """Paths, donations and shardings of a `jax.jit` program, where they line up with its HLO."""
  params = [i for i in module.entry.instructions if i.parameter_number is not None]
  out: dict[str, Any] = {
    "out_paths": None,
    "donated": (),
    "in_shardings": None,
    "out_shardings": None,
  }
  try:
    flat, _ = tree_util.tree_flatten_with_path(compiled.out_info)
    out["out_paths"] = ["out" + tree_util.keystr(p) for p, _ in flat]
    infos = tree_util.tree_leaves(compiled.args_info)
    n = _compat.compiled_num_const_args(compiled)  # closed-over constants lead the parameters
    if n and n + len(infos) == len(params):
      out["in_paths"] = [naming.CONSTANT] * n + [
        naming.entry_parameter_path(module, k) for k in range(n, len(params))
      ]
    if n + len(infos) == len(params):
      out["donated"] = tuple(n + k for k, a in enumerate(infos) if a.donated)
      shardings = tree_util.tree_leaves(compiled.input_shardings)
      out["in_shardings"] = [None] * n + shardings if n else shardings
    out["out_shardings"] = tree_util.tree_leaves(compiled.output_shardings)
  except (AttributeError, TypeError, ValueError):
    pass
  return out


def _donate_names(plan, paths) -> dict:
  """Paths of a `donate.jit` program: its parameters as the plan's leaves, its outputs as the
  user's output leaves (every program returns them in the user's order)."""
  out_paths = [o.path for o in plan.outputs]
  consumed = {i for i, d in enumerate(plan.decisions) if d.requested}
  in_paths = list(paths or [])
  donated = tuple(
    k for k, p in enumerate(in_paths) if any(plan.decisions[i].path == p for i in consumed)
  )
  return {"in_paths": in_paths or None, "out_paths": out_paths, "donated": donated}
