"""Builds the corpus of real XLA packing problems in ``benchmarks/corpus``.

Each program below (training and inference steps of different shapes) is compiled by XLA in a
fresh process with ``XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text"``; `xla_dump` turns the
temp allocation of the dumped module into ``NAME.PLATFORM.csv`` (``id,lower,upper,size``, the
MiniMalloc format) and ``NAME.PLATFORM.xla.csv`` (XLA's own offsets), and ``index.csv`` gets XLA's
allocation size. Nothing is executed; compiling is enough for XLA to assign buffers.

Platforms: ``cpu`` (8 virtual CPU devices) and ``h100``: a real H100 executable compiled without a
GPU, from a target description of the H100 SXM (``--target``, by default
``../shared/gpu-targets/h100.txtpb`` beside the repository) on an abstract 1x1x8 topology. That
needs ``jax-cuda12-plugin`` and ``jax-cuda12-pjrt`` at the installed jaxlib's version in the
interpreter given by ``--gpu-python`` (they are not test dependencies). To regenerate:

  python -m venv /tmp/venv-gpu
  /tmp/venv-gpu/bin/pip install jax==0.10.2 jaxlib==0.10.2 jax-cuda12-plugin==0.10.2 \\
      jax-cuda12-pjrt==0.10.2
  python benchmarks/xla_corpus.py --gpu-python /tmp/venv-gpu/bin/python

``--programs`` and ``--platforms`` pick a subset; ``--worker`` is the per-process entry point.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import xla_dump  # noqa: E402  (after the path tweak)

CORPUS = HERE / "corpus"
ALIGNMENT = {"cpu": 64, "h100": 256}  # offsets in XLA's temp allocation are multiples of this
DESCRIPTIONS = {
    "mlp": "MLP training step, 4 x 2048 wide, batch 512, Adam",
    "cnn": "CNN training step, 2 conv + 2 dense, 64 images 32x32, momentum",
    "resnet": "ResNet-style training step, 6 residual blocks of 64 channels, 32 images 32x32",
    "gpt2": "GPT-2-small-sized training step: 12 layers, d 768, 12 heads, 256 tokens x 4, Adam",
    "scan": "training step through a 64-layer residual stack run by lax.scan",
    "decode": "decode step of a 12-layer d-768 transformer with a donated 1024-token KV cache",
    "prefill": "inference over a 512-token prompt, 6 layers, d 1024, filling a KV cache",
    "dp_tp": "shard_map training step, 2-way data x 4-way tensor parallel MLP on 8 devices",
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--programs", nargs="*", default=list(DESCRIPTIONS))
  parser.add_argument("--platforms", nargs="*", default=["cpu", "h100"])
  parser.add_argument("--gpu-python", default=sys.executable)
  parser.add_argument("--target", type=Path,
                      default=HERE.parents[1] / "shared" / "gpu-targets" / "h100.txtpb")
  parser.add_argument("--worker", nargs=3, metavar=("PROGRAM", "PLATFORM", "TARGET"))
  args = parser.parse_args(argv)
  if args.worker:
    from benchmarks import xla_programs  # imports jax: only in the worker process
    xla_programs.compile_program(*args.worker)
    return 0
  CORPUS.mkdir(exist_ok=True)
  index = _read_index()
  for platform in args.platforms:
    python = sys.executable if platform == "cpu" else args.gpu_python
    for name in args.programs:
      index[(name, platform)] = _build(name, platform, python, args.target)
      print(f"{name}.{platform}: {index[(name, platform)]}", flush=True)
  _write_index(index)
  return 0


def _build(name: str, platform: str, python: str, target: Path) -> dict:
  """Compiles one program in a fresh process with dumping on, and converts the dump."""
  with tempfile.TemporaryDirectory() as dump:
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
               "--xla_dump_hlo_module_re=jit_step")
    subprocess.run([python, str(Path(__file__).resolve()), "--worker", name, platform,
                    str(target)], env=env, check=True, cwd=HERE.parent)
    packing = xla_dump.read(xla_dump.find_module(Path(dump), "jit_step"))
  bad = [o for o in packing.xla_offsets if o % ALIGNMENT[platform]]
  assert not bad, f"{name}.{platform}: XLA offsets {bad[:3]} not multiples of {ALIGNMENT[platform]}"
  packing.write(CORPUS / f"{name}.{platform}")
  return {"values": packing.values, "buffers": len(packing.sizes),
          "xla_total": packing.xla_total, "alignment": ALIGNMENT[platform],
          "description": DESCRIPTIONS[name]}


def _read_index() -> dict:
  path = CORPUS / "index.csv"
  if not path.exists():
    return {}
  with path.open() as f:
    return {(r.pop("program"), r.pop("platform")): r for r in csv.DictReader(f)}


def _write_index(index: dict) -> None:
  fields = ["program", "platform", "values", "buffers", "xla_total", "alignment", "description"]
  with (CORPUS / "index.csv").open("w", newline="") as f:
    out = csv.DictWriter(f, fieldnames=fields)
    out.writeheader()
    for (name, platform), row in sorted(index.items(), key=lambda kv: (kv[0][1], kv[0][0])):
      out.writerow({"program": name, "platform": platform, **row})


if __name__ == "__main__":
  sys.exit(main())
