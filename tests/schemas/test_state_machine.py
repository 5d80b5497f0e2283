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
