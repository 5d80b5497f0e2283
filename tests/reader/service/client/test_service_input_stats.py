"""``iterator.stats()`` of a reader-service consumer: the same rows, bytes and wait as a local read."""

import time

import reader

#: The consumer's own work per step: long next to a loaded machine's service round trips (0.02 s was not, once,
#: in a fresh-clone run beside other tests: 0.82 s waited against 0.4 s of steps).
STEP_SECONDS = 0.1


def test_a_service_consumer_reports_the_same(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"], service=dispatcher.target)
    iterator = iter(dataset)
    steps = []
    for step in iterator:
        steps.append(step)
        time.sleep(STEP_SECONDS)
    stats = iterator.stats()
    assert (stats.steps, stats.rows, stats.bytes) == (len(steps), 2000, 2000 * 8)
    assert stats.elsewhere_seconds >= (len(steps) - 1) * STEP_SECONDS
    assert stats.input_bound_fraction < 0.5, stats
    busy = stats.reader
    assert busy.receive > 0 and busy.convert > 0, busy
    assert busy.storage_reads == busy.decode == busy.gather == 0, "the workers read the shards, not the consumer"
