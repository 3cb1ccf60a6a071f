# %% [markdown]
# # Collectives and symmetric memory: 8 virtual CPU devices, and H100/B200 programs compiled here
#
# On GPUs, collectives run faster from symmetric (registered) memory: buffers allocated by NCCL's allocator
# and registered on every rank, so the collective can read and write them directly. Nothing in JAX lets a user
# say "this value feeds a collective, give it symmetric memory", nor shows how much such memory a program
# needs. `donate` adds three ways to say it, traces each request back to the op that produces the buffer,
# marks the lowered module, and plans the buffers into one pool per (kind, group):
#
# * `donate.with_symmetric(x, axis_name)`: annotate a value, like `with_sharding_constraint`;
# * `donate.requires_symmetric(collective)`: declare once, per collective, which inputs need it;
# * `with donate.symmetric_memory(axis_name):` everything produced inside, e.g. a custom op's outputs.
#
# This machine has no GPU. Everything below runs on 8 virtual CPU devices, where the annotations change
# no numbers and no memory; what they change on a GPU is read, at the end, from real H100 and B200
# executables compiled here ahead of time. **Nothing in this notebook was run on a GPU.**
#
# The device count must be set before anything touches JAX's backend, so it comes first:

# %%
import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_platforms", "cpu")  # the runtime here; GPU programs are compiled, not run

import re

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import donate
from donate import planner, symm

# %matplotlib inline
N = len(jax.devices())
mesh = Mesh(np.array(jax.devices()), ("tp",))
print("jax", jax.__version__, "|", N, "devices:", [str(d) for d in jax.devices()])

# %% [markdown]
# ## A tensor-parallel block
#
# The weight `w` is split over its input dimension across the 8 devices, and so is the activation `x`. Each
# device computes a partial product `h = x @ w` (16 x 32 float32, 2 KiB per device); an all-reduce (`psum`)
# over the `tp` axis sums the partials. `shard_map` gives each device its block.
#
# ### 1. `with_symmetric`: annotate the value
#
# `with_symmetric` returns its input unchanged and records the request in the jaxpr.
# `symm.comm_buffers(jaxpr)` traces each request back to the operation that materialises the buffer
# (through views such as reshapes and converts) and reports it:

# %%
B, D, H = 16, 64, 32
x = jax.device_put(jax.random.normal(jax.random.key(0), (B, D)), NamedSharding(mesh, P(None, "tp")))
w = jax.device_put(jax.random.normal(jax.random.key(1), (D, H)) / 8, NamedSharding(mesh, P("tp", None)))


def tp_layer(x, w):
    h = jnp.tanh(x @ w)                                  # this device's partial product
    return lax.psum(donate.with_symmetric(h, "tp"), "tp")


def tp_layer_plain(x, w):
    return lax.psum(jnp.tanh(x @ w), "tp")


specs = dict(mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())
layer = jax.shard_map(tp_layer, **specs)
layer_plain = jax.shard_map(tp_layer_plain, **specs)


def show(buffers):
    for b in buffers:
        print(f"  {b.producer:16s} {b.dtype}{list(b.shape)} {b.nbytes:5d} B  kind={b.kind} "
              f"group={b.group} from {'+'.join(b.sources)}  feeds {b.collectives or 'no collective'}"
              + (f"  over-allocated {b.over_allocated_bytes} B" if b.over_allocated_bytes else ""))


show(symm.comm_buffers(jax.make_jaxpr(layer)(x, w)))
same = bool(jnp.array_equal(jax.jit(layer)(x, w), jax.jit(layer_plain)(x, w)))
print("results identical to the unannotated layer:", same)

# %% [markdown]
# The buffer is the output of `tanh` (the op that produces it), 2048 bytes per device, for group `('tp',)`, and it
# feeds the all-reduce. Results are identical with and without the annotation.
#
# ### 2. `requires_symmetric`: declare it once per collective
#
# Annotating every call site does not scale. `requires_symmetric(lax.psum)` registers JAX's collective, so
# every `psum` operand is marked, at any depth (here inside a `scan` body and a nested `jit`), when
# `donate.jit` (or `symm.mark_required`) processes the program. For your own collective, e.g. a ring
# all-reduce built from `ppermute`, `requires_symmetric` returns a wrapper that marks the chosen arguments.

# %%
donate.requires_symmetric(lax.psum)
print("registered:", sorted(symm.registered_requirements()))


def ring_allreduce(v, axis_name):
    # A user's own collective: a ring of ppermutes.
    perm = [(k, (k + 1) % N) for k in range(N)]
    total, moving = v, v
    for _ in range(N - 1):
        moving = lax.ppermute(moving, axis_name, perm)
        total = total + moving
    return total


ring = donate.requires_symmetric(ring_allreduce)  # marks argument 0; the group comes from axis_name


def unannotated(x, w):
    inner = jax.jit(lambda a: lax.psum(jnp.exp(a), "tp"))
    h, _ = lax.scan(lambda c, _: (c + lax.psum(jnp.sin(c), "tp") / N, None), x @ w, None, length=2)
    return inner(h) + ring(h * 2.0, axis_name="tp")


fn = jax.shard_map(unannotated, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp"))
jaxpr = jax.make_jaxpr(fn)(x, w)
print("before mark_required:", len(symm.comm_buffers(jaxpr)), "buffer(s) from the wrapper")
show(symm.comm_buffers(symm.mark_required(jaxpr)))
for b in symm.comm_buffers(symm.mark_required(jaxpr)):
    print(f"  {b.producer:16s} found inside {' / '.join(b.path)}")


# %% [markdown]
# Without touching the function body, the operands of both registered `psum`s are found, in the scan body
# (`sin`) and the nested `jit` (`exp`), and the wrapped ring all-reduce marks its input (`mul`). The
# registration is global; `symm.clear_requirements()` undoes it (done at the end of this notebook).
#
# ### 3. `symmetric_memory`: a custom op under the context
#
# A custom op (here a `custom_vjp` function with two outputs) is opaque to the trace-back: the RFC's answer
# is to run it under a symmetric-memory context, so *all* its outputs become symmetric. That may
# over-allocate, and the user should be told: only the first output feeds the all-reduce.

# %%
@jax.custom_vjp
def gate(h):
    return jax.nn.gelu(h), jax.nn.sigmoid(h)


def gate_fwd(h):
    return gate(h), h


def gate_bwd(h, ct):
    return (jax.grad(lambda v: jnp.sum(jax.nn.gelu(v) * ct[0] + jax.nn.sigmoid(v) * ct[1]))(h),)


gate.defvjp(gate_fwd, gate_bwd)


def block(x, w):
    h = x @ w
    a = lax.psum(donate.with_symmetric(jnp.tanh(h), "tp"), "tp")   # 1. annotated value
    with donate.symmetric_memory("tp"):                             # 3. custom op, both outputs
        g, s = gate(h)
    b = lax.psum(g, "tp")                                           # only g reaches a collective
    c = ring(h * s, axis_name="tp")                                 # 2. the wrapped user collective
    return x + (a + b + c) @ w.T                                    # a residual update of x


block_fn = jax.shard_map(block, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                         out_specs=P(None, "tp"))
buffers = symm.comm_buffers(symm.mark_required(jax.make_jaxpr(block_fn)(x, w)))
show(buffers)

# %% [markdown]
# Four buffers: the annotated `tanh` (also covered by the `psum` registration), both outputs of the
# custom op (the second reaches no collective: 2048 bytes over-allocated), and the input of the ring
# all-reduce.
#
# ## `donate.jit`: the plan's notes
#
# `donate.jit` runs the same trace-back and puts what it found in the donation plan: notes for buffers that
# waste symmetric memory, and the bytes of marked buffers. Donating `x` also works here: the block's output
# is a residual update of `x`, sharded like it, so it reuses `x`'s buffer on every device.

# %%
step = donate.jit(block_fn, donate_argnums=0)
plan = step.plan(x, w)
for note in plan.notes:
    print("note:", note)
print("symmetric memory requested (unpacked):", plan.collective_memory_bytes, "bytes per device")
plan

# %% [markdown]
# ## The lowered module's markings
#
# `step.lower(...)` gives the StableHLO module `donate.jit` compiles. Each symmetric buffer's *producing
# operation* carries `mhlo.frontend_attributes` with `donate.symmetric`, the group, the source of the request
# and `donate.memory_space_color = "1"` (the collective memory space of jaxlib 0.10; the compiled programs below show `S(1)` or, on jaxlib 0.12, `S(7)`). The custom op's two outputs are the
# ops it lowers to (gelu's `multiply`, sigmoid's `divide`). The donated `x` is sharded, so the module marks it
# `jax.buffer_donor` and XLA makes the alias when it compiles (`donate.jit` checked that it did).

# %%
text = step.lower(x, w).as_text()
marked = [line.strip() for line in text.splitlines() if "donate.symmetric" in line]
for line in marked:
    op = re.search(r"= (\"?[\w.]+\"?)", line).group(1)
    attrs = dict(re.findall(r'(donate\.\w+) = "([^"]*)"', line))
    print(f"{op:20s} symmetric={attrs['donate.symmetric']} group={attrs['donate.group']} "
          f"source={attrs['donate.source']} color={attrs['donate.memory_space_color']}")
main = re.search(r"func\.func public @main\((.*?)\) ->", text).group(1)
print("\nx in the lowered module:", re.search(r"%arg0: [^{]*\{([^}]*)\}", main).group(1)[:60], "...")
compiled_text = step.lower(x, w).compile().as_text()
print("compiled:", re.search(r"input_output_alias=\{ .*? \}", compiled_text).group(0),
      "(output <- parameter 0, x)")

# %% [markdown]
# ## The memory plan: one pool per (kind, group)
#
# `planner.plan_memory(fun, *args)` walks the jaxpr (recursing into `shard_map`, the custom op, loops and
# calls), gives every buffer a live range, and packs the comm buffers into one pool per (kind, group),
# in isolation from the regular buffers (which share one arena, with in-place reuse). Sizes inside
# `shard_map` are per device. Buffers that are not live at the same time share offsets.

# %%
memory_plan = planner.plan_memory(block_fn, x, w)
(pool,) = memory_plan.pools
print(f"{pool.name}: {pool.nbytes} bytes for {len(pool.allocations)} comm buffers "
      f"({sum(a.nbytes for a in pool.allocations)} bytes unpacked), lower bound {pool.lower_bound_bytes}")
for a in pool.allocations:
    print(f"  {a.name:6s} offset {a.offset:5d}  {a.nbytes} B  live {a.live_range}  {a.buffer.producer}")

# %% [markdown]
# The four 2 KiB buffers fit in a 4096-byte pool (its lower bound is 4096), not the 8192 bytes the plan
# counted unpacked: no more than two are live at any step, so the later ones reuse the offsets of the
# earlier ones. The full listing, in the style of Inductor's comm-buffer planning (`empty_pool`,
# `alloc_from_pool`), and the picture of both pools (memory against the steps of the program):

# %%
print(memory_plan)

# %%
memory_plan.plot(width=9)

# %%
reference = jax.jit(block_fn)(x, w)
out = step(x, w)
print("same as jax.jit:", bool(jnp.allclose(out, reference)), "| x donated:", x.is_deleted())
symm.clear_requirements()  # undo the global lax.psum registration before the GPU part
print("registered after clear_requirements():", symm.registered_requirements())

# %% [markdown]
# ## On real GPUs: H100 and B200 programs, compiled here
#
# This machine has no GPU, but with the `gpu-aot` extra (`pip install "jax-donate[gpu-aot]"`: the CUDA plugin
# pair at the jaxlib version, no NVIDIA libraries) JAX builds the *real* XLA:GPU executable for an abstract
# mesh of GPUs. `donate.targets.gpu_mesh("h100", 8, ...)` gives such a mesh (the H100 and B200 figures are
# those XLA publishes for each GPU); arguments are `jax.ShapeDtypeStruct`s sharded on it. The first cell set
# `jax_platforms` to `"cpu"`, so the plugin does not look for CUDA libraries. Nothing below *ran* on a GPU:
# everything is read from the compiled programs. Without the extra, the next cell says what to install and
# the GPU cells are skipped.
#
# The program is a transformer block's training step (`donate._examples.block_train_step`) on a 2 x 4 mesh,
# data parallel on `dp` and tensor (sequence) parallel on `tp`: inside `shard_map`, `all_gather` rebuilds
# the sequence before each column-parallel matmul, `psum_scatter` sums row-parallel products back into
# sequence shards, `ppermute` passes each shard's last token to the next one, and the gradient reduction over
# `dp` is a `psum` whose operands are annotated with `with_symmetric`. Outside `shard_map` the jitted step
# clips by the global gradient norm and applies momentum SGD on NamedSharding-ed arrays, so XLA's partitioner
# adds its own all-reduces there. Parameters and momentum are donated.
#
# `symm.check_placement` does with plain `jax.jit` what `donate.jit` does on a GPU target: trace, find the
# comm buffers, take the platform from the arguments' shardings, choose the compile options, compile (with a
# dump of XLA's buffer assignment) and read back where every annotated value landed.

# %%
from donate import _examples as examples, targets

jax.config.update("jax_platforms", "cpu")  # already in effect: set before the first array existed
GPU_AOT = targets.available()  # the CUDA plugin pair at jaxlib's version: the gpu-aot extra
print("CUDA plugin matching jaxlib installed:", GPU_AOT)
if not GPU_AOT:
    print('Without the gpu-aot extra the GPU cells below are skipped; to run them: '
          'pip install "jax-donate[gpu-aot]"')

# %%
if GPU_AOT:
    checks = {}
    for gpu in ("h100", "b200"):
        gpu_mesh = targets.gpu_mesh(gpu, 8, ("dp", "tp"), shape=(2, 4))
        args = examples.block_abstract_args(gpu_mesh, batch=16, seq=256, d_model=256, d_ff=1024)
        checks[gpu] = symm.check_placement(examples.block_train_step(gpu_mesh), *args,
                                           donate_argnums=(0, 1))
        c = checks[gpu]
        print(f"{gpu}: {gpu_mesh.devices.flat[0].device_kind}, platform {c.platform!r}, "
              f"{c.aliases} input/output aliases (params + momentum donated)")
    check = checks["h100"]
    print("\ncompile options:", check.policy.options)
    for kind, route in check.policy.routes:
        print(f"  annotated {kind}: {route}")
    for sentence in check.policy.placed_too:
        print("  note:", sentence)
    print()
    print(check.report)

# %% [markdown]
# All eight annotated gradient values landed in collective memory, and XLA merged them into one
# all-reduce (its all-reduce combiner concatenates them; the report follows the concatenation back to
# the marks). The report also says what else was placed and why: all-reduce has no per-compile switch
# in XLA, only the all-or-nothing `xla_gpu_enable_nccl_user_buffers`, so the un-annotated collectives
# (the tensor-parallel all-gathers, reduce-scatters and permutes, and the partitioner's all-reduces)
# went to collective memory too. The table of every collective in the H100 program:

# %%
if GPU_AOT:
    import collections

    rows = collections.OrderedDict()
    for name, kind, nbytes, where, annotated in check.collectives_table():
        key = (kind, annotated, where)
        count, total = rows.get(key, (0, 0))
        rows[key] = (count + 1, total + nbytes)
    print(f"{'collective':20s} {'annotated':9s} {'count':>5s} {'operand bytes':>14s}  placement")
    for (kind, annotated, where), (count, total) in rows.items():
        print(f"{kind:20s} {annotated:9s} {count:5d} {total:14d}  {where}")

# %% [markdown]
# ### Placing only what was annotated
#
# Where XLA has a per-compile switch for one kind of collective (all-gather, collective-permute, ragged
# all-to-all), `compile_options_for` uses it instead, and un-annotated collectives of other kinds stay in
# default memory. Here the same small program is compiled three times for 8 H100s: the annotation on the
# all-gather's operand, on the all-reduce's, and none:

# %%
if GPU_AOT:
    h100 = targets.gpu_mesh("h100", 8)
    v = jax.ShapeDtypeStruct((8192,), jnp.float32, sharding=NamedSharding(h100, P("x")))

    def two_collectives(mark):
        def body(u):
            a, b = jnp.sin(u), jnp.cos(u)
            a = donate.with_symmetric(a, "x") if mark == "all-reduce" else a
            b = donate.with_symmetric(b, "x") if mark == "all-gather" else b
            return lax.psum(a, "x"), lax.all_gather(b, "x", tiled=True)
        return jax.shard_map(body, mesh=h100, in_specs=P("x"), out_specs=(P(), P()), check_vma=False)

    print(f"{'annotated':11s} {'compile options':60s} all-reduce   all-gather")
    for mark in ("all-gather", "all-reduce", "none"):
        c = symm.check_placement(two_collectives(mark), v, plan=False)
        where = {kind: w for _, kind, _, w, _ in c.collectives_table()}
        print(f"{mark:11s} {str(c.policy.options)[:60]:60s} {where['all-reduce']:12s} {where['all-gather']}")
    try:
        symm.configure("AllReduce")
    except donate.DonationError as e:
        print("\nsymm.configure('AllReduce') here:", e)

# %% [markdown]
# With the all-gather annotated, one per-compile option places it and the all-reduce stays in default
# memory. With the all-reduce annotated, the only per-compile route places both. The selective route for
# all-reduce is XLA's process-wide `--xla_enable_nccl_symmetric_buffers_for_collectives` (jaxlib 0.12 and
# later), which XLA reads once, when JAX starts: `symm.configure("AllReduce")` sets it and must come before
# the first array exists; this notebook is past that point, and it says so (on jaxlib 0.10 it says the flag
# does not exist there). In a fresh process on jaxlib 0.12.0.1 it places the annotated all-reduce alone
# (`tests/test_gpu_aot.py`).
#
# ### How much collective memory
#
# XLA's buffer assignment of each compiled program has one allocation in the collective memory space:
# that is the collective memory one GPU needs for this program, and
# `XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB` must cover it. Beside it, the planner's pool for the
# annotated buffers of the same program (`planner.plan_memory`):

# %%
if GPU_AOT:
    print(symm.sizing_table([checks[g].sizing(g) for g in checks]))
    for g, c in checks.items():
        print(f"{g}: {c.memory}")
        print(f"     planner pool: {c.planned_bytes} B for {len(c.report.records)} annotated buffers "
              f"({c.annotated_bytes} B unpacked)")

# %% [markdown]
# XLA's allocation (8 to 10 MiB per GPU, depending on the jaxlib; the table gives the
# `XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB` that covers it) holds every buffer it placed, annotated or
# not, operands and results. The planner's pool (256 KiB) holds only the annotated operands, packed by
# liveness: it is what a selective placement of the annotations needs, less than a thirtieth of XLA's.
# In a picture, per collective kind, the operand bytes in collective memory (annotated and not) and in
# default memory, and the two pool sizes, for both GPUs:

# %%
if GPU_AOT:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1.3]})
    kinds = ["all-reduce", "all-gather", "reduce-scatter", "collective-permute"]
    width = 0.38
    for k, (g, c) in enumerate(checks.items()):
        uses = c.report.collectives
        ann = [sum(u.nbytes for u in uses if u.kind == kd and u.memory_space and u.annotated) for kd in kinds]
        other = [sum(u.nbytes for u in uses if u.kind == kd and u.memory_space and not u.annotated) for kd in kinds]
        xs = [i + (k - 0.5) * width for i in range(len(kinds))]
        axes[0].bar(xs, [a / 2**20 for a in ann], width, label=f"{g}: annotated, S(n)", color=("C0", "C2")[k])
        axes[0].bar(xs, [o / 2**20 for o in other], width, bottom=[a / 2**20 for a in ann],
                    label=f"{g}: un-annotated, placed too", color=("C0", "C2")[k], alpha=0.35)
    axes[0].set_xticks(range(len(kinds)), kinds)
    axes[0].set_ylabel("operand MiB per device")
    axes[0].set_title("collective operands in collective memory")
    axes[0].legend(fontsize=8)
    names = list(checks)
    axes[1].bar([0, 1], [checks[g].memory.nbytes / 2**20 for g in names], 0.38, label="XLA allocation")
    axes[1].bar([0.4, 1.4], [checks[g].planned_bytes / 2**20 for g in names], 0.38, label="planner pool")
    axes[1].set_xticks([0.2, 1.2], names)
    axes[1].set_title("collective memory per device (MiB)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()

# %% [markdown]
# What is verified here, on jaxlib 0.10.2 and 0.12.0.1: the compiled H100 and B200 programs, their memory
# spaces (`S(1)` on jaxlib 0.10, `S(7)` on 0.12), aliases and buffer assignment. What is not: any run on a
# GPU, NCCL's speed with registered or symmetric buffers, and the allocator actually honouring the size.
# `benchmarks/gpu/` has the script to measure that on a real GPU machine.
#
# `donate.jit` does all of this by itself: it takes the target from the abstract arguments' shardings,
# compiles with the placement options, and puts the placement report in the plan, beside the aliases of the
# donated parameters and momentum (`symmetric_placement=False` compiles as `jax.jit` would):

# %%
if GPU_AOT:
    gpu_mesh = targets.gpu_mesh("h100", 8, ("dp", "tp"), shape=(2, 4))
    args = examples.block_abstract_args(gpu_mesh, batch=16, seq=256, d_model=256, d_ff=1024)
    gpu_step = donate.jit(examples.block_train_step(gpu_mesh), donate_argnums=(0, 1))
    gpu_plan = gpu_step.lower(*args).compile().plan
    print(gpu_plan.placements)
    print(f"aliased: {sum(d.action == 'aliased' for d in gpu_plan.decisions)} of "
          f"{len(gpu_plan.decisions)} input leaves, {gpu_plan.reused_bytes / 2**20:.1f} MiB of global "
          f"arrays reused, {gpu_plan.memory.alias_bytes / 2**20:.1f} MiB aliased per device")
