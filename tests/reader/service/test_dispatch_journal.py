"""The dispatcher's journal on disk: a golden journal holding every event kind replays, and is written, unchanged.

tests/golden/dispatcher.journal.jsonl was written by ``tests.golden.make_dispatch_journal`` (its ``drive()``)
with the code of the day the format was pinned; a dispatcher restarted on a ``--work_dir`` of that day's must
rebuild the same jobs, splits, leases and tallies, and today's must write those bytes again.
"""

import dataclasses
import json
import shutil

import pytest

from reader.service import DispatcherConfig, DispatchServer
from reader.service.dispatch_state import EVENTS, DispatchState, event_from_json, journal_line, read_journal
from reader.service.dispatcher import JOURNAL, _Journal
from reader.service.mixture_jobs import MixtureJob
from schemas.errors import FormatVersionError, InputDataError, UsageError
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
    assert kinds == {"job", "consumer", "lease", "expire", "ack", "rollback", "streams_read"} == set(EVENTS)
    assert {type(event) for event in read_journal(PATH.read_text().splitlines(), str(PATH))} == set(EVENTS.values())


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
    events = [event_from_json(json.loads(line)) for line in lines]
    assert [journal_line(event) for event in events] == lines
    assert [event.to_json() for event in events] == [json.loads(line) for line in lines]
    assert events == read_journal(lines, str(PATH)), "frozen dataclasses: equal when their fields are"


def test_a_journal_of_the_days_before_runs_seeds_and_steps_were_journaled_still_replays():
    events = read_journal(
        [
            '{"event": "job", "iteration": 0, "job_id": 1, "job_name": "t", "mode": "parallel_epochs", '
            '"num_splits": 2, "snapshot": "/s"}',
            "",
            '{"consumer": "p", "event": "streams_read", "job_id": 1}',
        ],
        "old.jsonl",
    )
    job = DispatchState.replay(events, now=0.0).jobs[1]
    assert (job.run_id, job.seed, job.consumers, job.streams_read, job.finished) == ("", 0, {"p"}, {"p"}, True)


def test_a_mixture_job_journals_its_definition_and_a_restarted_dispatcher_holds_its_consumers_to_it():
    state = DispatchState(lease_seconds=LEASE_SECONDS)
    job = MixtureJob(("web", "code"), (3.0, 1.0), (2, 1), 1500, 64, 4, False)
    definition = job.to_json()
    kwargs = {"job_name": "m", "iteration": 0, "snapshot": "/a\n/b", "mode": "distributed_epoch", "num_splits": 4}
    _, events = state.get_or_create_job(**kwargs, consumer="c", mixture=definition)
    lines = [journal_line(event) for event in events]
    assert json.loads(lines[0])["mixture"] == definition
    assert "mixture" not in json.loads(journal_line(dataclasses.replace(events[0], mixture=""))), (
        "snapshot jobs: as before"
    )
    restarted = DispatchState.replay(read_journal(lines, "m.jsonl"), now=T0)
    assert restarted.jobs[1].mixture == definition
    with pytest.raises(UsageError, match=r"already reading the mixture web=3,code=1 in batches of 64 rows; this "):
        restarted.get_or_create_job(
            **kwargs, consumer="d", mixture=dataclasses.replace(job, weights=(1.0, 1.0)).to_json()
        )
    with pytest.raises(UsageError, match="reads its snapshots as they are"):
        restarted.get_or_create_job(**kwargs, consumer="d")


@pytest.mark.parametrize(
    ("line", "error", "says"),
    [
        ('{"event": "frobnicate", "job_id": 1}', FormatVersionError, "kind 'frobnicate', which this snapfeed"),
        (
            '{"event": "lease", "job_',
            InputDataError,
            "is not a journal event (not JSON: Unterminated string starting at (column 20))",
        ),
        ("[1, 2]", InputDataError, 'is not a JSON object with an "event" kind'),
        ('{"event": "ack", "job_id": 1, "split": 0}', InputDataError, "(kind 'ack' without 'consumer')"),
        (
            '{"event": "expire", "job_id": "1", "split": 0}',
            InputDataError,
            "(kind 'expire' whose 'job_id' is '1', not of type int)",
        ),
        ('{"event": "rollback", "job_id": 1, "done": [1], "reopened": []}', InputDataError, "pairs"),
    ],
)
def test_a_line_that_is_no_event_is_refused_in_one_line_naming_the_file_and_line(tmp_path, line, error, says):
    (tmp_path / JOURNAL).write_text(PATH.read_text().splitlines()[0] + "\n" + line + "\n")
    with pytest.raises(error) as raised:
        DispatchServer(DispatcherConfig(work_dir=str(tmp_path)))
    message = str(raised.value)
    assert message.startswith(f"dispatcher journal {tmp_path / JOURNAL} line 2") and says in message
    assert "\n" not in message and "work_dir" in message, "one line, saying what to do"
