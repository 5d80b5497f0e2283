"""The dispatcher taking a distributed_epoch job back to a restored state (``DispatchState.roll_back``), pure."""

import pytest

from reader.core.plan import all_blocks
from reader.service import DispatchState, splits
from reader.service.dispatch_state import journal_line, read_journal
from reader.service.rollback import Restore, RollbackWait
from schemas.errors import UsageError

ROWS = 25  # rows per split; consumers take 10 rows a step


def rows_of(job):
    return lambda split: ROWS


def join(state, consumer, *, iteration=0, now=0.0, start_step=0):
    state.touch(consumer, now=now)
    job, events = state.get_or_create_job(
        job_name="train",
        iteration=iteration,
        snapshot="/s",
        mode="distributed_epoch",
        num_splits=8,
        consumer=consumer,
        start_step=start_step,
        batch_rows=10,
    )
    return job, events


def lease(state, job, consumer, index, now=0.0):
    found, events = state.lease_split(job.job_id, consumer, now=now, index=index)
    return found, events


def crashed_trainer():
    """Consumers a and b read 3 steps (30 rows: a whole split and 5 rows of the next), a saved its state, both
    read 2 steps more (acking both splits, leasing a third), then died. Returns the state, job, journal, a's state."""
    state = DispatchState(lease_seconds=10)
    journal = []
    job, events = join(state, "a")
    journal += events
    journal += join(state, "b")[1]
    for consumer, index in (("a", 0), ("a", 1), ("b", 0), ("b", 1)):
        journal += lease(state, job, consumer, index)[1]
    assert job.assignments == {"a": [0, 1], "b": [2, 3]}
    saved = Restore("a", next_index=2, held={1: 5}, step=3)  # split 0 acked, 5 rows of split 1
    for consumer, split in (("a", 0), ("a", 1), ("b", 2), ("b", 3)):
        journal.append(state.ack_split(job.job_id, split, consumer))
    for consumer, index in (("a", 2), ("b", 2)):
        journal += lease(state, job, consumer, index)[1]
    return state, job, journal, saved


def splits_of(job):
    return [(status.state.value, job.offsets.get(split, 0)) for split, status in enumerate(job.splits)]


def test_a_restore_takes_every_gone_consumer_back_to_the_states_step_and_reopens_the_rest():
    state, job, journal, saved = crashed_trainer()
    journal += join(state, "n", now=20)[1]
    events = state.roll_back(job.job_id, "n", saved, now=20, rows_of=rows_of)
    journal += events
    assert splits_of(job) == [("done", 0), ("pending", 5), ("done", 0), ("pending", 5)] + [("pending", 0)] * 4
    assert not job.finished and (job.tally.delivered, job.tally.taken_back) == (4, 2), "counters only grow"
    first, _ = state.lease_split(job.job_id, "n", now=20)
    assert (first.split, first.offset) == (1, 5), "the partly delivered split goes on from its rows delivered"
    replayed = DispatchState.replay(read_journal(map(journal_line, journal), "journal"), now=30, lease_seconds=10)
    assert splits_of(replayed.jobs[job.job_id])[2:] == splits_of(job)[2:]
    with pytest.raises(RollbackWait):  # is n, heard from 1 s ago, reading? It renews if so
        state.roll_back(job.job_id, "m", saved, now=21, rows_of=rows_of)
    state.touch("n", now=22)
    assert state.roll_back(job.job_id, "m", saved, now=22, rows_of=rows_of) == [], "the same state again: no change"


def test_consumers_still_reading_keep_their_splits_and_a_restore_waits_for_those_it_cannot_tell():
    state, job, _, saved = crashed_trainer()
    state.touch("b", now=13)
    with pytest.raises(RollbackWait, match=r"waiting up to 3 s more for consumer b \(last heard from 7 s ago\)"):
        state.roll_back(job.job_id, "n", saved, now=20, rows_of=rows_of)
    state.touch("b", now=21)  # b renews: still reading (an asynchronous consumer)
    state.roll_back(job.job_id, "n", saved, now=21, rows_of=rows_of)
    assert [s.state.value for s in job.splits[2:6]] == ["done", "done", "pending", "leased"], "b's own, untouched"
    assert (job.splits[1].state.value, job.offsets[1]) == ("pending", 5), "a's taken back"


def test_after_a_dispatcher_restart_a_restore_waits_until_its_consumers_renew_or_are_gone():
    _, job, journal, saved = crashed_trainer()
    journal = read_journal(map(journal_line, journal), "journal")
    replayed = DispatchState.replay(journal, now=100, lease_seconds=10)
    with pytest.raises(RollbackWait):
        replayed.roll_back(job.job_id, "n", saved, now=101, rows_of=rows_of)
    replayed.roll_back(job.job_id, "n", saved, now=111, rows_of=rows_of)
    assert splits_of(replayed.jobs[job.job_id])[:4] == [("done", 0), ("pending", 5), ("done", 0), ("pending", 5)]


def test_later_epochs_a_gone_consumer_reached_are_reopened_whole():
    state, job, _, saved = crashed_trainer()
    later, _ = join(state, "b", iteration=1)
    found, _ = lease(state, later, "b", 0)
    state.ack_split(later.job_id, found.split, "b")
    state.roll_back(job.job_id, "n", saved, now=20, rows_of=rows_of)
    assert later.tally.taken_back == 1 and later.splits[found.split].state.value == "pending"


def test_a_state_whose_consumer_the_dispatcher_never_saw_is_refused_in_one_line():
    state = DispatchState(lease_seconds=10)
    job, _ = join(state, "n")
    with pytest.raises(UsageError, match=r"no record of consumer a .*--work_dir was lost.*another job_name"):
        state.roll_back(job.job_id, "n", Restore("a", 3, {}, 9), now=0, rows_of=rows_of)
    assert state.roll_back(job.job_id, "n", Restore("a", 0, {}, 0), now=0, rows_of=rows_of) == [], "nothing read"


def test_the_rows_of_every_split_weighed_at_once_are_each_splits():
    rows_of_blocks = [[5, 0, 7] * 30, [], [1, 2, 3] * 40]
    blocks = all_blocks(rows_of_blocks)
    in_order = splits.job_blocks(blocks, 3, 1)
    expected = [splits.split_rows(in_order, split) for split in range(splits.split_count(blocks))]
    assert splits.all_split_rows(rows_of_blocks, 3, 1).tolist() == expected
