"""The memory doctor on MaxText (issue 28): `python -m donate.profile` on MaxText's train step
(dense, MoE, gradient accumulation) and its serving steps (prefill, insert, generate through
`MaxEngine`), a tiny model on CPU; what building the profiles costs against the compile.

MaxText needs Python >= 3.12; it runs in its own environment with this checkout installed
editable (`python3.12 -m venv V; V/bin/pip install maxtext jax==0.12.* flax optax
orbax-checkpoint ...; V/bin/pip install --no-deps -e .`). For each configuration, one run with
XLA's dump as the command line sets it (the compiles, and the profiles of every dumped program,
timed) and one run without it (the plain compiles); the table goes to stdout, each run's summary
(`python -m donate.profile`'s) to stderr:

  python benchmarks/bench_maxtext_profile.py --python V/bin/python [--configs dense,moe,gacc,serve]

With `--advice`: the dense train step profiled by `donate.memory_profile` instead (the step's
first call recorded through a wrapped `jax.jit`), its `advice()`, a plan to fit 3/4 of its peak
(`fit`) and the largest batch within twice its peak (`largest_batch`), each timed.
"""

from __future__ import annotations

import argparse
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
  recorded) and its `advice()`, timed."""
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
  start = time.perf_counter()
  profile = donate.memory_profile(jitted, *args, **kwargs)
  built = time.perf_counter() - start
  items = profile.advice()
  row = {
    "peak": profile.peak_bytes,
    "build_s": built,
    "advice_s": time.perf_counter() - start - built,
    "could_donate": [s.path for s in profile.could_donate],
    "advice": [str(a) for a in items],
  }
  # The cost of a plan to fit 3/4 of the peak and of the largest batch within twice the peak,
  # on a fresh profile (nothing measured yet), the batch searched on the data's argument.
  fresh = donate.memory_profile(jitted, *args, **kwargs)
  start = time.perf_counter()
  plan = fresh.fit(fresh.peak_bytes * 3 // 4)
  row["fit"] = (plan.compiles, time.perf_counter() - start, str(plan))
  data = next(n for n, a in enumerate(args) if isinstance(a, dict) and "inputs" in a)
  start = time.perf_counter()
  found = fresh.largest_batch(fresh.peak_bytes * 2, argnum=data)
  row["largest_batch"] = (found.compiles, time.perf_counter() - start, str(found))
  with open(out, "w") as fh:
    json.dump(row, fh)


def child(name: str, dump: bool, out: str) -> None:
  """One run of configuration `name` in this process (MaxText's environment)."""
  import jax  # noqa: PLC0415

  from donate._profile import script  # noqa: PLC0415

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
    row["summary"] = script.summary(found)
  with open(out, "w") as fh:
    json.dump(row, fh)


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
      subprocess.run(
        [args.python, __file__, "--child", "advice", "0", out.name],
        env=env,
        check=True,
        capture_output=True,
        timeout=900,
      )
      row = json.load(open(out.name))
    print(
      f"dense train_step by donate.memory_profile: peak {row['peak']} B, lower + compile + "
      f"profile {row['build_s']:.2f} s, advice() {row['advice_s']:.2f} s, could_donate "
      f"{row['could_donate']}"
    )
    for line in row["advice"]:
      print("  " + line)
    for name in ("fit", "largest_batch"):
      compiles, seconds, text = row[name]
      print(f"{name}: {compiles} compiles, {seconds:.1f} s (load average {os.getloadavg()[0]:.2f})")
      print("  " + text.replace("\n", "\n  "))
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
        subprocess.run(
          [args.python, __file__, "--child", name, dump, out.name],
          env=env,
          check=True,
          capture_output=True,
          timeout=900,
        )
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
