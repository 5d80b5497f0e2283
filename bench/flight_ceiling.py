"""The transport ceiling: a distributed_epoch job's splits fetched from the workers, nothing else.

Plain ``pyarrow.flight`` ``do_get`` of each split's JSON ticket (the fields the workers parse:
snapshot, run_id, columns, mode, seed, iteration, split, offset, batch_rows), the streamed record batches read
and counted: no dispatcher, no leases, no batching, and none of the service client's code, so the
ceiling does not move when the client does. One split in flight per worker, splits round-robin over
the workers: what the data plane alone moves on this machine, so the most distributed_epoch could
deliver here.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator

import pyarrow.flight as flight

from reader.core.plan import all_blocks
from reader.service import splits

MODE = "distributed_epoch"


class SplitFetcher:
    """``epoch()`` fetches every split of job (seed 0, iteration 0) once, yielding each split's rows."""

    def __init__(self, snapshot, workers: list[str], batch_rows: int) -> None:
        self._clients = [flight.FlightClient(worker) for worker in workers]
        fields = {
            "snapshot": str(snapshot.path),
            "run_id": snapshot.metadata.run_id,
            "columns": [column.name for column in snapshot.metadata.columns],
            "mode": MODE,
            "seed": 0,
            "iteration": 0,
            "offset": 0,
            "batch_rows": batch_rows,
        }
        count = splits.split_count(all_blocks(snapshot.block_rows))
        self._tickets = [flight.Ticket(json.dumps({**fields, "split": split}).encode()) for split in range(count)]
        self._pool = concurrent.futures.ThreadPoolExecutor(len(workers))

    def epoch(self) -> Iterator[int]:
        yield from self._pool.map(self._fetch, range(len(self._tickets)))

    def _fetch(self, split: int) -> int:
        client = self._clients[split % len(self._clients)]
        return sum(chunk.data.num_rows for chunk in client.do_get(self._tickets[split]))

    def close(self) -> None:
        self._pool.shutdown()
        for client in self._clients:
            client.close()
