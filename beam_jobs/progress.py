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

from schemas import paths, shard_codec, storage


class ProgressReporter:
    """A daemon thread printing rows, bytes, shards and rows/s every ``interval`` seconds, and the time left
    when ``expected_rows`` (``beam_jobs.inputs.row_estimate``) is known."""

    def __init__(self, run_dir: str, interval: float, stream=sys.stderr, expected_rows: int | None = None) -> None:
        self._run_dir = run_dir
        self._expected = expected_rows
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
            if not paths.is_shard_name(entry.path):
                continue  # the tf.Transform graph's files, published into the run at its end
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
            print(self.line(rows, num_bytes, shards, time.monotonic() - self._started), file=self._stream, flush=True)

    def line(self, rows: int, num_bytes: int, shards: int, elapsed: float) -> str:
        """``progress: 120000 of about 1000000 rows (12%), 9.6 MB in 3 shards after 10 s: 12000 rows/s, about
        73 s left``; without an estimate, the rows alone."""
        rate = rows / elapsed if elapsed > 0 else 0.0
        counted = f"{rows} rows"
        left = ""
        if self._expected:
            counted = f"{rows} of about {self._expected} rows ({min(rows / self._expected, 1.0):.0%})"
            if rate > 0 and rows < self._expected:
                left = f", about {_duration((self._expected - rows) / rate)} left"
        return (
            f"progress: {counted}, {num_bytes / 1e6:.1f} MB in {shards} shards after {_duration(elapsed)}: "
            f"{rate:.0f} rows/s{left}"
        )


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min 5 s``, ``2 h 3 min``: a person's reading of a time."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
