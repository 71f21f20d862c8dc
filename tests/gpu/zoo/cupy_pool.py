"""CuPy (static cudart, its own memory pool): a loop keeps every step's result."""
import cupy as cp

kept = []
print("running")
for step in range(1, 100_000):
    x = cp.ones((8192, 8192), cp.float32)  # EXPECT-LINE (the pool's blocks are first allocated here)
    kept.append(x * step)  # EXPECT-LINE
