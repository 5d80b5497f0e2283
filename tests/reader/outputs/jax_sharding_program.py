"""A JAX program reading a snapshot with ``placement=PlacementOptions(sharding=...)``, run by
tests/reader/outputs/test_jax_sharding.py in a subprocess (JAX's devices and processes are fixed when it starts).
Prints one JSON object of facts.

    python jax_sharding_program.py single SNAPSHOT CLASH_SNAPSHOT   (8 host devices)
    python jax_sharding_program.py multi SNAPSHOT PORT PROCESS_ID   (2 processes x 4 host devices)
"""

import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import reader
from reader.core.plan import InputContext

BATCH = 64
COLUMNS = ["id", "image", "value"]


def sharding_of(shape: tuple[int, ...]) -> NamedSharding:
    names = ("data", "model")[: len(shape)]
    return NamedSharding(Mesh(np.array(jax.devices()).reshape(shape), names), P("data"))


def read(path: str, sharding, *, prefetch_to_device: int = 0, **kwargs):
    """``sharding`` and ``prefetch_to_device`` are the placement, ``kwargs`` the rest of distributed_dataset's."""
    kwargs.setdefault("columns", COLUMNS)
    placement = reader.PlacementOptions(sharding=sharding, prefetch_to_device=prefetch_to_device)
    return reader.distributed_dataset(path, BATCH, output="jax", seed=3, placement=placement, **kwargs)


def local_rows(array) -> dict[int, np.ndarray]:
    """This process's rows of a global array, by first row index (replicas of a row range once)."""
    return {shard.index[0].start or 0: np.asarray(shard.data) for shard in array.addressable_shards}


def describe(step, sharding) -> dict:
    """What a test checks about one step: shapes, sharding, and this process's valid and padded ids."""
    ids, valid = local_rows(step["id"]), local_rows(step["__valid__"]) if "__valid__" in step else None
    starts = sorted(ids)
    kept = np.concatenate([ids[s] if valid is None else ids[s][valid[s]] for s in starts])
    padding = [] if valid is None else np.concatenate([ids[s][~valid[s]] for s in starts])
    images_match = all(
        np.array_equal(image, (ids[start][:, None, None, None] + np.zeros((4, 4, 3), np.int64)) % 251)
        for start, image in local_rows(step["image"]).items()
        if valid is None or valid[start].all()
    )
    return {
        "keys": sorted(step),
        "shapes": {name: list(array.shape) for name, array in step.items()},
        "sharded": all(array.sharding == sharding for array in step.values()),
        "ids": kept.tolist(),
        "padding": [int(value) for value in padding],
        "images_match": images_match,
    }


def epoch(path: str, sharding, **kwargs) -> list[dict]:
    return [describe(step, sharding) for step in read(path, sharding, **kwargs)]


def error_of(build) -> str | None:
    try:
        build()
    except reader.UsageError as error:
        return str(error)
    return None


def resumed_ids(path: str, sharding, **kwargs) -> dict:
    """Ids of 2 epochs read straight, and read with a stop after 5 steps and a restore in a new dataset."""
    straight = [describe(step, sharding)["ids"] for step in read(path, sharding, num_epochs=2, **kwargs)]
    steps = iter(read(path, sharding, num_epochs=2, **kwargs))
    head = [describe(next(steps), sharding)["ids"] for _ in range(5)]
    state = steps.get_state()
    steps.close()
    restored = iter(read(path, sharding, num_epochs=2, **kwargs))
    restored.set_state(state)
    return {"straight": straight, "resumed": head + [describe(step, sharding)["ids"] for step in restored]}


def single(path: str, clash_path: str) -> dict:
    mesh8, mesh4x2 = sharding_of((8,)), sharding_of((4, 2))
    return {
        "mesh8": epoch(path, mesh8),
        "mesh4x2": epoch(path, mesh4x2),
        "mesh4x2_dropped": epoch(path, mesh4x2, drop_remainder=True),
        "resume": resumed_ids(path, mesh8),
        "resume_prefetched": resumed_ids(path, mesh8, prefetch_to_device=2),
        "element_spec": {
            kind: {
                name: [list(c.shape), str(c.dtype)]
                for name, c in read(path, mesh8, drop_remainder=drop).element_spec.items()
            }
            for kind, drop in (("padded", False), ("dropped", True))
        },
        "mapped": sorted(next(iter(read(path, mesh8, map_fn=lambda step: {"n": step["__valid__"].sum()})))),
        "errors": {
            "indivisible": error_of(
                lambda: reader.distributed_dataset(
                    path, 60, output="jax", columns=COLUMNS, placement=reader.PlacementOptions(sharding=mesh8)
                )
            ),
            "replicas": error_of(lambda: read(path, mesh8, num_replicas=2)),
            "strings": error_of(lambda: read(path, mesh8, columns=None)),
            "clash": error_of(lambda: read(clash_path, mesh8, columns=None)),
            "not_a_sharding": error_of(lambda: read(path, P("data"))),
            "rank": error_of(lambda: read(path, NamedSharding(mesh4x2.mesh, P("data", "model")))),
            "processes": error_of(lambda: read(path, mesh8, input_context=InputContext(2, 0, 2))),
        },
    }


def multi(path: str, port: str, process_id: str) -> dict:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
    sharding = sharding_of((8,))
    dataset = read(path, sharding)
    context = dataset.options.context
    return {
        "context": [context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync],
        "devices": [len(jax.local_devices()), jax.device_count()],
        "auto": [describe(step, sharding) for step in dataset],
        "data_policy": epoch(path, sharding, shard_policy="DATA"),
        "other_context": error_of(lambda: read(path, sharding, input_context=InputContext())),
    }


if __name__ == "__main__":
    scenario, *arguments = sys.argv[1:]
    print(json.dumps({"single": single, "multi": multi}[scenario](*arguments)))
