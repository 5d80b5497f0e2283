"""The dispatcher's journal on disk: a golden journal holding every event kind replays, and is written, unchanged.

tests/golden/dispatcher.journal.jsonl was written by ``tests.golden.make_dispatch_journal`` (its ``drive()``)
with the code of the day the format was pinned; a dispatcher restarted on a ``--work_dir`` of that day's must
rebuild the same jobs, splits, leases and tallies, and today's must write those bytes again.
"""

import dataclasses
import json
import shutil

from reader.service.dispatch_state import DispatchState
from reader.service.dispatcher import JOURNAL, _Journal
from tests.golden.make_dispatch_journal import LEASE_SECONDS, PATH, T0, drive

#: The state the golden journal's calls leave, as a replay of it must rebuild it (lease expiries aside).
EXPECTED = {
    1: {
        "key": ("train", 0),
        "job": ("/saved/s", "run-1", "distributed_epoch", 6, 7),
        "splits": [
            ("done", "a", False),
            ("done", "a", False),  # done by the rollback: a delivered it before its state was saved
            ("leased", "n", False),
            ("pending", "", False),
            ("pending", "", False),
            ("pending", "", False),
        ],
        "consumers": ["a", "b", "n"],
        "assignments": {"a": [0, 1, 2], "b": [2], "n": [2]},
        "streams_read": [],
        "leased": [2],
        "tally": {"leased": 5, "released": 1, "delivered": 2, "expired": 1, "taken_back": 0},
        "steps": {"a": (0, 10), "b": (0, 10), "n": (4, 10)},
        "offsets": {2: 5},
        "holders": {0: "a", 1: "a", 2: "n"},
        "starts": {("n", 2): 5},
        "finished": False,
    },
    2: {
        "key": ("eval", 3),
        "job": ("/saved/s", "run-1", "parallel_epochs", 3, 7),
        "splits": [],
        "consumers": ["p", "q"],
        "assignments": {},
        "streams_read": ["p"],
        "leased": [],
        "tally": {"leased": 0, "released": 0, "delivered": 0, "expired": 0, "taken_back": 0},
        "steps": {},
        "offsets": {},
        "holders": {},
        "starts": {},
        "finished": False,
    },
}


def observable(state: DispatchState) -> dict:
    """What the tests inspect of each job: all it holds but its leases' expiries (a replay renews those)."""
    return {
        job.job_id: {
            "key": (job.key.job_name, job.key.iteration),
            "job": (job.snapshot, job.run_id, job.mode, job.num_splits, job.seed),
            "splits": [(split.state.value, split.consumer, split.expired) for split in job.splits],
            "consumers": sorted(job.consumers),
            "assignments": job.assignments,
            "streams_read": sorted(job.streams_read),
            "leased": sorted(job.leased),
            "tally": dataclasses.asdict(job.tally),
            "steps": job.steps,
            "offsets": job.offsets,
            "holders": job.holders,
            "starts": job.starts,
            "finished": job.finished,
        }
        for job in state.jobs.values()
    }


def replayed(tmp_path, now: float) -> DispatchState:
    """The state a dispatcher restarted on a ``--work_dir`` holding the golden journal rebuilds."""
    shutil.copyfile(PATH, tmp_path / JOURNAL)
    return DispatchState.replay(_Journal(str(tmp_path)).read(), now=now, lease_seconds=LEASE_SECONDS)


def test_the_golden_journal_holds_every_event_kind():
    kinds = {json.loads(line)["event"] for line in PATH.read_text().splitlines()}
    assert kinds == {"job", "consumer", "lease", "expire", "ack", "rollback", "streams_read"}


def test_todays_dispatcher_writes_the_golden_journal_byte_for_byte(tmp_path):
    _, events = drive()
    _Journal(str(tmp_path)).append(events)
    assert (tmp_path / JOURNAL).read_bytes() == PATH.read_bytes()


def test_the_golden_journal_replays_into_the_state_its_calls_left(tmp_path):
    live, _ = drive()
    restarted = replayed(tmp_path, now=T0 + 100)
    assert observable(restarted) == EXPECTED == observable(live)
    assert [split.lease_expiry for split in restarted.jobs[1].splits if split.state.value == "leased"] == [
        T0 + 100 + LEASE_SECONDS
    ], "a lease restored gets a fresh term, so its holder can finish"
    assert restarted.status(now=T0 + 100)["jobs"] == live.status(now=T0 + 100)["jobs"]
    again = [state.lease_split(1, "n", now=T0 + 101, index=0)[0] for state in (restarted, live)]
    assert again[0] == again[1] and (again[0].split, again[0].offset) == (2, 5), "n asks again: split 2 from row 5"


def test_each_golden_line_serializes_back_to_the_same_bytes():
    lines = PATH.read_text().splitlines()
    assert [json.dumps(json.loads(line), sort_keys=True) for line in lines] == lines
