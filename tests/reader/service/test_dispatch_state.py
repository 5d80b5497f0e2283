"""The dispatcher's pure state machine: exactly-once splits, shared jobs, expiry, journal replay."""

import pytest

from reader.service import DispatchState
from reader.service.dispatch_state import LeaseExpired, SplitAcked, SplitTally, journal_line, read_journal
from schemas.errors import UsageError


def new_job(state, consumer, *, name="train", iteration=0, splits=5):
    job, _ = state.get_or_create_job(
        job_name=name,
        iteration=iteration,
        snapshot="/saved/s",
        mode="distributed_epoch",
        num_splits=splits,
        consumer=consumer,
    )
    return job


def drain(state, job_id, consumers, now=0.0):
    """Consumers take turns leasing and acking until the epoch ends; returns who read which split."""
    read = []
    active = list(consumers)
    while active:
        for consumer in list(active):
            lease, _ = state.lease_split(job_id, consumer, now=now)
            if lease.split is None:
                assert lease.end_of_epoch
                active.remove(consumer)
                continue
            state.ack_split(job_id, lease.split, consumer)
            read.append((consumer, lease.split))
    return read


def test_every_split_exactly_once_across_consumers_sharing_a_job():
    state = DispatchState()
    job = new_job(state, "a")
    assert new_job(state, "b").job_id == job.job_id
    read = drain(state, job.job_id, ["a", "b"])
    assert sorted(split for _, split in read) == list(range(5))
    assert {consumer for consumer, _ in read} == {"a", "b"}
    assert job.finished


def test_a_consumer_arriving_after_the_job_finished_gets_an_empty_epoch_and_a_new_iteration_is_a_new_job():
    state = DispatchState()
    job = new_job(state, "a")
    drain(state, job.job_id, ["a"])
    late = new_job(state, "late")
    assert late.job_id == job.job_id
    lease, _ = state.lease_split(late.job_id, "late", now=1.0)
    assert lease.split is None and lease.end_of_epoch
    next_epoch = new_job(state, "late", iteration=1)
    assert next_epoch.job_id != job.job_id and not next_epoch.finished


def test_a_dead_consumers_lease_expires_to_the_others_and_its_late_ack_is_refused():
    state = DispatchState(lease_seconds=10)
    job = new_job(state, "dead", splits=2)
    new_job(state, "alive", splits=2)
    lease, _ = state.lease_split(job.job_id, "dead", now=0)
    other, _ = state.lease_split(job.job_id, "alive", now=1)
    state.ack_split(job.job_id, other.split, "alive")
    waiting, _ = state.lease_split(job.job_id, "alive", now=5)
    assert waiting.split is None and not waiting.end_of_epoch, "the dead consumer's split is still leased"
    again, events = state.lease_split(job.job_id, "alive", now=11)
    assert again.split == lease.split and isinstance(events[0], LeaseExpired)
    with pytest.raises(UsageError, match="another consumer"):
        state.ack_split(job.job_id, lease.split, "dead")
    state.ack_split(job.job_id, again.split, "alive")
    assert job.finished


def test_the_tally_counts_leases_re_leases_expiries_and_deliveries_and_a_replay_counts_the_same():
    state = DispatchState(lease_seconds=10)
    job, journal = state.get_or_create_job(
        job_name="j", iteration=0, snapshot="/s", mode="distributed_epoch", num_splits=2, consumer="dead"
    )
    for consumer, now in (("dead", 0), ("alive", 1)):
        lease, events = state.lease_split(job.job_id, consumer, now=now)
        journal += events
    journal.append(state.ack_split(job.job_id, lease.split, "alive"))
    journal += state.renew(job.job_id, "alive", now=2)  # holds nothing: no lease, nothing counted
    again, events = state.lease_split(job.job_id, "alive", now=11)  # the dead consumer's lease expired
    journal += events
    journal.append(state.ack_split(job.job_id, again.split, "alive"))
    assert job.finished
    expected = SplitTally(leased=3, released=1, delivered=2, expired=1)
    assert job.tally == expected
    assert (
        DispatchState.replay(read_journal(map(journal_line, journal), "journal"), now=20).jobs[job.job_id].tally
        == expected
    )


def test_renewing_keeps_a_lease_alive():
    state = DispatchState(lease_seconds=10)
    job = new_job(state, "slow", splits=1)
    lease, _ = state.lease_split(job.job_id, "slow", now=0)
    state.renew(job.job_id, "slow", now=8)
    assert state.expire_leases(now=15) == []
    assert isinstance(state.ack_split(job.job_id, lease.split, "slow"), SplitAcked)


def test_journal_replay_restores_jobs_acks_and_leases_whose_holders_can_finish():
    state = DispatchState(lease_seconds=10)
    journal = []
    job, journal = state.get_or_create_job(
        job_name="j", iteration=0, snapshot="/s", mode="distributed_epoch", num_splits=3, consumer="c"
    )
    first, events = state.lease_split(job.job_id, "c", now=0)
    journal += events
    journal.append(state.ack_split(job.job_id, first.split, "c"))
    second, events = state.lease_split(job.job_id, "c", now=1)
    journal += events
    restored = DispatchState.replay(read_journal(map(journal_line, journal), "journal"), now=100, lease_seconds=10)
    job_after = restored.jobs[job.job_id]
    assert job_after.counts() == {"pending": 1, "leased": 1, "done": 1}
    assert restored.expire_leases(now=105) == [], "restored leases get a fresh term"
    restored.ack_split(job.job_id, second.split, "c")
    assert [s for s in drain(restored, job.job_id, ["c"], now=106)] == [("c", 2)]


def test_workers_time_out_and_bad_requests_are_usage_errors():
    state = DispatchState(worker_timeout_seconds=5)
    state.worker_heartbeat("w1:1", now=0)
    state.worker_heartbeat("w2:1", now=4)
    assert state.live_workers(now=6) == ["w2:1"]
    with pytest.raises(UsageError, match="processing_mode"):
        state.get_or_create_job(job_name="x", iteration=0, snapshot="/s", mode="sharded", num_splits=1, consumer="c")
    new_job(state, "c", name="x")
    with pytest.raises(UsageError, match="same snapshot"):
        new_job(state, "d", name="x", splits=7)
    with pytest.raises(UsageError, match="no split"):
        state.ack_split(1, 99, "c")
    assert state.status(now=6)["jobs"][0]["splits"] == {"pending": 5, "leased": 0, "done": 0}


def test_a_restored_consumer_re_reads_its_assignments_by_index_then_gets_new_ones():
    state = DispatchState(lease_seconds=10)
    job = new_job(state, "c", splits=4)
    first, _ = state.lease_split(job.job_id, "c", now=0, index=0)
    state.ack_split(job.job_id, first.split, "c")
    second, _ = state.lease_split(job.job_id, "c", now=1, index=1)
    # "c" checkpointed before its first assignment, then was restored: the same splits again, in order
    again = [state.lease_split(job.job_id, "c", now=2, index=i)[0] for i in (0, 1)]
    assert [(lease.split, lease.index) for lease in again] == [(first.split, 0), (second.split, 1)]
    third, _ = state.lease_split(job.job_id, "c", now=3, index=2)
    assert third.split not in (first.split, second.split) and third.index == 2
    with pytest.raises(UsageError, match="assignments"):
        state.lease_split(job.job_id, "c", now=3, index=9)


def test_a_lapsed_lease_stays_its_consumers_until_another_takes_it_over():
    state = DispatchState(lease_seconds=10)
    job = new_job(state, "slow", splits=2)
    new_job(state, "other", splits=2)
    mine, _ = state.lease_split(job.job_id, "slow", now=0)
    assert state.expire_leases(now=11)[0].split == mine.split
    # the live holder's heartbeat takes it back; its own next assignment is never the same split
    assert [e.split for e in state.renew(job.job_id, "slow", now=12)] == [mine.split]
    assert state.lease_split(job.job_id, "slow", now=12)[0].split != mine.split
    state.expire_leases(now=30)
    assert state.ack_split(job.job_id, mine.split, "slow").consumer == "slow", "lapsed, untaken: still its ack"
    # a lapsed split another consumer took over is skipped when its first holder is restored
    holder = new_job(state, "restored", iteration=1, splits=2)
    lost, _ = state.lease_split(holder.job_id, "restored", now=0)
    new_job(state, "taker", iteration=1, splits=2)
    taken, _ = state.lease_split(holder.job_id, "taker", now=11)
    assert taken.split == lost.split
    reread, _ = state.lease_split(holder.job_id, "restored", now=12, index=0)
    assert reread.taken_over and reread.split == lost.split


def test_status_counts_splits_per_consumer():
    state = DispatchState()
    job = new_job(state, "a", splits=3)
    lease, _ = state.lease_split(job.job_id, "a", now=0)
    state.ack_split(job.job_id, lease.split, "a")
    state.lease_split(job.job_id, "a", now=0)
    assert state.status(now=0)["jobs"][0]["consumers"] == {"a": {"assigned": 2, "leased": 1, "done": 1}}


def test_lease_splits_hands_out_several_assignments_in_one_call_and_says_when_none_is_pending():
    state = DispatchState()
    job = new_job(state, "c", splits=5)
    leases, end, _ = state.lease_splits(job.job_id, "c", now=0, index=0, count=3)
    assert [lease.index for lease in leases] == [0, 1, 2] and not end
    again, _, _ = state.lease_splits(job.job_id, "c", now=0, index=1, count=2)
    assert [lease.split for lease in again] == [leases[1].split, leases[2].split], "re-read by index"
    rest, end, _ = state.lease_splits(job.job_id, "c", now=0, index=3, count=4)
    assert len(rest) == 2 and not end, "fewer than asked: none pending, but this consumer's splits are not done"
    for lease in leases + rest:
        state.ack_split(job.job_id, lease.split, "c")
    assert state.lease_splits(job.job_id, "c", now=0, index=5, count=4)[:2] == ([], True)


def test_a_parallel_job_is_finished_when_its_consumers_read_their_streams_and_leaving_workers_are_dropped():
    state = DispatchState()
    state.worker_heartbeat("grpc://w1:1", now=0)
    state.worker_heartbeat("grpc://w2:1", now=0)
    state.worker_left("grpc://w1:1")
    assert state.live_workers(now=1) == ["grpc://w2:1"], "a draining worker is not offered to consumers"
    journal = []
    for consumer in ("a", "b"):
        job, events = state.get_or_create_job(
            job_name="p", iteration=0, snapshot="/s", mode="parallel_epochs", num_splits=3, consumer=consumer
        )
        journal += events
    assert job.counts() == {"pending": 0, "leased": 0, "done": 0}, "nothing is leased in parallel_epochs"
    journal.append(state.streams_read(job.job_id, "a"))
    assert not job.finished, "b has not read its streams yet"
    restarted = DispatchState.replay(journal, now=2).jobs[job.job_id]
    assert restarted.consumers == {"a", "b"} and not restarted.finished, "a restart forgot that b joined"
    journal.append(state.streams_read(job.job_id, "b"))
    assert state.streams_read(job.job_id, "b") is None
    assert job.finished and state.status(now=1)["jobs"][0]["consumers"]["b"] == {"streams_read": True}
    assert DispatchState.replay(journal, now=2).jobs[job.job_id].finished
    with pytest.raises(UsageError, match="acknowledge splits"):
        state.streams_read(new_job(state, "c", name="d").job_id, "c")


def test_expiry_looks_only_at_leased_splits_of_every_job_and_replay_knows_which_are_leased():
    state = DispatchState(lease_seconds=10)
    journal = []
    jobs = []
    for iteration in (0, 1):
        job, events = state.get_or_create_job(
            job_name="t", iteration=iteration, snapshot="/s", mode="distributed_epoch", num_splits=5, consumer="a"
        )
        jobs.append(job)
        journal += events
        for _ in range(2):
            lease, events = state.lease_split(job.job_id, "a", now=0.0)
            journal += events
        journal.append(state.ack_split(job.job_id, 0, "a"))
    assert [job.leased for job in jobs] == [{1}, {1}]
    expired = state.expire_leases(now=20.0)
    journal += expired
    assert [(e.job_id, e.split) for e in expired] == [(jobs[0].job_id, 1), (jobs[1].job_id, 1)]
    assert [job.leased for job in jobs] == [set(), set()]
    lease, events = state.lease_split(jobs[1].job_id, "b", now=20.0)
    journal += events
    assert lease.split == 1 and jobs[1].leased == {1}
    replayed = DispatchState.replay(read_journal(map(journal_line, journal), "journal"), now=20.0)
    assert [job.leased for job in replayed.jobs.values()] == [set(), {1}]
