"""donate.jit's layer: the wrapper, its keywords, the gate, binding, one signature's stages.

`wrapper` (JitWrapped, the call paths) sits on `signature` (prepare -> lower -> compile -> run),
`route` (how a signature runs), `gate` (the stand-in jax.jit runs), `binding` (arguments as
jax.jit binds them), `options`, `stages` (Traced/Lowered/Compiled), `into` (preallocated outputs),
`compiled` (the compiled program read back into the plan) and `eval_shape` (`jax.eval_shape` of a
donate.jit function, set on import). Below it: `donate._plan`, `donate._profile`, `donate._symm`,
`donate._planner`, then `donate._xla` and `donate._base`.
"""

# donate.jit functions pickled before this layer was a package name `donate._jit._restore`.
from donate._jit.wrapper import _restore as _restore  # noqa: E402
