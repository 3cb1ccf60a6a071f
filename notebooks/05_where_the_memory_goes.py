# %% [markdown]
# # Where the memory goes: a peak-memory profile of any compiled step
#
# Your step runs out of memory, or you want to know how close it is. `compiled.memory_analysis()`
# gives five totals; `donate.memory_profile(f, *args)` reads XLA's own buffer assignment of the
# same program and says what is live at the peak: every buffer with its size, its category
# (parameters, optimizer state, activations, ...), the argument's pytree path, the source line that
# made it and JAX's name stack. Its totals equal `memory_analysis()` byte for byte. A CPU program
# carries its buffer assignment, so nothing is compiled again; a program compiled ahead of time for
# GPUs is compiled once more with XLA's dump.
#
# This notebook profiles a small GPT-style training step on CPU, the same step compiled ahead of
# time for 8 H100s (nothing runs on a GPU), a flax `nnx` step against the same step in plain JAX,
# and a KV-cache decode loop; and it shows a donation that saves its buffer yet leaves the peak
# high.

# %%
import jax

jax.config.update("jax_platforms", "cpu")  # the runtime here; GPU programs are compiled, not run

import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import donate
from donate import targets

# %matplotlib inline
print("jax", jax.__version__)

# %% [markdown]
# ## A GPT-style training step on CPU
#
# Two decoder layers under one `lax.scan`, a momentum optimizer, parameters and momentum donated.

# %%
D, HEADS, FF, VOCAB, LAYERS, SEQ = 128, 4, 512, 512, 2, 64


def init(key):
    shapes = {"wqkv": (LAYERS, D, 3 * D), "wo": (LAYERS, D, D), "w1": (LAYERS, D, FF),
              "w2": (LAYERS, FF, D), "embed": (VOCAB, D)}
    keys = jax.random.split(key, len(shapes))
    return {k: jax.random.normal(s, shape) * 0.02 for s, (k, shape) in zip(keys, shapes.items())}


def block(h, p):
    q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
    q, k, v = (t.reshape(SEQ, HEADS, D // HEADS) for t in (q, k, v))
    scores = jnp.einsum("qhd,khd->hqk", q, k) / (D // HEADS) ** 0.5
    att = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), scores, -1e9))
    h = h + jnp.einsum("hqk,khd->qhd", att, v).reshape(SEQ, D) @ p["wo"]
    return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"], None


def loss(params, tokens):
    layers = {k: v for k, v in params.items() if k != "embed"}
    h, _ = lax.scan(block, params["embed"][tokens], layers)
    logits = h @ params["embed"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, None], -1))


def train_step(params, momentum, tokens):
    grads = jax.grad(loss)(params, tokens)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
    return jax.tree.map(lambda p, m: p - 1e-3 * m, params, momentum), momentum


params = init(jax.random.key(0))
momentum = jax.tree.map(jnp.zeros_like, params)
tokens = jnp.arange(SEQ) % VOCAB

step = jax.jit(train_step, donate_argnums=(0, 1))
profile = donate.memory_profile(step, params, momentum, tokens)
print(profile)

# %% [markdown]
# The text has the peak, the buffers live there (largest first, each with its path or source
# line and scope), the bytes grouped by scope, and what each of XLA's own figures counts. The
# temporaries equal `memory_analysis().temp_size_in_bytes` and the aliased bytes its
# `alias_size_in_bytes`, and at least 95% of the bytes at the peak carry a source line or a path. The same data as a plot: the timeline over XLA's schedule, and the peak by scope.

# %%
profile.plot();

# %% [markdown]
# `by_line()` groups the peak by the line of this notebook that made each buffer (named by its
# cell, `In[N]:line`) and by category, and `advice()` compiles the step with each candidate change
# and reports the peak it measured:

# %%
for line in profile.by_line()[:5]:
    print(line)
remedies = profile.advice()
for item in remedies:
    print(item)

# %% [markdown]
# ## The same step compiled for 8 H100s
#
# With the `gpu-aot` extra (`pip install "jax-donate[gpu-aot]"`), `donate.targets.gpu_mesh`
# gives a mesh of 8 abstract H100s, and the step is compiled for it from `jax.ShapeDtypeStruct`s:
# XLA:GPU's buffer assignment, per device, with the weights sharded 8 ways over their last axis.

# %%
GPU_AOT = targets.available()
if not GPU_AOT:
    print('Without the gpu-aot extra the GPU cell is skipped; to run it: '
          'pip install "jax-donate[gpu-aot]"')
else:
    mesh = targets.gpu_mesh("h100", 8, ("tp",))

    def spec(a):
        last = P(*([None] * (a.ndim - 1) + ["tp"]))
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, last))

    gpu_args = (jax.tree.map(spec, params), jax.tree.map(spec, momentum),
                jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=NamedSharding(mesh, P())))
    on_h100 = donate.memory_profile(step, *gpu_args)
    print(on_h100.fits("h100"))
    print(f"per device: peak {on_h100.peak_bytes} B on an H100, {profile.peak_bytes} B on this CPU")
    for g in on_h100.by_scope()[:5]:
        print(" ", g)

# %% [markdown]
# On the GPU target the profile is per device: each H100 holds an eighth of every weight, so its
# arguments are smaller than the CPU program's; `fits("h100")` compares what XLA
# allocates with what JAX's allocator gives a program on an H100: 75% of its memory by default
# (`XLA_CLIENT_MEM_FRACTION` sets another share).
#
# ## flax nnx against plain JAX: `compare`
#
# The same two-layer MLP step, once as a flax `nnx` module (split into its state, merged inside
# the jitted step) and once as plain functions of a dict. `compare` lines the two peaks up by source
# line and by scope and says what grew.

# %%
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(256, 1024, rngs=rngs)
        self.l2 = nnx.Linear(1024, 256, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))


graphdef, state = nnx.split(MLP(nnx.Rngs(0)))
x = jnp.ones((64, 256))


def nnx_step(state, x):
    def loss_fn(model):
        return jnp.mean(model(x) ** 2)
    model = nnx.merge(graphdef, state)
    grads = nnx.grad(loss_fn)(model)
    return jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model), grads)


plain_params = jax.tree.map(lambda a: a, {"w1": state["l1"]["kernel"][...],
                                          "b1": state["l1"]["bias"][...],
                                          "w2": state["l2"]["kernel"][...],
                                          "b2": state["l2"]["bias"][...]})


def plain_step(p, x):
    def loss_fn(p):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"]) ** 2)
    return jax.tree.map(lambda w, g: w - 0.1 * g, p, jax.grad(loss_fn)(p))


nnx_step.__name__ = plain_step.__name__ = "mlp_step"  # one scope name: the scopes line up
plain_profile = donate.memory_profile(jax.jit(plain_step, donate_argnums=0), plain_params, x)
nnx_profile = donate.memory_profile(jax.jit(nnx_step, donate_argnums=0), state, x)
comparison = plain_profile.compare(nnx_profile)
print(comparison)

# %% [markdown]
# The first line is the two peaks and their difference; the rows below it are the
# source lines and scopes whose bytes at the peak changed, largest change first, as printed.
#
# ## A KV-cache decode loop
#
# A decode loop writes one position of the cache per step. Without donation the cache is an
# argument and an output at once; `could_donate` names the input an output could reuse, with the
# keyword to write and the bytes it saves at the peak.

# %%
CACHE = (8, 1024, 128)  # layers, positions, features


def decode(cache, w, h):
    def one(i, carry):
        cache, h = carry
        h = jnp.tanh(h @ w)
        return cache.at[:, i].set(jnp.broadcast_to(h, (CACHE[0], CACHE[2]))), h
    return lax.fori_loop(0, 16, one, (cache, h))


cache, w, h = jnp.zeros(CACHE), jnp.eye(CACHE[2]) * 0.5, jnp.ones(CACHE[2])
before = donate.memory_profile(jax.jit(decode), cache, w, h)
advice = before.could_donate
for s in advice:
    print(s)
after = donate.memory_profile(jax.jit(decode, donate_argnums=0), cache, w, h)
print(before.compare(after))

# %% [markdown]
# The advice names the cache and `donate_argnums=0`; compiling with it lowers the peak by exactly
# the bytes it claimed.
#
# ## A donation that leaves the peak high
#
# The pattern of openxla/xla #45912: `x` is donated, `y = jnp.exp(x)`, a loop reads `y`, and the
# output is `y + s`. XLA makes the alias, so the plan says "aliased". `plan()` reads the memory
# profile and measures what the donation saved by compiling the program once more without it: the
# note says so. But on some XLA versions a temporary of `x`'s size for `exp` is live beside the
# donated buffer at the peak; the plan then says so next to the leaf, and `strict="copies"` raises
# on it before anything is consumed.

# %%
def f(x):
    y = jnp.exp(x)
    s = lax.fori_loop(0, 3, lambda i, s: s + y[i], 0.0)
    return y + s


x = jnp.ones(1 << 20)  # 4 MiB
plan = donate.jit(f, donate_argnums=0).plan(x)
temporary = [e for e in plan.profile.at_peak if e.kind == "temporary" and e.nbytes == x.nbytes]
print(plan)
print("the temporary at the peak:", [(e.nbytes, e.scope) for e in temporary] or "none on this jaxlib")

# %% [markdown]
# The donation saves `x`'s 4 MiB at the peak on every jaxlib: without it the
# output needs a buffer of its own. On jaxlib 0.10 XLA still keeps a 4 MiB temporary for `exp`
# beside the donated buffer, twice the working set, and the plan's reason for `x` names it with its
# line and the peak; on jaxlib 0.12 XLA no longer adds it and the plan says nothing more.
# `plan.profile` is the full profile.
