"""The memory doctor on MaxText (issue 28): `python -m donate.profile` on MaxText's train step
(dense, MoE, gradient accumulation) and its serving steps (prefill, insert, generate through
`MaxEngine`), a tiny model on CPU; what building the profiles costs against the compile.

MaxText needs Python >= 3.12 and its own environment. `pip install maxtext` (0.2.5) declares no
requirements of its own (only extras: `cuda12`, `tpu`, 262 pinned packages); its train step
imports these, installed with JAX held at one version and this checkout editable:

  python3.12 -m venv V
  V/bin/pip install maxtext==0.2.5 jax==0.12.0.1 flax optax orbax-checkpoint
  V/bin/pip install jax==0.12.0.1 pathwaysutils omegaconf jinja2 aqtp qwix tokamax \
      huggingface-hub transformers grain drjax pillow tiktoken sentencepiece sympy ml-collections
  V/bin/pip install --no-deps -e .

(`aqtp`, not `aqt`: that name on PyPI is another project. No TensorFlow: the runs use
`dataset_type=synthetic`.) For each configuration, one run with XLA's dump as the command line
sets it (the compiles, and the profiles of every dumped program, timed) and one run without it
(the plain compiles); the table goes to stdout, each run's summary (`python -m donate.profile`'s)
to stderr:

  python benchmarks/bench_maxtext_profile.py --python V/bin/python [--configs dense,moe,gacc,serve]

With `--advice`: the dense train step profiled by `donate.memory_profile` instead (the step's
first call recorded through a wrapped `jax.jit`), its `advice()`, a plan to fit 3/4 of its peak
(`fit`) and the largest batch within twice its peak (`largest_batch`, on the data argument), each
timed on a profile of its own (nothing measured before it), with its compiles and the load.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

TINY = (
  "dataset_type=synthetic enable_checkpointing=false enable_tensorboard=false steps=3 "
  "per_device_batch_size=1 max_target_length=64 base_num_decoder_layers=2 base_emb_dim=64 "
  "base_mlp_dim=128 base_num_query_heads=4 base_num_kv_heads=4 head_dim=16 vocab_size=256 "
  "attention=dot_product hardware=cpu skip_jax_distributed_system=true log_period=1"
).split()
CONFIGS = {
  "dense": [],
  "moe": (
    "decoder_block=mixtral num_experts=4 num_experts_per_tok=2 sparse_matmul=false "
    "megablox=false capacity_factor=-1 base_moe_mlp_dim=128"
  ).split(),
  "gacc": ["per_device_batch_size=2", "gradient_accumulation_steps=2"],
  "serve": "max_prefill_predict_length=16 max_target_length=32 scan_layers=false".split(),
}
TRAIN = "maxtext.trainers.pre_train.train"


def serve(argv: list[str]) -> None:
  """MaxText's serving steps without JetStream's server: prefill, insert, three generate steps."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from maxtext.configs import pyconfig  # noqa: PLC0415
  from maxtext.inference.maxengine import maxengine  # noqa: PLC0415

  tokens_type = maxengine.engine_api.ResultTokens  # JetStream's is a pytree; MaxText's stub not
  jax.tree_util.register_pytree_node(
    tokens_type,
    lambda r: ((r.data, r.log_prob), (r.tokens_idx, r.valid_idx, r.length_idx, r.samples_per_slot)),
    lambda aux, ch: tokens_type(
      data=ch[0],
      log_prob=ch[1],
      tokens_idx=aux[0],
      valid_idx=aux[1],
      length_idx=aux[2],
      samples_per_slot=aux[3],
    ),
  )
  config = pyconfig.initialize(argv)
  engine = maxengine.MaxEngine(config)
  rng = jax.random.PRNGKey(0)
  params = engine.load_params(rng=rng)
  state = engine.init_decode_state(rng=rng)
  n = config.max_prefill_predict_length
  prefix, _ = engine.prefill(
    params=params, padded_tokens=np.arange(1, n + 1, dtype=np.int32), true_length=n - 4, rng=rng
  )
  state = engine.insert(prefix, state, slot=0)
  for _ in range(3):
    state, _ = engine.generate(params, state, rng=rng)


def _recording(jax, recorded: dict):
  """`jax.jit` that records the train step's first call (its arguments' shapes and shardings)."""
  real = jax.jit

  def spec(x):
    return (
      jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if hasattr(x, "sharding") else x
    )

  class Recorder:
    def __init__(self, jitted):
      self._jitted = jitted

    def __call__(self, *args, **kwargs):
      recorded.setdefault("step", (self._jitted, jax.tree.map(spec, (args, kwargs))))
      return self._jitted(*args, **kwargs)

    def __getattr__(self, k):
      return getattr(self._jitted, k)

  def jit(fun=None, *a, **kw):
    if fun is None:
      return lambda f: jit(f, *a, **kw)
    jitted = real(fun, *a, **kw)
    return Recorder(jitted) if getattr(fun, "__name__", "") == "train_step" else jitted

  return jit


def advice_child(out: str) -> None:
  """The dense train step profiled with `donate.memory_profile` (its first call's arguments,
  recorded), then `advice()`, `fit()` and `largest_batch()`, each on a fresh profile, timed."""
  import jax  # noqa: PLC0415

  import donate  # noqa: PLC0415
  from donate._profile import script  # noqa: PLC0415

  jax.config.update("jax_enable_compilation_cache", False)
  recorded: dict = {}
  real, jax.jit = jax.jit, _recording(jax, recorded)
  import maxtext  # noqa: PLC0415

  base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
  folder = tempfile.mkdtemp(prefix="bench-maxtext-")
  argv = [TRAIN, base, *TINY, "run_name=advice", f"base_output_directory={folder}/out"]
  assert script.run(None, TRAIN, argv) == 0
  jax.jit = real
  jitted, (args, kwargs) = recorded["step"]
  data = next(n for n, a in enumerate(args) if isinstance(a, dict) and "inputs" in a)
  rows: list = []

  def timed(name, call):
    load = os.getloadavg()[0]
    start = time.perf_counter()
    profile = donate.memory_profile(jitted, *args, **kwargs)
    built = time.perf_counter() - start
    if call is None:
      rows.append((name, 1, built, load, f"peak {profile.peak_bytes / 2**20:.2f} MiB"))
      return profile
    before = profile.program.compiles
    start = time.perf_counter()
    result = call(profile)
    seconds = time.perf_counter() - start
    text = "\n".join(str(r) for r in result) if isinstance(result, (list, tuple)) else str(result)
    rows.append((name, profile.program.compiles - before, seconds, load, text))
    return profile

  profile = timed("memory_profile", None)
  timed("advice()", lambda p: p.advice())
  timed("fit(3/4 of the peak)", lambda p: p.fit(p.peak_bytes * 3 // 4))
  timed("largest_batch(2x the peak)", lambda p: p.largest_batch(p.peak_bytes * 2, argnum=data))
  row = {
    "jax": jax.__version__,
    "maxtext": importlib.metadata.version("maxtext"),
    "peak": profile.peak_bytes,
    "could_donate": [s.path for s in profile.could_donate],
    "rows": rows,
  }
  with open(out, "w") as fh:
    json.dump(row, fh)


def child(name: str, dump: bool, out: str) -> None:
  """One run of configuration `name` in this process (MaxText's environment)."""
  import jax  # noqa: PLC0415

  from donate._profile import report, script  # noqa: PLC0415

  folder = tempfile.mkdtemp(prefix="bench-maxtext-")
  if dump:
    script.dump_everything(folder)
  else:
    jax.config.update("jax_enable_compilation_cache", False)
  compiles: list[float] = []
  jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(seconds) if "backend_compile" in event else None
  )
  import maxtext  # noqa: PLC0415

  base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
  argv = [
    TRAIN,
    base,
    *TINY,
    f"run_name={name}",
    f"base_output_directory={folder}/out",
    *CONFIGS[name],
  ]
  if name == "serve":
    serve(argv)
  else:
    assert script.run(None, TRAIN, argv) == 0
  row = {"compile_s": max(compiles), "compiles_s": sum(compiles)}
  if dump:
    start = time.perf_counter()
    found = script.profiles(folder)
    row["build_s"] = time.perf_counter() - start
    row["programs"] = [
      (p.function, p.peak_bytes, [(g.key, g.total_bytes) for g in p.by_category()[:3]])
      for p in found
    ]
    row["summary"] = report.summary(found)
  with open(out, "w") as fh:
    json.dump(row, fh)


def _run(cmd: list[str], env: dict) -> None:
  """Runs a child; its stderr's end on failure (MaxText's log says what is missing)."""
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
  if done.returncode:
    sys.stderr.write(done.stderr[-4000:])
    raise subprocess.CalledProcessError(done.returncode, cmd)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--python", default=sys.executable)
  ap.add_argument("--configs", default="dense,moe,gacc,serve")
  ap.add_argument("--child", nargs=3, metavar=("NAME", "DUMP", "OUT"))
  ap.add_argument("--advice", action="store_true", help="the dense step's advice() instead")
  args = ap.parse_args(argv)
  if args.child:
    if args.child[0] == "advice":
      advice_child(args.child[2])
    else:
      child(args.child[0], args.child[1] == "1", args.child[2])
    return 0
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  if args.advice:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
      _run([args.python, __file__, "--child", "advice", "0", out.name], env)
      row = json.load(open(out.name))
    print(
      f"dense train_step, jax {row['jax']}, maxtext {row['maxtext']}, 1 CPU device: peak"
      f" {row['peak']} B, could_donate {row['could_donate']}"
    )
    print("| call | compiles | seconds | load average | result |\n|---|---|---|---|---|")
    for name, compiles, seconds, load, text in row["rows"]:
      first, *rest = text.splitlines()
      print(f"| {name} | {compiles} | {seconds:.1f} | {load:.2f} | {first} |")
      for line in rest:
        print("    " + line)
    return 0
  print(
    "| config | step | peak | top categories at the peak | largest compile s (dump / "
    "plain) | every compile s (dump / plain) | every profile s | / every compile (plain) |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for name in args.configs.split(","):
    rows = []
    for dump in ("1", "0"):
      with tempfile.NamedTemporaryFile(suffix=".json") as out:
        _run([args.python, __file__, "--child", name, dump, out.name], env)
        rows.append(json.load(open(out.name)))
    dumped, plain = rows
    steps = [p for p in dumped["programs"] if p[0] in ("train_step", "_generate_jit")]
    program, peak, top = max(steps or dumped["programs"], key=lambda p: p[1])
    cats = ", ".join(f"{k} {b / 2**10:.1f} KiB" for k, b in top)
    print(
      f"| {name} | {program} | {peak / 2**20:.2f} MiB | {cats} "
      f"| {dumped['compile_s']:.2f} / {plain['compile_s']:.2f} "
      f"| {dumped['compiles_s']:.2f} / {plain['compiles_s']:.2f} | {dumped['build_s']:.3f} "
      f"| {100 * dumped['build_s'] / plain['compiles_s']:.1f}% |"
    )
    print(dumped["summary"], file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
