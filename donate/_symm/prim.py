"""The ``symmetric`` identity primitive: records "this value lives in symmetric memory" in a jaxpr.

``symmetric_p`` has three params: ``axis_name`` (a tuple of mesh axis names, the communication
group), ``kind`` (the comm-buffer type, e.g. ``"symm_mem"``) and ``source`` (which annotation put
it there: ``"with_symmetric"``, ``"requires_symmetric"`` or ``"context"``).

Rules:

* evaluation and abstract evaluation are the identity (the output aval is the input aval, so
  ``shard_map``'s varying-manual-axes types pass through unchanged);
* JVP: the primal *and* the tangent are marked (in forward mode the tangent flows into the same
  collective as the primal, so it wants the same memory); a symbolic-zero tangent stays zero;
* transpose: the identity, *unmarked* (a cotangent flows out of a collective's transpose, not
  into a collective; collectives of the backward pass are marked by ``mark_required``);
* batching: the identity on the batched value, batch dimension unchanged.

Lowering (every platform): the value is returned unchanged and the *operation that produced it*
gets ``mhlo.frontend_attributes`` (merged with any it has; differing values joined by ``;``)::

    %1 = stablehlo.sine %0 {mhlo.frontend_attributes = {donate.symmetric = "symm_mem",
        donate.group = "i", donate.source = "with_symmetric", donate.results = "0",
        donate.memory_space = "collective", donate.memory_space_color = "1"}} : tensor<4xf32>

so the compiled program is the one without annotations (bit-identical results; the rule is
registered ``cacheable=False`` so that JAX lowers it inline, next to the producing op). A value
with no producing op (a function or region argument) is passed through a
``stablehlo.optimization_barrier`` that carries the attributes instead.

What each piece drives in XLA:

* On GPU, XLA's buffer assigner colours every buffer used by an all-reduce, all-gather,
  reduce-scatter, collective-permute or all-to-all with ``kCollectiveMemorySpaceColor = 1``
  (``xla/service/gpu/gpu_memory_space_assignment.h``, ``CollectiveColorer``) when
  ``xla_gpu_enable_nccl_user_buffers`` is on; colour 1 (``S(1)`` in HLO layouts) is allocated
  with ``ncclMemAlloc`` from the collective allocator sized by
  ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB`` and registered with NCCL
  (``xla_gpu_experimental_enable_nccl_symmetric_buffers`` registers it as an NCCL symmetric
  window). ``donate._symm.xla.gpu_compile_options`` turns those flags on.
* The ``donate.*`` frontend attributes are read by no XLA pass (XLA has no per-value switch for
  memory space 1 that a frontend can set): they make each symmetric value, its kind and group
  visible in the lowered module and in HLO dumps, so a reader, a test or a future XLA pass can
  check which buffers were meant for memory space 1. The barrier, where used, is the identity;
  on CPU and TPU nothing else changes.
"""

from __future__ import annotations

import itertools
import threading

import jax
import jax.extend as jex
import jax.numpy as jnp
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo
from jax.interpreters import ad, batching, mlir

from donate._base import primitives as _primitives
from donate._base.compat import bound_axis_names
from donate._base.errors import DonationError, message

SOURCES = ("with_symmetric", "requires_symmetric", "context")
"""The legal values of ``symmetric_p``'s ``source`` param."""

COLLECTIVE_MEMORY_SPACE = 1
"""XLA:GPU's ``kCollectiveMemorySpaceColor`` (``S(1)``): buffers allocated with ``ncclMemAlloc``."""

symmetric_p = jex.core.Primitive("symmetric")
"""Identity primitive marking a value that must live in symmetric memory (see module docstring)."""


def _impl(x, *, axis_name, kind, source):
  del axis_name, kind, source
  return x


def _abstract_eval(aval, *, axis_name, kind, source):
  del axis_name, kind, source
  _traced[0] = True
  return aval


_traced = [False]  # whether symmetric_p was ever traced in this process (see marks_traced)


def note_marked() -> None:
  """Records that a ``symmetric_p`` equation exists (made by a rewrite rather than a trace)."""
  _traced[0] = True


def marks_traced() -> bool:
  """Whether any value was ever marked in a trace (else no jaxpr holds a ``symmetric_p``
  equation: ``mark_required`` adds them only when something is registered or a context used)."""
  return _traced[0]


def _jvp(primals, tangents, **params):
  (x,), (t,) = primals, tangents
  y = symmetric_p.bind(x, **params)
  if type(t) is ad.Zero:  # pylint: disable=unidiomatic-typecheck
    return y, t
  return y, symmetric_p.bind(t, **params)


def _transpose(ct, x, **params):
  del x, params
  return [ct]


def _batch(args, dims, **params):
  return symmetric_p.bind(args[0], **params), dims[0]


def frontend_attributes(*, axis_name, kind, source) -> dict[str, str]:
  """Returns the ``mhlo.frontend_attributes`` the lowering puts on a symmetric value.

  >>> attrs = frontend_attributes(axis_name=("i",), kind="symm_mem", source="with_symmetric")
  >>> attrs["donate.group"]
  'i'
  """
  return {
    "donate.symmetric": kind,
    "donate.group": ",".join(str(a) for a in axis_name),
    "donate.source": source,
    "donate.memory_space": "collective",
    "donate.memory_space_color": str(COLLECTIVE_MEMORY_SPACE),
  }


def _merged(op, attrs: dict[str, str]) -> dict[str, str]:
  """``attrs`` merged into ``op``'s frontend attributes (differing values joined by ';')."""
  merged = {}
  if "mhlo.frontend_attributes" in op.attributes:
    old = ir.DictAttr(op.attributes["mhlo.frontend_attributes"])
    merged = {old[i].name: ir.StringAttr(old[i].attr).value for i in range(len(old))}
  for key, value in attrs.items():
    before = merged.get(key)
    merged[key] = (
      value if before in (None, value) or value in before.split(";") else (f"{before};{value}")
    )
  return merged


def _set_attributes(op, attrs: dict[str, str]) -> None:
  op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(
    {k: ir.StringAttr.get(v) for k, v in _merged(op, attrs).items()}
  )


def _lower(ctx, x, *, axis_name, kind, source):
  del ctx
  attrs = frontend_attributes(axis_name=axis_name, kind=kind, source=source)
  value = x.maybe_downcast()
  if isinstance(value, ir.OpResult):  # mark the producing op itself; nothing else changes.
    attrs["donate.results"] = str(value.result_number)
    _set_attributes(value.owner, attrs)
    return [x]
  op = stablehlo.OptimizationBarrierOp([x])  # a block argument: mark a pass-through op.
  _set_attributes(op.operation, attrs)
  return op.results


symmetric_p.def_impl(_impl)
symmetric_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[symmetric_p] = _jvp
ad.primitive_transposes[symmetric_p] = _transpose
batching.primitive_batchers[symmetric_p] = _batch
mlir.register_lowering(symmetric_p, _lower, cacheable=False)  # inline: see the producing op.


def normalize_axes(axis_name, *, where: str) -> tuple[str, ...]:
  """Turns an axis name or a sequence of them into a non-empty tuple, or raises DonationError.

  >>> normalize_axes("i", where="with_symmetric")
  ('i',)
  >>> normalize_axes(["i", "j"], where="with_symmetric")
  ('i', 'j')
  """
  axes = (axis_name,) if isinstance(axis_name, str) else axis_name
  try:
    axes = tuple(axes)
  except TypeError:
    axes = ()
  if not axes or not all(isinstance(a, str) and a for a in axes):
    raise DonationError(
      message(
        f"{where} needs the mesh axis name(s) of the communication group",
        expected="a non-empty axis name or tuple of axis names",
        got=repr(axis_name),
        fix="pass the name of a mesh axis, e.g. axis_name='i'",
      )
    )
  return axes


def check_kind(kind, *, where: str) -> str:
  """Returns ``kind`` if it is a non-empty string, else raises DonationError.

  >>> check_kind("symm_mem", where="with_symmetric")
  'symm_mem'
  """
  if not isinstance(kind, str) or not kind:
    raise DonationError(
      message(
        f"{where} needs a comm-buffer kind",
        expected="a non-empty string such as 'symm_mem'",
        got=repr(kind),
        fix="pass kind='symm_mem'",
      )
    )
  return kind


def check_bound(axes: tuple[str, ...], *, where: str) -> None:
  """Raises DonationError unless every name in ``axes`` is bound where the caller is traced.

  >>> check_bound(("i",), where="with_symmetric")
  Traceback (most recent call last):
  ...
  donate._base.errors.DonationError: donate: with_symmetric uses axis name 'i', which is not
  bound here: expected one of the bound axis names (none are bound), got 'i'. Fix: call it inside
  jax.shard_map over a mesh with axis 'i', or use one of the bound names.
  """
  bound = bound_axis_names()
  for axis in axes:
    if axis not in bound:
      names = ", ".join(repr(b) for b in bound) if bound else "(none are bound)"
      raise DonationError(
        message(
          f"{where} uses axis name {axis!r}, which is not bound here",
          expected=f"one of the bound axis names {names}",
          got=repr(axis),
          fix=f"call it inside jax.shard_map over a mesh with axis {axis!r}, "
          "or use one of the bound names",
        )
      )


def is_tracing(tree) -> bool:
  """True if any leaf of ``tree`` is a JAX tracer (we are inside ``jit``, ``grad``, ...).

  >>> is_tracing(1.0)
  False
  """
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def mark(tree, axis_name, *, kind: str, source: str):
  """Binds ``symmetric_p`` on every leaf of ``tree`` if traced; returns ``tree`` as is otherwise.

  >>> mark(1.0, "i", kind="symm_mem", source="with_symmetric")
  1.0
  """
  axes = normalize_axes(axis_name, where=source)
  check_kind(kind, where=source)
  if source not in SOURCES:
    raise DonationError(
      message("unknown annotation source", expected=f"one of {SOURCES}", got=repr(source))
    )
  if not is_tracing(tree):
    return tree
  check_bound(axes, where=source)
  return jax.tree.map(
    lambda leaf: symmetric_p.bind(jnp.asarray(leaf), axis_name=axes, kind=kind, source=source), tree
  )


# --- the symmetric_memory context: a recognisable named scope -------------------------------------

_SCOPE_PREFIX = "donate_symm#"
_scopes: dict[tuple[tuple[str, ...], str], str] = {}
_scope_specs: dict[str, tuple[tuple[str, ...], str]] = {}
_scope_ids = itertools.count()
_scope_lock = threading.Lock()


def scope_name(axes: tuple[str, ...], kind: str) -> str:
  """Returns the ``jax.named_scope`` name that stands for ``(axes, kind)`` in name stacks.

  Names are interned, so any axis name works (no parsing of user strings).

  >>> scope_name(("i",), "symm_mem") == scope_name(("i",), "symm_mem")
  True
  """
  with _scope_lock:
    name = _scopes.get((axes, kind))
    if name is None:
      name = f"{_SCOPE_PREFIX}{next(_scope_ids)}"
      _scopes[(axes, kind)] = name
      _scope_specs[name] = (axes, kind)
  return name


def contexts_used() -> bool:
  """Whether any `symmetric_memory` context was entered in this process (else no equation can
  have been traced inside one)."""
  return bool(_scopes)


def context_spec(eqn) -> tuple[tuple[str, ...], str] | None:
  """Returns ``(axes, kind)`` if ``eqn`` was traced inside ``symmetric_memory``, else None.

  The innermost context wins. ``symmetric_p`` equations and pure views
  (``_primitives.TRACE_BACK_VIEWS``: reshape, convert, ``pvary``, ...) are never context outputs:
  they materialise nothing of their own.
  Nor are equations of a backward pass (``transpose(...)`` in the name stack): like PyTorch's
  context manager, the context covers the forward computation written inside it.

  >>> import jax, jax.numpy as jnp
  >>> context_spec(jax.make_jaxpr(jnp.sin)(1.0).eqns[0]) is None
  True
  """
  if (
    not _scopes
    or eqn.primitive is symmetric_p  # no context was ever entered: none here
    or eqn.primitive.name in _primitives.TRACE_BACK_VIEWS
    or eqn.source_info is None
  ):
    return None
  stack = str(eqn.source_info.name_stack)
  at = stack.rfind(_SCOPE_PREFIX)
  if at < 0 or "transpose(" in stack[:at]:  # backward-pass equations are not "produced inside".
    return None
  digits = itertools.takewhile(str.isdigit, stack[at + len(_SCOPE_PREFIX) :])
  return _scope_specs.get(_SCOPE_PREFIX + "".join(digits))
