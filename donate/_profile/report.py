"""The doctor's report of a run: programs ranked by peak, trivial ones folded, one line per program
that a user acts on (`verdict`), what grew against an earlier run (`compare`), and the JSON each
program leaves beside its page for that comparison (`record`).

The line of a program names its top category at the peak with its grouping: the buffers of the
largest group of that category (one source line, or one path with the layer numbers taken out),
how many layers they span and their scopes with the layer numbers folded (`span`):

>>> span([layer_scope(f"jit(step)/jvp(GPT)/h_{k}/attn/div") for k in (0, 3, 1)])
('h_0..h_3/attn', 3)
>>> span(["params['h_0']['mlp']['kernel']", "params['h_1']['mlp']['kernel']"])
("params['h_0..h_1']['mlp']['kernel']", 2)
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re

from donate._base.text import format_bytes
from donate._profile import views
from donate._profile.model import library
from donate._profile.naming import layer_scope
from donate._profile.naming import middle as _clip

_DIGITS = re.compile(r"\d+")


def span(names: list[str]) -> tuple[str, int]:
  """`names` written as one, their numbers that differ folded to `first..last`, and how many
  distinct values the first differing number takes (the layers they span; 1 when none differs).
  Names of different shapes: the most common one and 1."""
  names = [n for n in names if n]
  if not names:
    return "", 1
  skeletons = {_DIGITS.sub("#", n) for n in names}
  if len(skeletons) != 1:
    return collections.Counter(names).most_common(1)[0][0], 1
  numbers = [[int(d) for d in _DIGITS.findall(n)] for n in names]
  pieces, layers = _DIGITS.split(names[0]), 1
  out = pieces[0]
  for k in range(len(numbers[0])):
    values = sorted({ns[k] for ns in numbers})
    if len(values) > 1 and layers == 1:
      layers = len(values)
    word = re.search(r"[A-Za-z_]*$", out)
    prefix = word.group(0) if word else ""
    out += f"{values[0]}..{prefix}{values[-1]}" if len(values) > 1 else str(values[0])
    out += pieces[k + 1]
  return out, layers


@dataclasses.dataclass(frozen=True)
class Group:
  """The largest group of one category at the peak: `count` buffers over `layers` layers."""

  category: str
  total_bytes: int
  share: float  # of the peak
  count: int
  layers: int
  each: int | None  # the size of every buffer, when they are all one size
  where: str  # the source line (file:line) or the path
  scope: str  # the scopes (or paths), layer numbers folded
  library: str | None = None  # the library's line under `where` (`flax/linen/linear.py:287`)

  def __str__(self) -> str:
    size = format_bytes(self.each) if self.each is not None else None
    per = self.count // self.layers if self.count % self.layers == 0 else None
    if self.layers > 1 and per is not None and size is not None:
      many = f"{self.layers} layers x {per} x {size}" if per > 1 else f"{self.layers} x {size}"
    elif self.layers > 1:
      many = f"{self.layers} layers x {format_bytes(self.total_bytes // self.layers)}"
    elif size is not None and self.count > 1:
      many = f"{self.count} x {size}"
    else:
      many = format_bytes(self.total_bytes)
    at = f" at {self.where}" if self.where and self.where != self.scope else ""
    return f"{many}{at}" + (f" ({self.scope})" if self.scope else "")


def _short(source: str) -> str:
  path, _, line = source.rpartition(":")
  return f"{os.path.basename(path)}:{line}" if path else source


def groups(p) -> list[Group]:
  """`p`'s buffers at the peak by category, source line and scope (a buffer without a line by its
  path), their layer numbers taken out, largest first: the by-line table, folded by layers."""
  share = {g.key: g.total_bytes / (p.peak_bytes or 1) for g in p.by_category()}
  found: dict[tuple[str, str], list] = {}
  for e in p.at_peak:
    if e.nbytes:
      # a line's values by scope; leaves by path, folded only with leaves of their size
      # (the line number is kept: only the layer numbers of a scope or a path fold)
      if e.source:
        key = f"{e.source} {_DIGITS.sub('#', layer_scope(e.scope or ''))}"
      else:
        key = f"{_DIGITS.sub('#', e.path or e.value)} {e.nbytes}"
      found.setdefault((e.category, key), []).append(e)
  out = []
  for (cat, _), es in found.items():
    if es[0].source:
      scope, layers = span([layer_scope(e.scope or "") for e in es])
      where = _short(es[0].source)
    else:
      scope, layers = span([e.path or e.value for e in es])
      where = scope
    sizes = {e.nbytes for e in es}
    count = sum(e.repeat for e in es)
    each = sizes.pop() if len(sizes) == 1 and count == len(es) else None
    total = sum(e.nbytes for e in es)
    out.append(
      Group(cat, total, share.get(cat, 0.0), count, layers, each, where, scope, library(es))
    )
  return sorted(out, key=lambda g: (-g.total_bytes, g.category, g.where))


def top_group(p) -> Group | None:
  """The largest group of the largest category at `p`'s peak."""
  cats = p.by_category()
  if not cats or not p.peak_bytes:
    return None
  return next((g for g in groups(p) if g.category == cats[0].key), None)


def remedies(items) -> str:
  """Measured remedies as one clause: "measured: <change> -1.2 MiB, ..." (those that lower the
  peak; "" without any)."""
  found = [a for a in items if getattr(a, "peak_bytes", None) is not None and a.saving_bytes > 0]
  found.sort(key=lambda a: -a.saving_bytes)
  if not found:
    return "measured: nothing offered lowers the peak" if items else ""
  return "measured: " + ", ".join(
    f"{change(a)} -{format_bytes(a.saving_bytes)}"
    + (f" (+{format_bytes(a.host_bytes)} host)" if getattr(a, "host_bytes", 0) else "")
    for a in found[:3]
  )


def change(a) -> str:
  """A remedy's change in a few words: donating a set of leaves is named by the arguments they
  belong to (`donating state (donate_argnums=0)`), one measured total, the leaves folded."""
  if "donate" in a.how and a.change.startswith("donate "):
    heads = dict.fromkeys(
      re.split(r"[.\[]", path, maxsplit=1)[0] for path in a.change[len("donate ") :].split(", ")
    )
    return f"donating {', '.join(heads)} ({a.how})"
  return _clip(a.change, 60)


def verdict(p, device=None, advice=None) -> str:
  """One line a user acts on: the peak, the top category with its grouping, whether it fits
  `device` (`str(p.fits(device))`) and the measured `advice` (`p.advice()`'s items)."""
  line = f"{p.function}: peak {views.device(p)}"
  g = top_group(p)
  if g is not None:
    line += f", {g.share:.0%} {g.category} ({g})"
  if device is not None:
    line += f"; {p.fits(device)}"
  if advice is not None:
    said = remedies(advice)
    line += f"; {said}" if said else ""
  return line


def ranked(found: list, top: int, min_share: float) -> tuple[list, list]:
  """(shown, folded): the programs by peak, largest first; folded are those past `top` or under
  `min_share` of the largest peak."""
  order = sorted(found, key=lambda p: -p.peak_bytes)
  largest = order[0].peak_bytes if order else 0
  shown = [p for p in order[:top] if p.peak_bytes >= min_share * largest]
  return shown, order[len(shown) :]


def folded(rest: list, min_share: float) -> str:
  """The line for the programs left out, the operations run eagerly (one-op programs, named
  after their operation) counted by kind:

  "31 more programs, each under 1% of the largest or past the top (1.2 MiB together): 29 one-op
  programs (broadcast_in_dim x 20, iota x 9), 2 others (init, loss)"."""
  if not rest:
    return ""
  s = "s" if len(rest) > 1 else ""
  line = (
    f"{len(rest)} more program{s}, each under {min_share:.0%} of the largest or past the top "
    f"({format_bytes(sum(p.peak_bytes for p in rest))} together)"
  )
  one = [p.function for p in rest if len(getattr(p, "operations", ())) == 1]
  others = [p.function for p in rest if len(getattr(p, "operations", ())) != 1]
  parts = []
  if one:
    parts.append(f"{len(one)} one-op program{'s' if len(one) > 1 else ''} ({_kinds(one)})")
  if one and others:
    parts.append(f"{len(others)} other{'s' if len(others) > 1 else ''} ({_kinds(others)})")
  return line + (": " + ", ".join(parts) if parts else "")


def _kinds(names: list[str], most: int = 6) -> str:
  """`broadcast_in_dim x 20, iota x 9`: the names by count, most first (a name once: alone)."""
  counts = collections.Counter(names).most_common()
  words = [f"{n} x {c}" if c > 1 else n for n, c in counts[:most]]
  return ", ".join(words) + (f" and {len(counts) - most} more" if len(counts) > most else "")


def summary(found: list, device=None, advice=None, top=10, min_share=0.01, cached=0) -> str:
  """The terminal summary: a headline, one `verdict` per program shown, the folded ones in one
  line. `advice` maps a program's position in `found` to its measured advice.

  >>> print(summary([], cached=2))
  donate.profile: 0 compiled programs
  2 programs read from JAX's persistent compilation cache: not compiled, not profiled
  """
  shown, rest = ranked(found, top, min_share)
  head = f"donate.profile: {len(found)} compiled program{'s' if len(found) != 1 else ''}"
  if shown:
    head += f"; the largest peak is {shown[0].function}'s, {format_bytes(shown[0].peak_bytes)}"
  lines = [head]
  if cached:
    lines.append(
      f"{cached} program{'s' if cached > 1 else ''} read from JAX's persistent compilation cache: "
      "not compiled, not profiled"
    )
  index = {id(p): k for k, p in enumerate(found)}
  for p in shown:
    lines.append("  " + verdict(p, device, (advice or {}).get(index[id(p)])))
  if rest:
    lines.append("  " + folded(rest, min_share))
  return "\n".join(lines)


def record(p) -> dict:
  """What `compare` needs of a program: its peak, and its bytes at the peak by category and by
  source line (the file's name and line)."""
  lines: dict[str, int] = {}
  for r in p.by_line():
    key = f"{_short(r.source)} ({r.category})"
    lines[key] = lines.get(key, 0) + r.total_bytes
  return {
    "function": p.function,
    "peak_bytes": p.peak_bytes,
    "reserved_bytes": p.reserved_bytes,
    "categories": {g.key: g.total_bytes for g in p.by_category()},
    "lines": lines,
  }


def load(folder: str) -> list[dict]:
  """The records an earlier run left in `folder` (`NNN_name.json`), in its order."""
  found = []
  for name in sorted(os.listdir(folder)):
    if name.endswith(".json") and name[:3].isdigit():
      with open(os.path.join(folder, name), encoding="utf-8") as fh:
        found.append(json.load(fh))
  return found


def _grew(before: dict, after: dict, most: int = 3) -> list[str]:
  keys = set(before) | set(after)
  deltas = sorted(((after.get(k, 0) - before.get(k, 0), k) for k in keys), reverse=True)
  return [f"{k} {'+' if d > 0 else ''}{format_bytes(d)}" for d, k in deltas[:most] if d > 0]


def compare(now: list[dict], earlier: list[dict], top: int = 10) -> str:
  """What changed against an earlier run: per program (matched by name, in order of compile)
  its peak before and now and what grew most, by category and by source line."""
  pool: dict[str, list[dict]] = {}
  for r in earlier:
    pool.setdefault(r["function"], []).append(r)
  lines = []
  for r in sorted(now, key=lambda r: -r["peak_bytes"])[:top]:
    olds = pool.get(r["function"])
    if not olds:
      lines.append(
        f"  {r['function']}: peak {format_bytes(r['peak_bytes'])}, not in the earlier run"
      )
      continue
    old = olds.pop(0)
    delta = r["peak_bytes"] - old["peak_bytes"]
    change = "unchanged" if delta == 0 else f"{'+' if delta > 0 else ''}{format_bytes(delta)}"
    line = (
      f"  {r['function']}: peak {format_bytes(r['peak_bytes'])}, was "
      f"{format_bytes(old['peak_bytes'])} ({change})"
    )
    grew = _grew(old["categories"], r["categories"]) + _grew(old["lines"], r["lines"], 2)
    lines.append(line + (f"; grew: {', '.join(grew)}" if grew else ""))
  names = {r["function"] for r in now}
  gone = sum(len(v) for k, v in pool.items() if k not in names)
  if gone:
    lines.append(f"  {gone} program{'s' if gone > 1 else ''} of the earlier run not compiled now")
  return "\n".join(["against the earlier run:"] + lines)
