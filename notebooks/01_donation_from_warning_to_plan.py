# %% [markdown]
# # Donation, from warning to plan
#
# A training step replaces big arrays (parameters, optimizer state) with new ones of the same shape.
# Without donation the step holds the old and the new copy at once. `jax.jit(donate_argnums=...)`
# lets XLA reuse the old buffers, but when it cannot it says little, and when it can it decides
# alone which output takes which input.
#
# This notebook takes one step function from JAX's bare warning to `donate.jit`'s per-leaf plan, then
# looks at four things the plan makes visible or safe:
#
# 1. the plan itself, one row per input leaf;
# 2. the *swapped update*, where `jax.jit` pairs outputs with the wrong inputs and pays for it in memory and time;
# 3. strict mode, which raises instead of warning and consumes nothing;
# 4. the use-after-donation error, which names the line that donated and the line that read.
#
# Everything runs on CPU; every figure below is printed by the cell above it, and the cells check the
# facts the text states.

# %%
import re
import statistics
import time
import warnings

import jax
import jax.numpy as jnp

import donate

print("jax", jax.__version__, "| backend", jax.default_backend(), "| donate", donate.__version__)


# %% [markdown]
# ## A step function and JAX's warning
#
# A linear model trained with SGD and momentum. The step takes the parameters, the optimizer state and a
# batch, and returns new parameters, new optimizer state and the loss. "Donate everything" is a common
# first attempt: `donate_argnums=(0, 1, 2)`.

# %%
def init(key, d_in=256, d_out=16, batch=128):
    kw, kx, ky = jax.random.split(key, 3)
    params = {"w": jax.random.normal(kw, (d_in, d_out)) / jnp.sqrt(d_in), "b": jnp.zeros(d_out)}
    opt_state = {"momentum": jax.tree.map(jnp.zeros_like, params),
                 "count": jnp.zeros((), jnp.int32)}
    batch = (jax.random.normal(kx, (batch, d_in)), jax.random.normal(ky, (batch, d_out)))
    return params, opt_state, batch


def step(params, opt_state, batch):
    x, y = batch
    loss, grads = jax.value_and_grad(
        lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2))(params)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, opt_state["momentum"], grads)
    params = jax.tree.map(lambda p, m: p - 0.1 * m, params, momentum)
    return params, {"momentum": momentum, "count": opt_state["count"] + 1}, loss


params, opt_state, batch = init(jax.random.key(0))
jax_step = jax.jit(step, donate_argnums=(0, 1, 2))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    params, opt_state, loss = jax_step(params, opt_state, batch)
for w in caught:
    print(f"{w.category.__name__}: {w.message}")

# %% [markdown]
# Besides a link to the FAQ, that is the whole message. It names two avals, not the leaves they came
# from, says nothing about why no output could take them, and gives no way to make it an error.
#
# ## The same step under `donate.jit`
#
# `donate.jit` is a drop-in for `jax.jit`. `g.plan(...)` traces, plans and compiles for these arguments,
# and runs and consumes nothing. In a notebook the plan renders as a table: one row per input leaf, with
# its pytree path, whether donation was requested, what was done (`aliased`, `donor`, `unused`, `kept`,
# `unusable`), which output reuses the buffer, and why.

# %%
params, opt_state, batch = init(jax.random.key(0))
g = donate.jit(step, donate_argnums=(0, 1, 2))
with warnings.catch_warnings(record=True) as plan_warnings:  # shown in the next cell
    warnings.simplefilter("always")
    plan = g.plan(params, opt_state, batch)
plan

# %% [markdown]
# The five parameter and optimizer leaves are aliased, each to the output computed from it; the two batch
# leaves are `unusable`, and the reason names the nearest output and what differs. Of the 168.1 KiB
# requested, 32.1 KiB are really reused; the footer adds the compiled program's own memory figures.
#
# Compiling for new shapes (here, the `plan` call) warns once with the same per-leaf explanation, a
# `donate.UnusableDonationWarning` in place of JAX's bare one:

# %%
for w in plan_warnings:
    print(f"{w.category.__name__}: {w.message}")

# %% [markdown]
# Calling `g` runs the plan. The donation is physical: the old parameter buffers are deleted and the new
# parameters live at their addresses, while the unusable batch stays alive (as with `jax.jit`). The call
# reuses the compiled program, so it does not warn again.

# %%
old_w_pointer = params["w"].unsafe_buffer_pointer()
with warnings.catch_warnings():
    warnings.simplefilter("error")  # no second warning for the same signature
    new_params, new_opt_state, loss = g(params, opt_state, batch)
print("params['w'] deleted:", params["w"].is_deleted())
print("new params['w'] at the old address:", new_params["w"].unsafe_buffer_pointer() == old_w_pointer)
print("batch alive:", not any(x.is_deleted() for x in batch))


# %% [markdown]
# ## The swapped update
#
# `f(a, b) = (b.at[0].set(1.0), a + 1.0)`: output 0 is `b` updated in place, output 1 is computed from `a`.
# `jax.jit` pairs outputs with donated inputs first come, first served, so output 0 gets `a`'s buffer and
# output 1 gets `b`'s. The in-place update becomes a full copy, and the program needs temporaries.
# `donate.jit` pairs by dataflow: `b -> out[0]` (an in-place update), `a -> out[1]` (an elementwise update).
#
# Two float32 arrays of 2**22 elements (16 MiB each) keep this quick; the effect scales with size.

# %%
def swapped(a, b):
    return b.at[0].set(1.0), a + 1.0


n = 2**22
make = lambda: (jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.float32))
variants = {
    "donate.jit(donate_argnums=(0, 1))": donate.jit(swapped, donate_argnums=(0, 1)),
    "jax.jit(donate_argnums=(0, 1))": jax.jit(swapped, donate_argnums=(0, 1)),
    "jax.jit (no donation)": jax.jit(swapped),
}
swap_plan = variants["donate.jit(donate_argnums=(0, 1))"].plan(*make())
swap_plan


# %%
def input_output_alias(compiled_text, names=("a", "b")):
    # The HLO module header: input_output_alias={ {0}: (0, {}, may-alias), ... } = {output: (param, ...)}
    section = re.search(r"input_output_alias=\{(.*?) \}", compiled_text).group(1)
    return {f"out[{o}]": names[int(p)] for o, p in re.findall(r"\{(\d+)\}: \((\d+),", section)}


def median_step_ms(fn, steps=20):
    state = make()
    state = fn(*state)[::-1]  # feed (out[1], out[0]) back as (a, b): donation consumes the inputs
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state = fn(*state)[::-1]
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


MiB = 2**20
rows = {}
for name, fn in variants.items():
    m = fn.lower(*make()).compile().memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    rows[name] = (m.temp_size_in_bytes, peak, median_step_ms(fn))
    print(f"{name:36s} temporaries {m.temp_size_in_bytes / MiB:5.1f} MiB   "
          f"peak {peak / MiB:5.1f} MiB   step {rows[name][2]:6.2f} ms")
jax_text = variants["jax.jit(donate_argnums=(0, 1))"].lower(*make()).compile().as_text()
print("\njax.jit pairs (first come, first served):", input_output_alias(jax_text))
print("donate.jit pairs (by dataflow):           ", swap_plan.aliases)

# %% [markdown]
# `jax.jit` with both inputs donated needs 32 MiB of temporaries, and its peak (64 MiB) is no better than
# not donating at all; its step is no faster than the undonated one, and many times slower than
# `donate.jit`'s. `donate.jit` needs no temporaries and peaks at 32 MiB, the two arrays: the update of
# `b` really is in place, one element written instead of 16 MiB copied. The memory figures are the
# compiled programs' own `memory_analysis()`; the step times above are medians of 20 steps on this
# shared machine and vary from run to run.
#
# ## Strict mode
#
# With `strict=True`, a requested donation that cannot be used is a `donate.DonationError`, raised after
# planning and before anything runs, so every input is still alive.

# %%
params, opt_state, batch = init(jax.random.key(0))
strict_step = donate.jit(step, donate_argnums=(0, 1, 2), strict=True)
try:
    strict_step(params, opt_state, batch)
except donate.DonationError as e:
    print(type(e).__name__ + ":", e)
leaves = jax.tree.leaves((params, opt_state, batch))
print("\nall", len(leaves), "inputs alive:", not any(x.is_deleted() for x in leaves))

# %% [markdown]
# The fix the message suggests, donating only what an output can reuse, passes strict mode. Training a few
# steps shows the loss going down, with every parameter and optimizer buffer reused in place:

# %%
strict_step = donate.jit(step, donate_argnums=(0, 1), strict=True)
losses = []
for _ in range(5):
    params, opt_state, loss = strict_step(params, opt_state, batch)
    losses.append(float(loss))
print("losses:", [round(l, 4) for l in losses])
print(strict_step.plan(params, opt_state, batch))


# %% [markdown]
# ## Reading a donated value
#
# `donate.donate_buffer(x)` donates the input buffer `x` comes from, from anywhere inside the function
# (here, no `donate_argnums` at all). From then on the returned value must be used; reading the original
# `x` again would need the buffer that was given away. `donate.jit` refuses, naming both lines (in a notebook
# by cell, `In[N]:line`, as IPython's tracebacks name them), and nothing is consumed.

# %%
def sgd(w, grad):
    new_w = donate.donate_buffer(w)    # w's buffer is given away here
    norm = jnp.sum(w * w)              # ... and read again here
    return new_w - 0.1 * grad / norm


w, grad = jnp.ones(1024), jnp.ones(1024)
try:
    donate.jit(sgd)(w, grad)
except donate.DonationError as e:
    print(type(e).__name__ + ":", e)
print("\nw alive:", not w.is_deleted())


# %% [markdown]
# Reading the norm from `new_w` instead fixes it, and `w`'s buffer is then reused by the output:

# %%
def sgd(w, grad):
    w = donate.donate_buffer(w)
    norm = jnp.sum(w * w)
    return w - 0.1 * grad / norm


w = jnp.ones(1024)
pointer = w.unsafe_buffer_pointer()
out = donate.jit(sgd)(w, grad)
print("w deleted:", w.is_deleted(), "| output at w's address:", out.unsafe_buffer_pointer() == pointer)
