"""The service source (``reader.service.client.ServiceSource``) behind ``distributed_dataset(service=...)``:
its job belongs to it and its iterators, its states share the local reader's envelope."""

import collections
import concurrent.futures

import pytest

import reader
from reader.core.plan import InputContext
from reader.service.client import ServiceSource


def ids(step):
    return [batch["id"].tolist() for batch in step]


def service_dataset(path, target, job_name=None, processing_mode="distributed_epoch", **kwargs):
    options = {"num_replicas": 2, "num_epochs": 1, "seed": 7, **kwargs}
    service = reader.ServiceOptions(address=target, processing_mode=processing_mode, job_name=job_name)
    return reader.distributed_dataset(path, 64, **options, service=service)


def test_a_service_dataset_is_a_distributed_dataset_over_a_service_source(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    dataset = service_dataset(uneven_snapshot, dispatcher.target, "plain")
    assert isinstance(dataset, reader.DistributedDataset) and isinstance(dataset.source, ServiceSource)
    with pytest.raises(reader.UsageError, match=r"to_torch\(\) reads locally; with service= iterate the dataset"):
        service_dataset(uneven_snapshot, dispatcher.target, output="torch").to_torch()


def test_a_version_1_service_state_resumes_every_row_once(cluster, uneven_snapshot):
    """A state saved before the envelope had a kind (``"service": true``, version 1) still restores."""
    dispatcher, _ = cluster
    iterator = iter(service_dataset(uneven_snapshot, dispatcher.target, "old-state"))
    before = [ids(next(iterator)) for _ in range(5)]
    state = iterator.get_state()
    assert state["kind"] == "service"
    iterator.close()
    old = {**{k: v for k, v in state.items() if k != "kind"}, "version": 1, "service": True}
    restored = iter(service_dataset(uneven_snapshot, dispatcher.target, "old-state"))
    restored.set_state(old)
    rows = collections.Counter(i for step in before + [ids(s) for s in restored] for batch in step for i in batch)
    assert rows == {i: 1 for i in range(2000)}


def test_a_restore_reads_the_states_job_and_leaves_the_datasets_own(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    saved = iter(service_dataset(uneven_snapshot, dispatcher.target, "saved", seed=3)).get_state()
    dataset = service_dataset(uneven_snapshot, dispatcher.target, "own", seed=3)
    restored = iter(dataset)
    restored.set_state(saved)
    assert restored.get_state()["job_name"] == "saved"
    fresh = iter(dataset).get_state()
    assert (fresh["job_name"], fresh["seed"]) == ("own", 3)


def test_a_state_of_another_seed_is_refused_in_one_line(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    saved = iter(service_dataset(uneven_snapshot, dispatcher.target, "seeded", seed=3)).get_state()
    message = refusal(iter(service_dataset(uneven_snapshot, dispatcher.target, "seeded", seed=4)), saved)
    assert "seeded 3, and this dataset was built with seed=4; build it with seed=3 (or no seed=)" in message
    iter(service_dataset(uneven_snapshot, dispatcher.target, "seeded", seed=None)).set_state(saved)


def test_per_context_copies_share_the_job_of_an_anonymous_dataset(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    source = service_dataset(uneven_snapshot, dispatcher.target, seed=None).source
    copies = [source.for_context(InputContext(2, pipeline, 2)) for pipeline in (0, 1)]
    assert source.job.name.startswith("anonymous-")
    assert {copy.job for copy in copies} == {source.job}
    assert [copy.options.context.input_pipeline_id for copy in copies] == [0, 1]
    states = [iter(reader.DistributedDataset(copy)).get_state() for copy in copies]
    assert {(state["job_name"], state["seed"]) for state in states} == {(source.job.name, source.job.seed)}


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_a_lone_distributed_epoch_consumer_takes_steps_per_epoch_steps_and_tf_knows_its_cardinality(
    cluster, uneven_snapshot, drop_remainder
):
    """2000 rows in global batches of 64 over 2 replicas: 32 steps (31 whole and one of 16 rows), or 31 dropping it."""
    dispatcher, _ = cluster
    dataset = service_dataset(uneven_snapshot, dispatcher.target, num_epochs=2, drop_remainder=drop_remainder)
    expected = 31 if drop_remainder else 32
    assert dataset.steps_per_epoch == expected and dataset.source.exact_steps
    assert len(list(dataset)) == 2 * expected
    tf_dataset = dataset.as_tf_dataset()
    assert int(tf_dataset.cardinality()) == 2 * expected * 2, "steps x replicas x epochs, asserted to tf.data"
    assert sum(1 for _ in tf_dataset) == 2 * expected * 2


def test_consumers_sharing_a_job_are_told_the_jobs_steps_and_tf_is_not_told_a_cardinality(cluster, uneven_snapshot):
    """A shared job's steps are split first come, first served: together its consumers take the job's 32 steps,
    each ending on a partial step of its own, so how many each takes is known only once they are read."""
    dispatcher, _ = cluster
    datasets = [service_dataset(uneven_snapshot, dispatcher.target, "shared-steps") for _ in range(2)]
    assert [dataset.steps_per_epoch for dataset in datasets] == [32, 32]
    assert not datasets[0].source.exact_steps
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # each waits at its epoch's end for the other's splits
        steps = list(pool.map(lambda dataset: [ids(step) for step in dataset], datasets))
    taken = [len(consumer_steps) for consumer_steps in steps]
    rows = [id_ for consumer_steps in steps for step in consumer_steps for batch in step for id_ in batch]
    assert sorted(rows) == list(range(2000))
    assert 32 <= sum(taken) <= 33, taken
    assert int(datasets[0].as_tf_dataset().cardinality()) == -2, "UNKNOWN_CARDINALITY"


def test_parallel_epochs_has_no_steps_per_epoch_before_an_epoch_names_its_workers(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    dataset = service_dataset(uneven_snapshot, dispatcher.target, processing_mode="parallel_epochs")
    assert dataset.steps_per_epoch is None and not dataset.source.exact_steps
    assert len(list(dataset)) == 63, "both workers stream all 2000 rows: ceil(4000 / 64)"
    assert int(dataset.as_tf_dataset().cardinality()) == -2


def refusal(iterator, state) -> str:
    with pytest.raises(reader.UsageError) as refused:
        iterator.set_state(state)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_state_of_the_other_kind_is_one_clear_line(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    service_iterator = iter(service_dataset(uneven_snapshot, dispatcher.target))
    local_iterator = iter(reader.distributed_dataset(uneven_snapshot, 64, num_replicas=2))
    message = refusal(service_iterator, local_iterator.get_state())
    assert "saved by the local reader" in message and "without service=" in message
    message = refusal(local_iterator, service_iterator.get_state())
    assert "saved by a reader-service consumer" in message and "with service=" in message


ORDER = ": with service= the job's order, seeded by seed= and the epoch, shuffles the blocks anew every epoch"
TUNES = " tunes the local reader; with service= the workers read the blocks with their own settings"


#: What tunes the local reader or orders its rows, given with service=, and the start of its one-line refusal.
REFUSED = [
    ({"shuffle": False}, "shuffle=False" + ORDER),
    ({"reshuffle_each_epoch": False}, "reshuffle_each_epoch=False" + ORDER),
    ({"shuffle_buffer_size": 64}, "shuffle_buffer_size=64" + ORDER),
    ({"shard_policy": "OFF"}, "shard_policy='OFF'" + ORDER),
    ({"read": reader.ReadOptions(num_reader_threads=17)}, "read=ReadOptions(num_reader_threads=17)" + TUNES),
    ({"read": reader.ReadOptions(num_io_threads=4)}, "read=ReadOptions(num_io_threads=4)" + TUNES),
    ({"read": reader.ReadOptions(read_ahead_bytes=1 << 20)}, "read=ReadOptions(read_ahead_bytes=1048576)" + TUNES),
    ({"read": reader.ReadOptions(reader_buffer_size=2)}, "read=ReadOptions(reader_buffer_size=2)" + TUNES),
    ({"read": reader.ReadOptions(prefetch=8)}, "read=ReadOptions(prefetch=8)" + TUNES),
]


@pytest.mark.parametrize(("option", "expected"), REFUSED, ids=[said.split(":")[0].split()[0] for _, said in REFUSED])
def test_options_of_local_reads_are_refused_with_service_in_one_line(uneven_snapshot, option, expected):
    with pytest.raises(reader.UsageError) as refused:
        reader.distributed_dataset(uneven_snapshot, 64, service="grpc://127.0.0.1:1", **option)
    assert str(refused.value).startswith(expected), str(refused.value)
    assert "\n" not in str(refused.value)
    reader.distributed_dataset(uneven_snapshot, 64, **option)  # fine without service=


def test_a_local_shard_cache_is_refused_with_service_in_one_line(uneven_snapshot, tmp_path):
    cache = reader.CacheOptions(dir=str(tmp_path / "cache"))
    with pytest.raises(reader.UsageError) as refused:
        reader.distributed_dataset(uneven_snapshot, 64, service="grpc://127.0.0.1:1", cache=cache)
    assert str(refused.value).startswith(
        f"cache=CacheOptions(dir={cache.dir!r}) keeps shards for the local reader; with service= the workers have "
        "their own cache"
    ), str(refused.value)
    assert "\n" not in str(refused.value)
    reader.distributed_dataset(uneven_snapshot, 64, cache=cache)  # fine without service=


def test_an_address_without_grpc_is_one_line_naming_it(range_root):
    """Both spellings of ``service=`` name the address given and the form to give, before anything connects."""
    said = r"^service address 'localhost:5050': give the dispatcher as grpc://host:port"
    with pytest.raises(reader.UsageError, match=said):
        reader.distributed_dataset(range_root / "range8", 4, service="localhost:5050")
    with pytest.raises(reader.UsageError, match=said):
        reader.ServiceOptions(address="localhost:5050", job_name="j")
