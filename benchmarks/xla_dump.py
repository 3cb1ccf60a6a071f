"""Reads XLA's own buffer assignment from a dump and writes it as a packing problem.

Run a JAX program with ``XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text"`` and XLA writes, per
compiled module, ``*buffer-assignment.txt`` (every logical value, its size, its allocation and its
offset there) and ``*live-range.txt`` (when each value is live, in the module's schedule). This
module turns the values of XLA's temp allocation (the one its heap simulator packs) into the
``lower,upper,size`` rows of the MiniMalloc benchmark format, half-open ``[lower, upper)``, and
keeps XLA's own offsets and allocation size to compare with:

  python benchmarks/xla_dump.py DIR [--module jit_step] [--out prefix]

Two values that XLA placed in overlapping bytes while both were live share memory on purpose (an
in-place update, a loop carry, an alias); they become one buffer covering both, so XLA's own
offsets are a valid packing of the rows written, and its allocation size is a fair figure to beat.
Sizes are written as XLA has them; XLA aligns every offset in the temp allocation (to 64 bytes on
CPU), so a packing to compare with must align its offsets too (`assign_offsets(alignment=...)`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from donate._profile import reading  # noqa: E402
from donate._xla import hlo_dump as _hlo_dump  # noqa: E402  (after the path tweak)


@dataclasses.dataclass(frozen=True, slots=True)
class Packing:
  """XLA's temp allocation as a packing problem, with XLA's answer.

  Attributes:
    module: the dumped module's file prefix.
    sizes, lowers, uppers: one buffer per row, live on ``[lower, upper)``.
    xla_offsets: where XLA put each buffer.
    xla_total: the size of XLA's temp allocation.
    values: how many of XLA's values the buffers stand for.
  """

  module: str
  sizes: tuple[int, ...]
  lowers: tuple[int, ...]
  uppers: tuple[int, ...]
  xla_offsets: tuple[int, ...]
  xla_total: int
  values: int

  def write(self, prefix: Path) -> None:
    """Writes ``prefix.csv`` (``id,lower,upper,size``) and ``prefix.xla.csv`` (``id,offset``)."""
    with open(f"{prefix}.csv", "w", newline="") as f:
      out = csv.writer(f)
      out.writerow(["id", "lower", "upper", "size"])
      out.writerows(zip(range(len(self.sizes)), self.lowers, self.uppers, self.sizes))
    with open(f"{prefix}.xla.csv", "w", newline="") as f:
      out = csv.writer(f)
      out.writerow(["id", "offset"])
      out.writerows(enumerate(self.xla_offsets))


def find_module(folder: Path, module: str | None = None) -> str:
  """The prefix of the dumped module named ``module`` (or the one with most values)."""
  candidates = sorted(folder.glob("*after_optimizations-buffer-assignment.txt"))
  if module is not None:
    candidates = [c for c in candidates if f".{module}." in c.name]
  if not candidates:
    raise FileNotFoundError(f"no buffer assignment for {module or 'any module'} in {folder}")
  best = max(candidates, key=lambda c: c.read_text().count("\n value: "))
  return str(best)[:-len("-buffer-assignment.txt")]


def read(prefix: str) -> Packing:
  """The largest temp allocation of the module dumped at ``prefix``."""
  size, values = _temp_allocation(Path(f"{prefix}-buffer-assignment.txt").read_text())
  ranges = _hlo_dump.parse_live_ranges(Path(f"{prefix}-live-range.txt").read_text())
  rows, missing = [], []
  for name, value_size, offset in values:
    key = name if "{" in name else name + "{}"
    if key not in ranges:
      missing.append(name)
    elif value_size:
      start, end = ranges[key]
      rows.append([offset, offset + value_size, start, end + 1, []])  # XLA's ends: inclusive
  if missing:
    raise ValueError(f"no live range for {len(missing)} values, e.g. {missing[:3]}")
  count, groups = len(rows), reading.merge_overlapping(rows)  # the profile's buffers too
  groups.sort(key=lambda g: (g[2], g[0]))
  return Packing(Path(prefix).name, tuple(g[1] - g[0] for g in groups),
                 tuple(g[2] for g in groups), tuple(g[3] for g in groups),
                 tuple(g[0] for g in groups), size, count)


def _temp_allocation(text: str):
  """(size, [(value name, size, offset)]) of the largest preallocated-temp allocation."""
  temps = [a for a in _hlo_dump.parse_buffer_assignment(text) if "preallocated-temp" in a.kind]
  if not temps:
    raise ValueError("the module has no preallocated temp allocation")
  largest = max(temps, key=lambda a: a.nbytes)
  return largest.nbytes, largest.values


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("folder", type=Path)
  parser.add_argument("--module", help="module name in the dump, e.g. jit_step")
  parser.add_argument("--out", type=Path, help="write PREFIX.csv and PREFIX.xla.csv")
  args = parser.parse_args(argv)
  packing = read(find_module(args.folder, args.module))
  print(f"{packing.module}: {packing.values} values -> {len(packing.sizes)} buffers, "
        f"XLA temp allocation {packing.xla_total} bytes")
  if args.out:
    packing.write(args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
