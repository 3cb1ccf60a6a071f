"""Repeated layer calls in a jaxpr: the layers of a model unrolled by a Python `for` loop.

A flax linen model's `for i in range(n): x = Block(name=f"h_{i}")(x)`, an equinox model's
`for layer in self.layers: x = layer(x)` or a plain JAX `for w in ws: x = layer(w, x)` traces
every layer's operations one after the other, all at or below the same line of the user's code
(the loop's call), each layer's exactly as the one before. `calls(eqns)` finds them: a run of
consecutive equations whose user frames share that line, made of two or more identical periods
(the primitives and the frames below the line repeat), each with a matmul (a layer, not a
`tree_map` over leaves). Nothing is read from names or sizes.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os

from donate._base import compat as _compat
from donate._base.jaxprs import subs

_MATMULS = ("dot_general", "conv_general_dilated", "ragged_dot_general")


@dataclasses.dataclass(frozen=True, slots=True)
class Repeat:
  """Layer calls made one after the other from one line: `site` `(file, function, line)` of
  the call, `spans` the `[start, stop)` equation ranges of each call, `linen` whether a flax
  linen module is called (its frames pass through `flax/linen`), `on_line` whether operations
  of the line itself (not of the function it calls) are part of each call."""

  site: tuple[str, str, int]
  spans: tuple[tuple[int, int], ...]
  linen: bool = False
  on_line: bool = False

  @property
  def where(self) -> str:
    return f"{os.path.basename(self.site[0])}:{self.site[2]}"


def _has_matmul(eqns) -> bool:
  for e in eqns:
    if e.primitive.name in _MATMULS or any(_has_matmul(s.jaxpr.eqns) for s in subs(e)):
      return True
  return False


def _period(tokens: list) -> int | None:
  """The shortest period that repeats at least twice and makes up all of `tokens`."""
  n = len(tokens)
  for p in range(1, n // 2 + 1):
    if n % p == 0 and tokens[: n - p] == tokens[p:]:
      return p
  return None


def _prefix_ids(frames: list) -> list[list[int]]:
  """For each equation, an id per depth `d` of its frames `[:d + 1]` (equal ids: equal
  prefixes), so runs are compared as integers."""
  ids: dict = {}
  out = []
  for f in frames:
    row, prev = [], -1
    for frame in f:
      prev = ids.setdefault((prev, frame), len(ids))
      row.append(prev)
    out.append(row)
  return out


def calls(eqns) -> tuple[Repeat, ...]:
  """The repeated layer calls among `eqns` (a jaxpr's equations, in order): see the module."""
  eqns = list(eqns)
  frames = [_compat.user_frames(e.source_info) for e in eqns]
  ids = _prefix_ids(frames)
  taken = [False] * len(eqns)
  found = []
  for depth in range(max((len(f) for f in frames), default=0)):

    def key(k: int, depth=depth) -> int | None:  # the frame at `depth`: the loop's call site
      return ids[k][depth] if len(ids[k]) > depth else None

    i = 0
    while i < len(eqns):
      site, j = key(i), i + 1
      while site is not None and j < len(eqns) and key(j) == site:
        j += 1
      if site is not None and j - i >= 2 and not any(taken[i:j]):
        tokens = [(eqns[k].primitive.name, frames[k][depth + 1 :]) for k in range(i, j)]
        p = _period(tokens)
        if p is not None and _has_matmul(eqns[i : i + p]):
          spans = tuple((s, s + p) for s in range(i, j, p))
          linen = any("flax" + os.sep + "linen" in f[0] for f in frames[i][depth + 1 :])
          on_line = any(len(frames[k]) == depth + 1 for k in range(i, i + p))
          found.append(Repeat(frames[i][depth], spans, linen, on_line))
          taken[i:j] = [True] * (j - i)
      i = j
  return tuple(sorted(found, key=lambda r: r.spans[0]))


def forward(eqns) -> list:
  """The equations of `eqns` that a forward pass of `jax.grad` / `jax.vjp` made (JAX's name
  stack: `jvp(...)`, not `transpose(...)`)."""
  return [
    e
    for e in eqns
    if "jvp(" in str(e.source_info.name_stack) and "transpose(" not in str(e.source_info.name_stack)
  ]


def rewritten(repeat: Repeat, policy: str) -> str | None:
  """The call's line with the called layer checkpointed under `policy` (a
  `jax.checkpoint_policies` name): `nn.remat(Block, policy=...)` for a linen module,
  `jax.checkpoint(layer, policy=...)` otherwise, or, where the line computes more than the call
  (`h = gelu(layer(h))`), `h = jax.checkpoint(lambda h: gelu(layer(h)), policy=...)(h)`; None
  where the line is not one statement of those forms."""
  text = linecache.getline(repeat.site[0], repeat.site[2]).strip()
  try:
    tree = ast.parse(text)
  except SyntaxError:
    return None
  arg = f"policy=jax.checkpoint_policies.{policy}"
  statement = tree.body[0] if len(tree.body) == 1 else None
  if repeat.on_line and not repeat.linen:
    if not (
      isinstance(statement, ast.Assign)
      and len(statement.targets) == 1
      and isinstance(statement.targets[0], ast.Name)
    ):
      return None
    name, value = statement.targets[0].id, ast.get_source_segment(text, statement.value)
    return f"{name} = jax.checkpoint(lambda {name}: {value}, {arg})({name})"
  outer = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
  if not outer:
    return None
  call = outer[0]
  func = call.func
  if repeat.linen and isinstance(func, ast.Call):  # Block(...)(x): the module class
    func = func.func
  called = ast.get_source_segment(text, func)
  if not called:
    return None
  wrap = f"nn.remat({called}, {arg})" if repeat.linen else f"jax.checkpoint({called}, {arg})"
  start = func.col_offset
  return text[:start] + wrap + text[func.end_col_offset :]
