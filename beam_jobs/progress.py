"""Progress of a running job, printed by the driver while the pipeline runs.

Runners do not expose live counters uniformly (the DirectRunner returns only
when done), so the driver watches what the job has committed: shards renamed
into ``<run_id>/``. Rows come from each new shard's Arrow IPC blocks, read
once; Beam counters report the same totals on every runner at the end.
"""

from __future__ import annotations

import sys
import threading
import time

from schemas import shard_codec, storage


class ProgressReporter:
    """A daemon thread printing "rows, bytes, shards" every ``interval`` seconds."""

    def __init__(self, run_dir: str, interval: float, stream=sys.stderr) -> None:
        self._run_dir = run_dir
        self._interval = interval
        self._stream = stream
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="snapfeed-progress", daemon=True)
        self._rows_by_shard: dict[str, int] = {}
        self._started = time.monotonic()

    def __enter__(self) -> ProgressReporter:
        if self._interval > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def poll(self) -> tuple[int, int, int]:
        """(rows, bytes, shards) committed so far."""
        total_bytes = 0
        for entry in storage.list_dir(self._run_dir):
            total_bytes += entry.size
            if entry.path not in self._rows_by_shard:
                with storage.open_random_access(entry.path) as handle:
                    reader = shard_codec.open_shard(handle, entry.path)
                    self._rows_by_shard[entry.path] = sum(
                        reader.get_batch(i).num_rows for i in range(reader.num_record_batches)
                    )
        return sum(self._rows_by_shard.values()), total_bytes, len(self._rows_by_shard)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                rows, num_bytes, shards = self.poll()
            except OSError:
                continue  # a shard vanished under us (lost race, cleanup): report next time
            elapsed = time.monotonic() - self._started
            print(
                f"progress: {rows} rows, {num_bytes / 1e6:.1f} MB in {shards} shards after {elapsed:.0f}s",
                file=self._stream,
                flush=True,
            )
