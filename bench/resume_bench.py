"""`make bench` (elastic resume): what a reader state costs to save and restore, and the first batch after one.

- Planning at ``--blocks`` blocks (default 1,000,000; a synthetic manifest of 1,000 shards, no snapshot
  written): a state saved mid-epoch by pipeline 0 of 64 (AUTO, global batch 8192) is restored on 48
  pipelines (global batch 6144), and a state saved in that remainder epoch is restored on 80. Reported:
  the state's size (bytes of ``json.dumps``), the time to save it (its remainder's fields and
  ``json.dumps``) and to restore it (``json.loads``, ``elastic.resume``: the saver's cut of the epoch
  from the manifest, what is left of it, then this pipeline's share and its first step's segments).
- First batch on a real snapshot (the reader bench's 3KB rows, ``--rows`` rows, default 200,000,
  written once under ``out/resume-bench/``): ``next()`` on a fresh iterator of pipeline 0 of 3 vs
  ``set_state`` + ``next()`` with the state pipeline 0 of 4 saved halfway through an epoch (each
  ``--repeats`` times interleaved, page cache warm, the median reported; the datasets are built
  beforehand, so opening the snapshot is in neither).

Prints one JSON object and writes it to ``bench/results/resume.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import numpy as np

from reader.core.elastic import Remainder, Streams, Topology, remainder_cut, resume
from reader.core.plan import Position, ShardPolicy

WORKDIR = pathlib.Path(__file__).resolve().parent.parent / "out" / "resume-bench"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _topology(pipelines: int, per_pipeline_batch: int = 128, window_rows: int = 100_000) -> Topology:
    return Topology(Streams(ShardPolicy.AUTO, pipelines, window_rows), pipelines * per_pipeline_batch, False)


#: The fields of a local state that do not depend on the plan, at their real sizes (``ReaderIterator.get_state``).
_FIXED_FIELDS = {
    "version": 3,
    "kind": "local",
    "config": "0" * 16,
    "seed": 2**62,
    "stop_epoch": 1,
    "finished": False,
    "snapshot": ["f" * 64, "f" * 32],
    "columns": ["image", "features", "label"],
    "seed_shared": True,
    "pipeline": 0,
}


def _state(position, topology, remainder) -> dict:
    """A local state as ``ReaderIterator.get_state`` makes it."""
    saved_remainder = None if remainder is None else remainder.to_json()
    planned = {"epoch": position.epoch, "step": position.step, "topology": topology.to_json()}
    return {**_FIXED_FIELDS, **planned, "remainder": saved_remainder}


def _restore(saved: str, restored_by: Topology, block_rows) -> tuple:
    state = json.loads(saved)
    saved_by = Topology.from_json(state["topology"])
    remainder = None if state["remainder"] is None else Remainder.from_json(state["epoch"], state["remainder"])
    position, left = resume(Position(state["epoch"], state["step"]), saved_by, remainder, restored_by, block_rows)
    if left is not None:
        remainder_cut(restored_by, left.segments).step_segments(0, position.step)
    return position, left


def planning(blocks: int) -> dict:
    rng = np.random.default_rng(0)
    shards = 1000
    block_rows = [rng.integers(50, 150, blocks // shards).tolist() for _ in range(shards)]
    results = {"blocks": blocks, "rows": int(sum(map(sum, block_rows)))}
    saved = json.dumps(_state(Position(0, 40), _topology(64), None))
    for name, restored_by in [("64->48", _topology(48)), ("remainder 48->80", _topology(80))]:
        restored_bytes, started = len(saved), time.perf_counter()
        position, remainder = _restore(saved, restored_by, block_rows)
        restored = time.perf_counter() - started
        started = time.perf_counter()
        after = Position(position.epoch, position.step + 5)
        saved = json.dumps(_state(after, restored_by, remainder))
        results[name] = {
            "restored_state_bytes": restored_bytes,
            "restore_ms": _ms(restored),
            "segments": len(remainder.segments),
            "next_state_bytes": len(saved),
            "save_ms": _ms(time.perf_counter() - started),
        }
    return results


def first_batch(rows: int, repeats: int) -> dict:
    import reader
    from bench.reader_bench import cached_snapfeed

    path = str(cached_snapfeed(WORKDIR, "3KB", rows))

    def dataset(pipelines: int):
        context = reader.InputContext(pipelines, 0, pipelines)
        return reader.distributed_dataset(path, 256 * pipelines, input_context=context, seed=0, num_epochs=1)

    saver = iter(dataset(4))
    steps = dataset(4).steps_per_epoch
    for _ in range(steps // 2):
        next(saver)
    state = json.loads(json.dumps(saver.get_state()))
    saver.close()
    fresh, restored = [], []
    for _ in range(repeats):
        iterator = iter(dataset(3))
        started = time.perf_counter()
        next(iterator)
        fresh.append(time.perf_counter() - started)
        iterator.close()
        iterator = iter(dataset(3))
        started = time.perf_counter()
        iterator.set_state(state)
        next(iterator)
        restored.append(time.perf_counter() - started)
        iterator.close()
    return {
        "rows": rows,
        "state_bytes": len(json.dumps(state)),
        "fresh_first_batch_ms": _ms(statistics.median(fresh)),
        "restored_first_batch_ms": _ms(statistics.median(restored)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = {"planning": planning(args.blocks), "first_batch": first_batch(args.rows, args.repeats)}
    from bench import runs

    runs.write_results("resume", [results])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
