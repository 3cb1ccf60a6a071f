"""Maintainer tool, never run in CI: a haliax training step through the global patch.

Haliax's `named_jit(fn, donate_args=...)` splits its arguments into donated and kept pytrees and
calls `jax.jit(..., donate_argnums=0, static_argnums=2)` itself. This runs an Adam step of a
named-axis MLP that returns its gradients before the new parameters and optimizer state
(`donate_args=(True, True, False)`), on 8 CPU devices with the batch sharded, four steps, once
plain and once with `jax.jit = donate.jit` set before haliax is imported, each in its own
process; then compares the losses and the final gradients, parameters and optimizer state
bitwise, how many of the state's arrays the steps consumed, and the step's compiled peak per
device (`memory_analysis()`).

Usage (an environment with donate, haliax and its dependencies, optax):
  python scripts/haliax_step.py
"""

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def run(mode: str, out: str) -> None:
  import jax

  if mode == "patched":
    import donate

    jax.jit = donate.jit
  import equinox as eqx
  import haliax as hax
  import numpy as np
  import optax
  from haliax.partitioning import ResourceAxis
  from jax.sharding import Mesh

  batch, embed, hidden = hax.Axis("batch", 64), hax.Axis("embed", 256), hax.Axis("hidden", 512)
  mesh = Mesh(np.array(jax.devices()).reshape(8, 1), (ResourceAxis.DATA, ResourceAxis.MODEL))
  opt = optax.adam(1e-3)
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)

  class MLP(eqx.Module):
    w1: hax.NamedArray
    w2: hax.NamedArray

    def __call__(self, x):
      return hax.dot(hax.nn.relu(hax.dot(x, self.w1, axis=embed)), self.w2, axis=hidden)

  def init():
    w1 = hax.random.normal(k1, (embed, hidden)) * 0.05
    model = MLP(w1, hax.random.normal(k2, (hidden, embed)) * 0.05)
    return model, opt.init(eqx.filter(model, eqx.is_array))

  def step(model, opt_state, x):
    loss, grads = eqx.filter_value_and_grad(lambda m: hax.mean((m(x) - x) ** 2).scalar())(model)
    updates, opt_state = opt.update(grads, opt_state, model)
    return loss, grads, eqx.apply_updates(model, updates), opt_state  # gradients first

  mapping = {"batch": ResourceAxis.DATA, "hidden": ResourceAxis.MODEL}
  with hax.axis_mapping(mapping), mesh:  # (`with mesh:`, as haliax's own tests set it)
    model, opt_state = hax.named_jit(init)()
    train = hax.named_jit(step, donate_args=(True, True, False))
    x = hax.random.normal(k3, (batch, embed))
    losses = []
    for _ in range(4):
      state = jax.tree.leaves((model, opt_state))  # what this step is given (the last one counts)
      loss, grads, model, opt_state = train(model, opt_state, x)
      losses.append(float(loss))
    consumed = sum(a.is_deleted() for a in state)
    m = train.lower(model, opt_state, x).compile().memory_analysis()
    peak = (
      m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
      + m.temp_size_in_bytes
    )  # fmt: skip
    leaves = [np.asarray(a) for a in jax.tree.leaves((grads, model, opt_state))]
    np.savez(out, *leaves, losses=np.array(losses), consumed=consumed, state=len(state), peak=peak)


def main() -> None:
  import numpy as np

  with tempfile.TemporaryDirectory() as tmp:
    found = {}
    for mode in ("plain", "patched"):
      out = os.path.join(tmp, mode + ".npz")
      subprocess.run([sys.executable, __file__, mode, out], check=True, timeout=600)
      found[mode] = dict(np.load(out))
  plain, patched = found["plain"], found["patched"]
  same = all(np.array_equal(plain[k], patched[k]) for k in plain if k != "peak")
  print(f"losses {plain['losses'].tolist()}")
  print(f"bitwise equal (losses, gradients, parameters, optimizer state): {same}")
  for mode, f in found.items():
    print(
      f"{mode:8s} consumed {int(f['consumed'])} of {int(f['state'])}, peak {int(f['peak']):,} B"
    )
  sys.exit(0 if same and patched["peak"] <= plain["peak"] else 1)


if __name__ == "__main__":
  if len(sys.argv) == 3:
    run(*sys.argv[1:])
  else:
    main()
