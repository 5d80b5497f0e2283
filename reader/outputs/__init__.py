"""What each framework gets from the core's NumPy steps: adapters, device placement and prefetch,
JAX global arrays, torch tensors, DataLoader datasets and their shared-memory steps.

Frameworks are imported only when their output is asked for. The public names are re-exported by ``reader``.
"""
