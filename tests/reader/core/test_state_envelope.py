"""The one state envelope (``reader.core.state``): today's states load, and a wrong state is one clear line."""

import hashlib
import json

import pytest

import reader
from reader.core.pipeline import ReadPipeline
from reader.core.state import STATE_VERSION, rows_config
from tests.helpers import state_refusal


def ids(step):
    return [batch["id"].tolist() for batch in step]


def local(path, **kwargs):
    return reader.distributed_dataset(path, 64, num_replicas=2, num_epochs=2, seed=5, **kwargs)


def as_version_1(state):
    """The state as the reader wrote it before the envelope had a kind (version 1, same fields and digest)."""
    return {**{k: v for k, v in state.items() if k != "kind"}, "version": 1}


def sealed_before_v3(dataset, state, version):
    """A local ``state`` of ``dataset`` as snapfeed sealed it at ``version`` (1 or 2): five fields and a digest
    with the topology in it (the old code's formula, written out here)."""
    options = dataset.options
    pipeline = ReadPipeline(dataset.snapshot, options)
    must_match = {
        **rows_config(pipeline.snapshot, options, pipeline.columns),
        "policy": options.shard_policy.value,
        "shuffle": [options.shuffle, options.reshuffle_each_epoch, pipeline.window_rows],
    }
    config = hashlib.sha256(json.dumps(must_match, sort_keys=True).encode()).hexdigest()[:16]
    sealed = {"version": version, "config": config, **{k: state[k] for k in ("seed", "epoch", "step", "stop_epoch")}}
    return {**sealed, "finished": state["finished"], **({"kind": "local"} if version > 1 else {})}


def test_a_state_names_its_version_and_kind(uneven_snapshot):
    state = iter(local(uneven_snapshot)).get_state()
    assert (state["version"], state["kind"]) == (STATE_VERSION, "local")
    assert json.loads(json.dumps(state)) == state


def test_a_version_1_local_state_resumes_exactly(uneven_snapshot):
    uninterrupted = [ids(step) for step in local(uneven_snapshot)]
    iterator = iter(local(uneven_snapshot))
    for _ in range(40):
        next(iterator)
    state = sealed_before_v3(local(uneven_snapshot), iterator.get_state(), 1)
    iterator.close()
    restored = iter(local(uneven_snapshot))
    restored.set_state(state)
    assert [ids(step) for step in restored] == uninterrupted[40:]
    assert restored.get_state()["version"] == STATE_VERSION


def test_a_service_state_given_to_the_local_reader_is_one_clear_line(uneven_snapshot):
    state = {**iter(local(uneven_snapshot)).get_state(), "kind": "service", "job_name": "j"}
    message = state_refusal(iter(local(uneven_snapshot)), state)
    assert "not a local reader state" in message and "reader-service consumer" in message
    assert "built with service=" in message
    old_service_state = as_version_1({**state, "service": True})
    assert "reader-service consumer" in state_refusal(iter(local(uneven_snapshot)), old_service_state)


@pytest.mark.parametrize(
    "broken, expected",
    [
        (lambda s: None, "not a snapfeed local reader state"),
        (lambda s: {**s, "version": 99}, "saved by a newer snapfeed (state version 99"),
        (lambda s: {**s, "version": "3"}, "not a snapfeed local reader state"),
        (lambda s: {**s, "kind": "tape"}, "an unknown kind 'tape'"),
        (lambda s: {k: v for k, v in s.items() if k != "epoch"}, "lacks ['epoch']"),
        (lambda s: {**s, "config": "0" * 16}, "same arguments"),
    ],
)
def test_a_broken_state_is_one_clear_line(uneven_snapshot, broken, expected):
    state = iter(local(uneven_snapshot)).get_state()
    assert expected in state_refusal(iter(local(uneven_snapshot)), broken(state))


def test_the_options_that_must_match_are_named(uneven_snapshot):
    state = iter(local(uneven_snapshot)).get_state()
    message = state_refusal(iter(local(uneven_snapshot, shuffle=False)), state)
    assert "shuffle" in message and "columns" in message and "same arguments" in message


def test_a_version_2_state_restores_into_the_same_topology_only(uneven_snapshot):
    iterator = iter(local(uneven_snapshot))
    for _ in range(3):
        next(iterator)
    old = sealed_before_v3(local(uneven_snapshot), iterator.get_state(), 2)
    rest = [ids(step) for step in iterator]
    again = iter(local(uneven_snapshot))
    again.set_state(old)
    assert [ids(step) for step in again] == rest
    other_batch = reader.distributed_dataset(uneven_snapshot, 32, num_replicas=2, num_epochs=2, seed=5)
    message = state_refusal(iter(other_batch), old)
    assert "saved by an older snapfeed (version 2)" in message
    assert "restores only into the same pipelines/batch" in message
