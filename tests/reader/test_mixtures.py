"""Weighted mixtures of real snapshots: exact shares per epoch, stratified batches, passes without repeats,
one global stream whatever the pipelines, states that restore on other pipelines and refuse other mixes.

"web" holds ids 0..1199 (two snapshots, a union), "code" ids 5000..5299: with weights 3:1 and the
sources' 1,500 rows an epoch takes 1,125 web rows and 375 code rows, so code is read 1.25 times per
epoch and web 0.94 times, and the next epoch goes on in both where the last one stopped.

The reader service serves a mixture with the same plan: a split is one window of whole batches, so a consumer
reading a job alone gets the local reader's very batches, and consumers sharing a job split its windows.
"""

from __future__ import annotations

import collections

import numpy as np
import pyarrow.flight as flight
import pytest

import reader
import reader.service
from reader.core.mixture_plan import largest_remainder
from schemas import views
from schemas.errors import UsageError
from tests import helpers
from tests.helpers import state_refusal
from tests.reader.service.probes import with_two_workers

WEB = [(0, [300, 300]), (600, [200, 400])]
CODE = (5000, [150, 150])
BATCH = 64


def _snapshot(root, start: int, sizes: list[int], source: int) -> str:
    batches = helpers.id_batches([start, *sizes])[1:]
    for batch in batches:
        batch["source"] = np.full(len(batch["id"]), source, np.int64)
    return helpers.write_snapshot(root, f"s{start}", batches, shard_size_bytes=20_000)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, list[str] | str]:
    root = tmp_path_factory.mktemp("mix")
    web = [_snapshot(root / f"web{i}", start, sizes, 0) for i, (start, sizes) in enumerate(WEB)]
    return {"web": web, "code": _snapshot(root / "code", *CODE, 1)}


WEB_IDS = set(range(0, 1200))
CODE_IDS = set(range(5000, 5300))


def _mix(sources, weights=None, **kwargs):
    return reader.mixture(sources, weights=weights or {"web": 3, "code": 1}, **kwargs)


def _steps(source, pipelines=1, pipeline=0, *, batch=BATCH, num_epochs=2, seed=5, **kwargs):
    return reader.distributed_dataset(
        source,
        batch,
        input_context=reader.InputContext(pipelines, pipeline, pipelines),
        seed=seed,
        num_epochs=num_epochs,
        columns=["id", "source"],
        shuffle_buffer_size=kwargs.pop("shuffle_buffer_size", 300),
        **kwargs,
    )


def _ids(step) -> list[int]:
    return [int(i) for batch in ([step] if isinstance(step, dict) else step) for i in batch["id"]]


def test_each_epoch_takes_the_exact_shares_and_every_batch_is_stratified(sources):
    dataset = _steps(_mix(sources))
    steps = [_ids(step) for step in dataset]
    per_epoch = dataset.steps_per_epoch
    assert len(steps) == 2 * per_epoch == 2 * -(-1500 // BATCH)
    for epoch in range(2):
        rows = [i for step in steps[epoch * per_epoch : (epoch + 1) * per_epoch] for i in step]
        assert len(rows) == 1500
        assert sum(i in CODE_IDS for i in rows) == 375 and sum(i in WEB_IDS for i in rows) == 1125
    full = [step for k, step in enumerate(steps) if (k + 1) % per_epoch]  # all but each epoch's partial last
    for step in full:  # every full batch: 48 +- 1 web rows, 16 +- 1 code rows
        assert len(step) == BATCH and abs(sum(i in CODE_IDS for i in step) - 16) <= 1
    assert abs(sum(i in CODE_IDS for i in steps[per_epoch - 1]) - 28 / 4) <= 1  # and the partial one
    first = _ids(next(iter(_steps(_mix(sources), shuffle_buffer_size=None))))  # AUTO: the window holds everything
    assert len({i for i in first if i < 600}) and len({i for i in first if 600 <= i < 1200})  # both web snapshots


def test_no_row_of_a_source_repeats_before_all_its_rows_were_delivered(sources):
    counts = {"web": collections.Counter(), "code": collections.Counter()}
    for step in _steps(_mix(sources), num_epochs=3):
        for i in _ids(step):
            counts["code" if i in CODE_IDS else "web"][i] += 1
        for name, ids in (("web", WEB_IDS), ("code", CODE_IDS)):
            seen = [counts[name][i] for i in ids]
            assert max(seen) - min(seen) <= 1, name  # pass after pass, never a row twice ahead of another
    assert sum(counts["code"].values()) == 3 * 375 and sum(counts["web"].values()) == 3 * 1125


def test_the_global_stream_is_the_same_for_any_number_of_pipelines(sources):
    alone = [sorted(_ids(step)) for step in _steps(_mix(sources))]
    for pipelines, policy in ((2, "AUTO"), (4, "DATA")):
        per_pipeline = [
            [_ids(step) for step in _steps(_mix(sources), pipelines, p, shard_policy=policy)] for p in range(pipelines)
        ]
        assert {len(steps) for steps in per_pipeline} == {len(alone)}  # equal steps
        together = [sorted(i for steps in per_pipeline for i in steps[k]) for k in range(len(alone))]
        assert together == alone


def test_off_gives_every_pipeline_the_whole_mixture(sources):
    steps = [_ids(step) for step in _steps(_mix(sources), 2, 1, shard_policy="OFF", num_epochs=1)]
    rows = [i for step in steps for i in step]
    assert len(rows) == 1500 and sum(i in CODE_IDS for i in rows) == 375
    assert {len(step) for step in steps[:-1]} == {BATCH // 2}


def test_a_state_restores_exactly_on_other_pipelines(sources):
    alone = [sorted(_ids(step)) for step in _steps(_mix(sources))]
    saver = iter(_steps(_mix(sources), 2, 0))
    for _ in range(5):
        next(saver)
    state = saver.get_state()
    rest = []
    for pipeline in range(4):
        iterator = iter(_steps(_mix(sources), 4, pipeline))
        iterator.set_state(state)
        rest.append([_ids(step) for step in iterator])
    assert {len(steps) for steps in rest} == {len(alone) - 5}
    assert [sorted(i for steps in rest for i in steps[k]) for k in range(len(alone) - 5)] == alone[5:]


def test_a_state_on_another_mix_or_batch_is_refused_in_one_line(sources):
    iterator = iter(_steps(_mix(sources)))
    next(iterator)
    state = iterator.get_state()
    equal = iter(_steps(_mix(sources, {"web": 1, "code": 1})))
    assert state_refusal(equal, state).startswith(
        "this reader state was saved on a mixture with weights web=3,code=1; this one has web=1,code=1: "
        "rebuild the dataset with the saved weights or start the epoch"
    )
    assert "epoch_rows=1500" in state_refusal(iter(_steps(_mix(sources, epoch_rows=900))), state)
    assert "mixture" in state_refusal(iter(_steps(sources["web"])), state)
    other_batch = iter(_steps(_mix(sources), batch=32))
    assert "same global_batch_size" in state_refusal(other_batch, state)
    union_state = iter(_steps(sources["web"]))
    next(union_state)
    assert "this dataset reads the mixture web=3,code=1" in state_refusal(
        iter(_steps(_mix(sources))), union_state.get_state()
    )


def test_epoch_rows_and_a_state_at_an_epoch_start_on_another_batch(sources):
    dataset = _steps(_mix(sources, epoch_rows=700), num_epochs=1, drop_remainder=True)
    rows = [i for step in dataset for i in _ids(step)]
    shares = largest_remainder(700 // BATCH * BATCH, [3, 1])
    assert len(rows) == 640 and sum(i in CODE_IDS for i in rows) == shares[1] == 160
    iterator = iter(_steps(_mix(sources, epoch_rows=700), num_epochs=2, drop_remainder=True))
    for _ in range(dataset.steps_per_epoch):
        next(iterator)
    other = iter(_steps(_mix(sources, epoch_rows=700), batch=32, num_epochs=2, drop_remainder=True))
    other.set_state(iterator.get_state())  # the second epoch, from its start, in batches of 32
    second = [i for step in other for i in _ids(step)]
    assert len(second) == 700 // 32 * 32 == 672 and sum(i in CODE_IDS for i in second) == 168


def test_wrong_mixtures_are_refused_in_one_line(sources):
    cases = [
        (lambda: reader.mixture(sources, weights={"web": 1}), "no weight for ['code']"),
        (lambda: reader.mixture(sources, weights={"web": 1, "code": -2}), "mixture weight code=-2"),
        (lambda: reader.mixture({}, weights={}), "give a dict of name -> snapshot"),
        (lambda: reader.mixture({"a": sources["code"], "b": sources["code"]}), "is in both source a and source b"),
        (lambda: reader.mixture(sources, epoch_rows=0), "epoch_rows=0"),
        (lambda: _steps(_mix(sources), 2, 0, seed=None), "needs the same seed on every pipeline"),
    ]
    for make, expected in cases:
        with pytest.raises(UsageError) as refused:
            make()
        assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_equal_weights_by_default_and_reader_dataset(sources):
    rows = [
        i
        for step in reader.dataset(reader.mixture(sources), 50, seed=1, num_epochs=1, columns=["id"])
        for i in _ids(step)
    ]
    assert len(rows) == 1500 and sum(i in CODE_IDS for i in rows) == 750


def _code_rows(ids) -> int:
    return sum(int(i) in CODE_IDS for i in ids)


def test_torch_dataloader_workers_slice_the_mixture_exactly(sources):
    torch = pytest.importorskip("torch")
    dataset = reader.distributed_dataset(_mix(sources), 60, seed=1, columns=["id"]).to_torch()
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    ids = torch.cat([batch["id"] for batch in loader]).tolist()
    assert len(ids) == 1500 and _code_rows(ids) == 375  # the two workers' slices: the epoch's exact shares


def test_jax_and_tf_outputs_read_a_mixture(sources):
    pytest.importorskip("jax")
    tf = pytest.importorskip("tensorflow")
    jax_steps = reader.distributed_dataset(_mix(sources), 100, seed=1, columns=["id"], output="jax", num_epochs=1)
    ids = [int(i) for step in jax_steps for i in np.asarray(step["id"])]
    assert len(ids) == 1500 and _code_rows(ids) == 375
    tf_batches = reader.dataset(_mix(sources), 100, seed=1, num_epochs=1, columns=["id"])
    assert isinstance(tf_batches, tf.data.Dataset)
    ids = [int(i) for batch in tf_batches for i in batch["id"].numpy()]
    assert len(ids) == 1500 and _code_rows(ids) == 375


def test_a_source_may_be_a_view_and_sources_may_differ_outside_the_columns_read(sources, tmp_path):
    view = str(tmp_path / "web-view")
    for folder in sources["web"]:
        snapshot = reader.open_snapshot(folder)
        views.add(view, snapshot.paths, snapshot.metadata)
    extra = helpers.id_batches([9000, 100])[1:]
    for batch in extra:
        batch["source"] = np.full(100, 2, np.int64)
        batch["note"] = np.zeros(100, np.float64)  # a column the others lack
    math = helpers.write_snapshot(tmp_path / "math", "math", extra)
    mix = reader.mixture({"web": view, "code": sources["code"], "math": math}, weights={"web": 2, "code": 1, "math": 1})
    with pytest.raises(UsageError, match=r"'note' is missing from .*pass columns= with shared ones"):
        reader.distributed_dataset(mix, 50, seed=1, columns=["id", "note"])
    ids = [i for step in reader.distributed_dataset(mix, 50, seed=1, columns=["id"]) for i in _ids(step)]
    assert len(ids) == 1600 and _code_rows(ids) == 400 and sum(i >= 9000 for i in ids) == 400
    iterator = iter(reader.distributed_dataset(mix, 50, seed=1, columns=["id"]))
    next(iterator)
    web = iterator.get_state()["snapshot"]["mixture"][0]
    assert web[:2] == ["web", 2.0] and web[2]["view"] == [view, 2]  # the state names the view version


@pytest.fixture
def cluster():
    """A dispatcher and two workers on loopback."""
    dispatcher = reader.service.DispatchServer(reader.service.DispatcherConfig(lease_seconds=2)).start()
    with with_two_workers(dispatcher):
        yield dispatcher


def _served(sources, service, *, batch=BATCH, num_epochs=2, weights=None, shuffle_buffer_size=300, **kwargs):
    return reader.distributed_dataset(
        _mix(sources, weights),
        batch,
        seed=5,
        num_epochs=num_epochs,
        columns=["id", "source"],
        shuffle_buffer_size=shuffle_buffer_size,
        service=service,
        **kwargs,
    )


def _stratified(step, batch=BATCH) -> bool:
    return len(step) == batch and abs(_code_rows(step) - batch / 4) <= 1


def test_the_service_serves_a_mixture_with_the_local_plan(sources, cluster):
    alone = _served(sources, cluster.target)
    served = [_ids(step) for step in alone]
    assert served == [_ids(step) for step in _steps(_mix(sources))], "alone in its job: the local reader's batches"
    assert alone.steps_per_epoch == -(-1500 // BATCH)
    shared = reader.ServiceOptions(address=cluster.target, job_name="mix")
    # Two consumers of one job split its windows, first come first served.
    consumers = helpers.read_at_once(lambda: [_ids(step) for step in _served(sources, shared, num_epochs=1)], 2)
    steps = [step for consumer in consumers for step in consumer]
    rows = [i for step in steps for i in step]
    assert sorted(rows) == sorted(i for step in served[: alone.steps_per_epoch] for i in step)  # the epoch's rows
    assert len(rows) == 1500 and _code_rows(rows) == 375
    assert sum(not _stratified(step) for step in steps) == 1, "every batch but the epoch's partial one"
    parallel = reader.ServiceOptions(address=cluster.target, processing_mode="parallel_epochs")
    steps = [_ids(step) for step in _served(sources, parallel, num_epochs=1)]
    rows = [i for step in steps for i in step]
    assert len(rows) == 2 * 1500 and _code_rows(rows) == 2 * 375, "each worker's whole epoch of the mixture"
    assert all(_stratified(step) for step in steps[:-1])


def test_a_service_state_on_a_mixture_resumes_exactly_and_refuses_other_weights(sources, cluster):
    whole = [_ids(step) for step in _served(sources, cluster.target)]
    iterator = iter(_served(sources, cluster.target))
    taken = [_ids(next(iterator)) for _ in range(30)]  # into the second epoch
    state = iterator.get_state()
    iterator.close()
    restored = iter(_served(sources, cluster.target))
    restored.set_state(state)
    assert taken + [_ids(step) for step in restored] == whole
    assert state_refusal(iter(_served(sources, cluster.target, weights={"web": 1, "code": 1})), state).startswith(
        "this reader state was saved on a mixture with weights web=3,code=1; this one has web=1,code=1"
    )
    one = iter(_served(sources, reader.ServiceOptions(address=cluster.target, job_name="fixed")))
    next(one)
    other = _served(
        sources, reader.ServiceOptions(address=cluster.target, job_name="fixed"), weights={"web": 1, "code": 1}
    )
    with pytest.raises(UsageError) as refused:
        next(iter(other))
    assert "consumers sharing a job_name must read the same mixture" in str(refused.value)
    assert "\n" not in str(refused.value)
    one.close()


def test_a_worker_failing_mid_window_or_stopping_changes_no_row_of_a_mixture(sources, monkeypatch):
    """Windows of 2 batches. The first stream fails after its first batch and is asked again from there; later a
    worker stops and the rest is read from the other: the same batches as the local reader's."""
    from reader.service import worker_streams

    original, offsets = worker_streams.windows_in_delivery_order, []

    def failing_once(source, windows, *args):
        windows = list(windows)
        first = not offsets
        offsets.extend(offset for _, offset in windows)
        for sent, batch in enumerate(original(source, windows, *args)):
            if sent == 1 and first:
                raise flight.FlightUnavailableError("worker lost mid-window (test)")
            yield batch

    monkeypatch.setattr(worker_streams, "windows_in_delivery_order", failing_once)
    local = [_ids(step) for step in _steps(_mix(sources), num_epochs=1, shuffle_buffer_size=128)]
    dispatcher = reader.service.DispatchServer(reader.service.DispatcherConfig(lease_seconds=2)).start()
    with with_two_workers(dispatcher) as workers:
        iterator = iter(_served(sources, dispatcher.target, num_epochs=1, shuffle_buffer_size=128))
        served = [_ids(next(iterator)) for _ in range(5)]
        workers[0].stop()
        served += [_ids(step) for step in iterator]
    assert served == local
    assert BATCH in offsets, "the failed window was asked for again after the batch it had sent"
