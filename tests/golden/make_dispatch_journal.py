"""Writes tests/golden/dispatcher.journal.jsonl: a dispatcher journal holding every event kind, as it is on disk.

``drive()`` takes a ``DispatchState`` through what a dispatcher sees (two consumers of a distributed_epoch job
leasing, acking, renewing, one dying and its lease expiring, a restored trainer taking the job back, a
parallel_epochs job read to its end), so every kind of event is written: job, consumer, lease (new, renewed,
re-leased and with an offset), ack, expire, rollback and streams_read. The file was written by the code of the
day the journal's format was pinned; tests/reader/service/test_dispatch_journal.py replays it with today's code.
Run ``python -m tests.golden.make_dispatch_journal`` only to add a golden of a new format on purpose.
"""

import pathlib

from reader.service.dispatch_state import DispatchState, Event
from reader.service.dispatcher import JOURNAL, _Journal
from reader.service.rollback import Restore

PATH = pathlib.Path(__file__).parent / JOURNAL
#: When the dispatcher started: ``time.time()`` values, as the dispatcher's clock gives them.
T0 = 1733126400.125
LEASE_SECONDS = 10.0
ROWS = 25  # rows per split; consumers take 10 rows a step


def drive() -> tuple[DispatchState, list[Event]]:
    """The state after a realistic sequence of calls, and the events it returned, in journal order."""
    state = DispatchState(lease_seconds=LEASE_SECONDS)
    journal: list[Event] = []
    state.worker_heartbeat("grpc://worker-0:5051", now=T0)

    def join(consumer: str, now: float, **job) -> int:
        state.touch(consumer, now=now)
        found, events = state.get_or_create_job(snapshot="/saved/s", run_id="run-1", seed=7, consumer=consumer, **job)
        journal.extend(events)
        return found.job_id

    train = dict(job_name="train", iteration=0, mode="distributed_epoch", num_splits=6)
    job_id = join("a", T0 + 0.1, **train, start_step=0, batch_rows=10)
    join("b", T0 + 0.2, **train, start_step=0, batch_rows=10)
    journal += state.lease_splits(job_id, "a", now=T0 + 0.3, index=0, count=2)[2]  # a GetJob that leases
    journal += state.lease_splits(job_id, "b", now=T0 + 0.4, index=0, count=1)[2]
    journal.append(state.ack_split(job_id, 0, "a"))
    assert state.ack_split(job_id, 0, "a") is None, "an ack of a split already done writes nothing"
    state.touch("a", now=T0 + 5.7)
    journal += state.renew(job_id, "a", now=T0 + 5.7)
    state.touch("a", now=T0 + 12.9)  # b died: its lease expires and a takes its split over
    journal += state.lease_split(job_id, "a", now=T0 + 12.9)[1]
    # a saved its state having delivered split 1 whole and 5 rows of split 2, then its trainer crashed
    saved = Restore("a", next_index=2, held={2: 5}, step=4)
    join("n", T0 + 40.3, **train, start_step=4, batch_rows=10)
    journal += state.roll_back(job_id, "n", saved, now=T0 + 40.3, rows_of=lambda job: lambda split: ROWS)
    journal += state.lease_split(job_id, "n", now=T0 + 40.3)[1]  # split 2 again, from its row 5

    evaluation = dict(job_name="eval", iteration=3, mode="parallel_epochs", num_splits=3)
    eval_id = join("p", T0 + 41.0, **evaluation)
    join("q", T0 + 41.5, **evaluation)
    journal.append(state.streams_read(eval_id, "p"))
    assert state.streams_read(eval_id, "p") is None
    return state, journal


def main() -> None:
    PATH.unlink(missing_ok=True)
    _Journal(str(PATH.parent)).append(drive()[1])  # as the dispatcher appends them
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
