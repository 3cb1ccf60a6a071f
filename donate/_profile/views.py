"""A memory profile as text (at most 100 columns), HTML for notebooks, words and a plot."""

from __future__ import annotations

import html as _html

from donate._base.text import format_bytes
from donate._profile import shadow as _shadow
from donate._profile.naming import middle
from donate._profile.treemap import packing, treemap
from donate._xla import frames as _frames

WIDTH = 100
_ROWS = 12


def size(n: int) -> str:
  return format_bytes(n)


def device(p) -> str:
  """The peak, with the host memory beside it where the program keeps some there (offload):
  "52.0 GiB device + 9.1 GiB host"; the device's bytes alone otherwise."""
  host = getattr(p, "host_bytes", 0)
  peak = size(p.peak_bytes)
  return f"{peak} device + {size(host)} host" if host else peak


def _clip(text: str | None, width: int) -> str:
  """`text` cut in the middle to `width` characters: its head (the layer) and its leaf stay."""
  return middle(text or "-", width)


NOT_YET = "not measured yet: profile.measure()"


def saving(p) -> str:
  """What the donations saved at the peak, measured, or why it was not (compiles nothing: before
  `profile.measure()` it says so)."""
  if p.alias_bytes == 0:
    return "donation saved nothing at the peak: no output reuses an argument's buffer"
  if not p.saving_measured:
    return f"donation saved: {NOT_YET}"
  saved = p.donation_saved_bytes
  if saved is None:
    return f"donation saved: not measured: {p.saving_not_measured}{_how_to_measure(p)}"
  without = f"({size(p.peak_without_donation_bytes)} without it)"
  if saved < 0:
    return f"donation cost {size(-saved)} at the peak {without}"
  return f"donation saved {size(saved)} at the peak {without}"


def _how_to_measure(p) -> str:
  """For a profile without a baseline (the command line's, read from XLA's dump): the one call
  that measures the saving."""
  if p.saving is not None:
    return ""
  return (
    "; measure it in one call: donate.memory_profile(jax.jit(f, donate_argnums=...), *args)"
    ".donation_saved_bytes"
  )


def _saving_explained(p) -> str | None:
  if p.alias_bytes == 0:
    return None
  if not p.saving_measured:
    return f"What the donations saved at the peak: {NOT_YET}."
  saved = p.donation_saved_bytes
  if saved is None:
    return (
      f"What the donations saved at the peak is not measured: {p.saving_not_measured}"
      f"{_how_to_measure(p)}."
    )
  reuse = ": XLA reuses buffers without the donations too" if saved < p.alias_bytes else ""
  return (
    f"Compiled again without its donations (the same jaxpr, shardings and compiler "
    f"options) the program peaks at {size(p.peak_without_donation_bytes)}: the "
    f"donations saved {size(max(saved, 0))} at the peak"
    + (f" (they cost {size(-saved)})" if saved < 0 else "")
    + f" for {size(p.alias_bytes)} aliased{reuse}."
  )


def explain(p) -> str:
  """XLA's figures for `p`'s program, what each counts, and why they differ, in words."""
  fixed = p.argument_bytes + p.output_bytes - p.alias_bytes + p.constant_bytes
  step = p.timeline[p.peak_step]
  in_use = step.temp_bytes + step.collective_bytes
  constants = f" + constants {size(p.constant_bytes)}" if p.constant_bytes else ""
  lines = [
    f"arguments {size(p.argument_bytes)} + outputs {size(p.output_bytes)} - aliased "
    f"{size(p.alias_bytes)} + temporaries {size(p.temp_bytes)}{constants} = "
    f"{size(p.reserved_bytes)}: what the program holds on the device while it runs (its "
    "temporaries are one block, sized for the most XLA's packing holds at once"
    + (
      "; its constants are the literals XLA keeps with it, which memory_analysis() leaves out)."
      if constants
      else ")."
    ),
    f"peak_bytes {size(p.peak_bytes)}: the timeline's highest point, at step {p.peak_step} "
    f"({p.peak_instruction}): the allocations that live for the whole program (arguments and "
    f"outputs, an aliased pair once{', constants' if constants else ''}: {size(fixed)}) plus "
    f"the {size(in_use)} of temporaries live there.",
  ]
  gap = p.free_at_peak_bytes
  if gap > 0:
    lines.append(
      f"The temp block is {size(gap)} larger than what is live at the peak: bytes "
      "XLA's packing leaves free there (alignment and gaps between buffers)."
    )
  if p.xla_peak_bytes is not None:
    lines.append(_xla_peak(p, fixed, in_use))
  donation = _saving_explained(p)
  return "\n".join(lines + ([donation] if donation else []))


def _xla_peak(p, fixed: int, in_use: int) -> str:
  extra = p.xla_peak_bytes - fixed
  head = (
    f"memory_analysis().peak_memory_in_bytes {size(p.xla_peak_bytes)}: the allocations "
    f"that live for the whole program ({size(fixed)}) "
  )
  if extra == 0:
    return head + (
      "and none of the temporaries: this backend's buffer assignment keeps no heap "
      "trace for XLA to add them from."
    )
  trace = f"plus {size(extra)}, the most XLA's heap trace of the temp block holds at once"
  if extra == in_use:
    return head + trace + ": the temporaries live at peak_bytes, so the two peaks agree."
  if 0 < extra < in_use:
    return (
      head
      + trace
      + (
        f": {size(in_use - extra)} less than the temporaries live at "
        "peak_bytes, values XLA's live ranges hold there that its heap trace "
        "leaves out."
      )
    )
  return head + f"{'plus' if extra > 0 else 'minus'} {size(abs(extra))} from XLA's heap trace."


def _table(p) -> list[str]:
  head = f"{'bytes':>10}  {'category':<15}  {'owner (path or source line)':<44}  scope"
  lines = [head, "-" * min(WIDTH - 2, len(head) + 24)]
  for e in p.at_peak[:_ROWS]:
    owner = e.path or _frames.shown(e.source) or e.value
    if e.aliased and e.output:
      owner = f"{owner} -> {e.output}"
    lines.append(
      f"{size(e.nbytes):>10}  {e.category:<15}  {_clip(owner, 44):<44}  "
      f"{_clip(e.scope, WIDTH - 77)}"
    )
  rest = p.at_peak[_ROWS:]
  if rest:
    lines.append(f"{size(sum(e.nbytes for e in rest)):>10}  ({len(rest)} more buffers)")
  return lines


def text(p) -> str:
  """The profile as text: totals, the peak's buffers, groups by scope, advice, XLA's figures."""
  lines = [
    _clip(f"memory profile of {p.function} ({p.platform}, per device)", WIDTH),
    f"  peak {device(p)} at step {p.peak_step} of {len(p.timeline)}, "
    f"{size(p.reserved_bytes)} allocated",
    f"  arguments {size(p.argument_bytes)}, outputs {size(p.output_bytes)}, aliased "
    f"{size(p.alias_bytes)}, temporaries {size(p.temp_bytes)}"
    + (f", constants {size(p.constant_bytes)}" if p.constant_bytes else ""),
    *_wrap(saving(p), WIDTH - 2, "  "),
    f"  {p.attributed_fraction():.0%} of the bytes at the peak carry a source line or a path",
    "",
    "at the peak:",
  ]
  lines += ["  " + ln for ln in _table(p)]
  lines += ["", "by category:"] + [
    f"  {size(g.total_bytes):>10}  {g.key} ({g.count} buffer{'s' if g.count != 1 else ''})"
    for g in p.by_category()
  ]
  lines += ["", "by source line:"]
  for r in p.by_line()[:6]:
    first, *under = _with_library(r, WIDTH - 14)
    lines += [f"  {size(r.total_bytes):>10}  {first}"] + [f"{'':14}{ln}" for ln in under]
  lines += ["", "by scope:"] + [
    f"  {size(g.total_bytes):>10}  {_clip(g.key, WIDTH - 14)}" for g in p.by_scope()[:6]
  ]
  if p.could_donate:
    lines += ["", "could donate:"] + ["  " + _clip(str(s), WIDTH - 2) for s in p.could_donate]
  if p.shadowed:
    lines += [
      "",
      "donations with a temporary of their size beside them at the peak "
      f"(each {_shadow.SMALL:.0%} of it or more):",
    ]
    for s in p.shadowed:
      lines += _wrap(f"{s.path} -> {s.output}: {s}", WIDTH - 2, "  ")
  if p.saving_measured and p.not_lowered:
    lines += ["", f"the peak is not lower than without the donations: {_aliased_list(p)}"]
  lines += ["", "XLA's figures:"]
  for paragraph in explain(p).splitlines():
    lines += _wrap(paragraph, WIDTH - 2, "  ")
  return "\n".join(lines)


def _with_library(row, width: int) -> list[str]:
  """A by-line row with its library's line second (`..., in flax/linen/linear.py:287`): after
  it where the row has room, else on a line of its own under it."""
  text, library = str(row), getattr(row, "library", None)
  if not library:
    return [_clip(text, width)]
  if len(text) + len(library) + 5 <= width:
    return [f"{text}, in {library}"]
  return [_clip(text, width), _clip(f"  in {library}", width)]


def _aliased_list(p) -> str:
  names = [e.path or e.value for e in p.not_lowered]
  return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _wrap(paragraph: str, width: int, indent: str) -> list[str]:
  out, line = [], ""
  for word in paragraph.split():
    if line and len(line) + 1 + len(word) > width:
      out.append(indent + line)
      line = word
    else:
      line = f"{line} {word}" if line else word
  return out + ([indent + line] if line else [])


def html(p) -> str:
  """The profile as an HTML table for notebooks."""
  esc = _html.escape
  rows = "".join(
    f"<tr><td style='text-align:right'>{esc(size(e.nbytes))}</td><td>{esc(e.category)}</td>"
    f"<td><code>{esc(e.path or '')}</code></td>"
    f"<td><code>{esc(_frames.shown(e.source) or '')}</code></td>"
    f"<td><code>{esc(e.scope or '')}</code></td></tr>"
    for e in p.at_peak[:40]
  )
  advice = "".join(f"<li>{esc(str(s))}</li>" for s in p.could_donate)
  shadowed = "".join(f"<li><code>{esc(s.path)}</code>: {esc(str(s))}</li>" for s in p.shadowed)
  if p.saving_measured and p.not_lowered:
    shadowed += (
      f"<li>the peak is not lower than without the donations: "
      f"<code>{esc(_aliased_list(p))}</code></li>"
    )
  explained = "".join(f"<li>{esc(ln)}</li>" for ln in explain(p).splitlines())
  return (
    f"<div><b>memory profile of {esc(p.function)}</b> ({esc(p.platform)}, per device): "
    f"peak {esc(device(p))} at step {p.peak_step}, "
    f"{esc(size(p.reserved_bytes))} allocated; {esc(saving(p))}"
    + treemap(p)
    + "<table><tr><th>bytes</th><th>category</th><th>path</th><th>source</th><th>scope</th>"
    f"</tr>{rows}</table>"
    + (f"<p>Could donate:</p><ul>{advice}</ul>" if advice else "")
    + (f"<p>Donations that left the peak high:</p><ul>{shadowed}</ul>" if shadowed else "")
    + (packing(p) if p.layout else "")
    + f"<p>XLA's figures:</p><ul>{explained}</ul></div>"
  )


def plot(p, ax=None):
  """Stacked areas of the timeline with the peak marked, and bars of the peak by category."""
  import matplotlib.pyplot as plt

  if ax is None:
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(12, 4), width_ratios=(2, 1))
  else:
    fig, bars = ax.figure, None
  t = p.timeline
  steps = range(len(t))
  layers = [
    ("arguments", [t.argument_bytes] * len(t)),
    ("aliased", [t.alias_bytes] * len(t)),
    ("outputs", [t.output_bytes] * len(t)),
    ("constants", [t.constant_bytes] * len(t)),
    ("temporaries", list(t.temp_bytes)),
    ("collective", list(t.collective_bytes)),
  ]
  mib = 1 << 20
  ax.stackplot(
    steps, *[[v / mib for v in ys] for _, ys in layers], labels=[name for name, _ in layers]
  )
  ax.axvline(p.peak_step, color="k", linestyle="--", linewidth=1)
  ax.set_xlabel("schedule step")
  ax.set_ylabel("MiB per device")
  ax.set_title(f"{p.function}: peak {size(p.peak_bytes)} at step {p.peak_step}")
  ax.legend(loc="upper left", fontsize="small")
  if bars is not None:
    groups = p.by_category()[::-1]
    bars.barh([_clip(g.key, 40) for g in groups], [g.total_bytes / mib for g in groups])
    bars.set_xlabel("MiB at the peak")
    fig.tight_layout()
  return fig
