"""JAX with its default preallocation (75% of the GPU in one pool): a loop keeps every step's
result until XLA's pool is full and XLA raises RESOURCE_EXHAUSTED."""
import jax
import jax.numpy as jnp

kept = []
print("running")
for step in range(1, 100_000):
    y = jnp.full((16384, 16384), step, jnp.float32)  # EXPECT-LINE
    y.block_until_ready()
    kept.append(y)
