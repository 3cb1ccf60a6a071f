"""Test setup: eight virtual CPU devices, set before JAX initialises its backends."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
# The tests run on CPU. With jax-cuda12-plugin installed (for the AOT H100 compiles) JAX would
# otherwise try to start CUDA on a machine without a GPU; "cpu" still registers the plugin's
# topology, so `jax.experimental.topologies` can describe an H100.
jax.config.update("jax_platforms", "cpu")
