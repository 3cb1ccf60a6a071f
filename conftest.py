"""Test setup, before JAX initialises its backends: eight virtual CPU devices, and CPU as the only
runtime platform (the CUDA plugin, installed by the test extra for ahead-of-time GPU compiles, then
skips its search for CUDA libraries; compile-only H100/B200 targets still work)."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_platforms", "cpu")
