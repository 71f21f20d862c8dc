"""JAX with XLA_PYTHON_CLIENT_ALLOCATOR=platform (set by the zoo): every array is its own
allocation. A loop keeps every step's result in a list."""
import jax
import jax.numpy as jnp

kept = []
print("running")
for step in range(1, 100_000):
    x = jnp.ones((8192, 8192), jnp.float32)
    y = x * step  # EXPECT-LINE
    y.block_until_ready()
    kept.append(y)
