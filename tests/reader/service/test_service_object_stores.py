"""The reader service serving a snapshot from a bucket: moto's S3 and fake-gcs-server on loopback, real servers."""

import reader
from reader.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer
from tests.reader.service.probes import ids_of, status, wait_for_workers


def test_workers_serve_a_snapshot_in_a_bucket_in_both_modes(object_store, uneven_snapshot):
    """Dispatcher and workers admit only the bucket (``allowed_roots``) and read the shards by ranged GETs."""
    uri = object_store.copy_in(uneven_snapshot)
    dispatcher = DispatchServer(DispatcherConfig(allowed_roots=[object_store.root])).start()
    workers = [
        WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target, allowed_roots=[object_store.root])).start()
        for _ in range(2)
    ]
    try:
        wait_for_workers(dispatcher.target, 2)
        distributed = reader.distributed_dataset(uri, 64, service=dispatcher.target, seed=5, num_epochs=2)
        assert ids_of(distributed) == {i: 2 for i in range(2000)}, "every row once per epoch"
        parallel = reader.distributed_dataset(
            uri, 64, service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs")
        )
        assert ids_of(parallel) == {i: 2 for i in range(2000)}, "every row once per worker"
        jobs = status(dispatcher.target)["jobs"]
        assert len(jobs) == 3 and all(job["finished"] for job in jobs)
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()
