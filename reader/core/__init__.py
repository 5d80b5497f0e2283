"""The local read engine: from a finalized snapshot to per-replica NumPy batches.

No framework and no service is imported here (``tests/reader/test_core_imports.py``
checks it). The floors, bottom up: the plan and order (pure logic over the
manifest), the snapshot and its options, reading blocks (``ipc_layout``,
``block_io``, ``direct_shard``, ``blocks``; the shard cache of bucket snapshots behind one face, ``cache/``),
assembling batches (``allocator``,
``batch``, ``window_cache``, ``window_loader``, ``gather``), and the resumable
pass over them (``pipeline``, ``iterator``, ``state``, ``background``; ``elastic`` and
``remainder`` resume it on another topology).
The public names are re-exported by ``reader``.
"""
