"""The foundation every layer above stands on; imports nothing of donate's above it.

`compat` (with `compat_aliases`, the aliases set on a lowered module, and `compat_remat`, the
step traced again with its checkpoints changed: the only modules that
import jax._src; with `loops`, the only ones that decode a JAX-version-specific layout),
`errors` (every exception and warning class, one message shape), `primitives` (the one table of
primitive facts; donate_buffer_p, alias_p), `jaxprs` (jaxpr plumbing), `text` (how sizes,
shapes, shardings and notebook lines are written), `records` (frozen records built fast) and
`startup` (JAX imported without the CUDA plugin's start-up lines where no NVIDIA GPU is).
"""
