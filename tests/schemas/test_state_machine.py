import pytest

from schemas.errors import UsageError
from schemas.snapshot_pb2 import Manifest, PendingMarker, RunState
from schemas.state_machine import Action, Mode, decide, describe_pending

NOW = 1_000_000.0
EXPIRY = 100.0


def pending(start: float, state: RunState = RunState.PENDING, run_id: str = "run-aaaaaaaaaaaa") -> PendingMarker:
    return PendingMarker(run_id=run_id, start_time=start, state=state, error="disk full")


def test_no_markers_means_write():
    assert decide(mode=Mode.AUTO, pending=None, manifest=None, now=NOW, expiry_seconds=EXPIRY).action is Action.WRITE


def test_final_marker_means_read_even_with_a_pending_marker():
    decision = decide(
        mode=Mode.AUTO, pending=pending(NOW), manifest=Manifest(run_id="run-b"), now=NOW, expiry_seconds=EXPIRY
    )
    assert decision.action is Action.READ
    assert "run-b" in decision.reason


def test_fresh_pending_is_passthrough_and_names_the_writer():
    decision = decide(mode=Mode.AUTO, pending=pending(NOW - 10), manifest=None, now=NOW, expiry_seconds=EXPIRY)
    assert decision.action is Action.PASSTHROUGH
    assert decision.reason.startswith("in progress by run run-aaaaaaaaaaaa since ")


def test_expired_pending_is_taken_over():
    decision = decide(mode=Mode.AUTO, pending=pending(NOW - 101), manifest=None, now=NOW, expiry_seconds=EXPIRY)
    assert decision.action is Action.WRITE
    assert "expired" in decision.reason


def test_failed_pending_is_taken_over_without_waiting_for_expiry():
    decision = decide(
        mode=Mode.AUTO, pending=pending(NOW, RunState.FAILED), manifest=None, now=NOW, expiry_seconds=EXPIRY
    )
    assert decision.action is Action.WRITE
    assert "failed" in decision.reason and "disk full" in decision.reason


def test_forced_write_over_a_final_snapshot_supersedes_its_run():
    decision = decide(mode=Mode.WRITE, pending=None, manifest=Manifest(run_id="run-old"), now=NOW, expiry_seconds=1)
    assert decision.action is Action.WRITE
    assert decision.supersedes_run_id == "run-old"


@pytest.mark.parametrize("mode, action", [(Mode.READ, Action.READ), (Mode.PASSTHROUGH, Action.PASSTHROUGH)])
def test_forced_modes(mode, action):
    assert decide(mode=mode, pending=None, manifest=None, now=NOW, expiry_seconds=1).action is action


def test_unknown_mode_is_a_usage_error_listing_choices():
    with pytest.raises(UsageError, match="auto, write, read, passthrough"):
        Mode.parse("sometimes")


def test_describe_failed_pending_includes_error():
    assert "failed" in describe_pending(pending(NOW, RunState.FAILED))


def test_a_fresh_pending_run_whose_writer_is_gone_is_taken_over_at_once():
    decision = decide(
        mode=Mode.AUTO, pending=pending(NOW - 1), manifest=None, now=NOW, expiry_seconds=EXPIRY, writer_gone=True
    )
    assert decision.action is Action.WRITE
    assert decision.reason.startswith("taking over abandoned run run-aaaaaaaaaaaa")


def test_a_finalized_snapshot_is_read_whatever_happened_to_a_later_writer():
    decision = decide(
        mode=Mode.AUTO,
        pending=pending(NOW),
        manifest=Manifest(run_id="run-b"),
        now=NOW,
        expiry_seconds=1,
        writer_gone=True,
    )
    assert decision.action is Action.READ


def replacing(start: float, state: RunState = RunState.PENDING) -> PendingMarker:
    """A forced write's marker: run-new replacing the finalized run-old."""
    return PendingMarker(run_id="run-new", start_time=start, state=state, supersedes_run_id="run-old")


def test_a_loser_reports_a_live_forced_write_replacing_the_finalized_run_as_in_progress():
    """Not "reused" for the very run the winner is replacing: what a loser of a non-forced race says (exit 3)."""
    decision = decide(
        mode=Mode.WRITE,
        pending=replacing(NOW - 1),
        manifest=Manifest(run_id="run-old"),
        now=NOW,
        expiry_seconds=EXPIRY,
        lost_race=True,
    )
    assert decision.action is Action.PASSTHROUGH
    assert decision.reason.startswith("in progress by run run-new since ")


def test_without_lost_race_the_same_markers_read_the_finalized_run():
    decision = decide(
        mode=Mode.AUTO, pending=replacing(NOW - 1), manifest=Manifest(run_id="run-old"), now=NOW, expiry_seconds=EXPIRY
    )
    assert (decision.action, decision.reason) == (Action.READ, "finalized by run run-old")


@pytest.mark.parametrize(
    "pending, writer_gone",
    [
        (replacing(NOW - 1, RunState.FAILED), False),
        (replacing(NOW - 101), False),
        (replacing(NOW - 1), True),
        (pending(NOW - 1, run_id="run-old"), False),  # the winner committed: its own marker names it
    ],
    ids=["replacement-failed", "replacement-expired", "replacement-writer-gone", "winner-committed"],
)
def test_a_loser_reads_the_finalized_run_unless_a_live_run_replaces_it(pending, writer_gone):
    decision = decide(
        mode=Mode.WRITE,
        pending=pending,
        manifest=Manifest(run_id="run-old"),
        now=NOW,
        expiry_seconds=EXPIRY,
        writer_gone=writer_gone,
        lost_race=True,
    )
    assert (decision.action, decision.reason) == (Action.READ, "finalized by run run-old")


def test_a_loser_forces_nothing_and_otherwise_follows_the_auto_rules():
    """--mode=write is ignored: with the winner's run failed and nothing finalized, the loser is told to write again."""
    markers = dict(pending=pending(NOW, RunState.FAILED), manifest=None, now=NOW, expiry_seconds=EXPIRY)
    loser = decide(mode=Mode.WRITE, lost_race=True, **markers)
    assert loser == decide(mode=Mode.AUTO, **markers)
    assert loser.action is Action.WRITE and loser.supersedes_run_id == "" and "failed" in loser.reason
