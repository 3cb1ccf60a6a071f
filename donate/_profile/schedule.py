"""Rounds of measured variants: announced before they start, counted while they run, compiled
`max_workers` at a time.

`advice()`, `fit()` and `largest_batch()` compile the profiled program again, once per
candidate change; for a large step each compile takes tens of seconds. Before a round compiles
anything, one line on stderr says how many compiles it makes and where ("fit: round 1:
measuring the program and 6 candidates (7 compiles) on 8 H100s"); while it runs, a `tqdm` bar
on stderr counts the compiles. The bar shows on a terminal only (`progress=True` shows it
anywhere), and only once a round has run `DELAY` seconds; `progress=False` keeps both quiet.
The line and the bar are worked out from the round's changes and the program's cache: nothing
is compiled to print them.

The candidates of one round are independent (each is the plan so far plus one change), so their
compiles can run in a thread pool (`max_workers`; `variants.Program.measure_many`). The results
keep the round's order, so a plan is the same whatever order the compiles end in. By default
they run one at a time (`WORKERS`): on a 2-core machine under load, a round of 4 candidates of a
4-layer Llama-shaped step on 8 H100s took 69.2 s one at a time and 82.2 s two at a time (16.7 s
and 17.4 s of CPU), with a peak RSS of 0.61 and 0.75 GiB. XLA's compile releases the GIL (a
Python loop in another thread ran at 41% of its own rate during a 25.5 s H100 compile): two at
a time pay where cores are free, not on a machine other jobs keep busy.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Sequence

from jax import tree_util

from donate._profile.variants import Change, Measured, Program
from donate._xla.gpu_targets import SPECS

DELAY = 3.0  # seconds a round runs before its bar shows
WORKERS = 1  # compiles at a time by default (capped by the cores this process may use)


def workers(max_workers: int | None) -> int:
  """The compiles to run at a time: `max_workers`, else `WORKERS`, at most the usable cores."""
  if max_workers is not None:
    if max_workers < 1:
      raise ValueError(f"max_workers must be a positive number of compiles, got {max_workers}")
    return max_workers
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cores = os.cpu_count() or 1
  return max(1, min(WORKERS, cores))


def target(program: Program, platform: str) -> str:
  """Where the program runs, in words ("8 H100s", "1 CPU device"), from its arguments'
  shardings; the platform alone where they have none."""
  for x in tree_util.tree_leaves((program.args, program.kwargs)):
    devices = getattr(getattr(x, "sharding", None), "device_set", None)
    if devices:
      kind = next(iter(devices)).device_kind
      name = next((k.upper() for k, s in SPECS.items() if s.description == kind), None)
      n = len(devices)
      return f"{n} {name}s" if name else f"{n} {platform.upper()} device{'s' * (n != 1)}"
  return platform.upper()


class _Bar:
  """A `tqdm` bar counting compiles on stderr (see the module docstring), safe to advance from
  the pool's threads; `None` when it is off."""

  def __init__(self, total: int | None, desc: str, progress: bool | None):
    self._bar = None
    self._lock = threading.Lock()
    if progress is not False:
      from tqdm import tqdm

      self._bar = tqdm(
        total=total,
        desc=desc,
        unit="compile",
        file=sys.stderr,
        disable=None if progress is None else False,  # None: on a terminal only
        delay=0.0 if progress else DELAY,
        leave=True,  # the round's count and seconds stay on the terminal
        dynamic_ncols=True,
      )

  def done(self) -> None:
    if self._bar is not None:
      with self._lock:
        self._bar.update(1)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


@contextlib.contextmanager
def bar(total: int | None, desc: str, progress: bool | None) -> Iterator[_Bar]:
  """A bar counting `total` compiles (None: unknown), closed on leaving."""
  shown = _Bar(total, desc, progress)
  try:
    yield shown
  finally:
    shown.close()


def say(line: str, progress: bool | None) -> None:
  """`line` on stderr, unless `progress` is False."""
  if progress is not False:
    print(line, file=sys.stderr, flush=True)


def measure(
  program: Program,
  lists: Sequence[Sequence[Change]],
  who: str,
  platform: str,
  progress: bool | None = None,
  max_workers: int | None = None,
) -> list[Measured]:
  """`program.measure_many(lists)`, compiled `max_workers` at a time (`workers`), announced as
  "`who`: measuring [the program and] N candidates (C compiles, W at a time) on T" (the empty
  list of changes is the program; the others are candidates) and counted by a bar. A round
  whose variants are all measured already says nothing."""
  count = program.unmeasured(lists)
  if not count:
    return program.measure_many(lists)
  n = sum(1 for c in lists if tuple(c))
  what = f"{n} candidate{'s' * (n != 1)}"
  if any(not tuple(c) for c in lists) and program.unmeasured([()]):
    what = f"the program and {what}" if n else "the program"
  workers_now = min(workers(max_workers), count)
  at_a_time = f", {workers_now} at a time" if workers_now > 1 else ""
  compiles = f"{count} compile{'s' * (count != 1)}{at_a_time}"
  say(f"{who}: measuring {what} ({compiles}) on {target(program, platform)}", progress)
  with bar(count, who, progress) as shown:
    return program.measure_many(lists, workers_now, shown.done)


@contextlib.contextmanager
def searching(program: Program, what: str, platform: str, progress: bool | None = None):
  """A search of unknown length announced as `what`: yields `measure(changes)`, each a
  compile counted by a bar (one at a time: each size tried depends on the last)."""
  say(f"{what}, on {target(program, platform)}", progress)
  with bar(None, what.partition(":")[0], progress) as shown:
    yield lambda changes: program.measure_many((changes,), 1, shown.done)[0]
