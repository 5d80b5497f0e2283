"""``distributed_dataset(metrics=...)``: iterator.stats() as Prometheus counters, scraped over HTTP from a real
prometheus_client server, and summed over the dataset's iterators."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import reader
from schemas.errors import UsageError


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _scrape(address: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return _samples(response.read().decode())


def test_a_served_port_counts_every_epoch_and_the_reader_stages(uneven_snapshot):
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"], metrics="127.0.0.1:0")
    host, port = dataset.metrics_address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    label = (("snapshot", reader.open_snapshot(uneven_snapshot).snapshot_id),)
    iterators = [iter(dataset), iter(dataset)]
    for iterator in iterators:
        assert sum(len(step["id"]) for step in iterator) == 2000
    scraped = _scrape(dataset.metrics_address)
    assert scraped[("snapfeed_input_rows_total", label)] == 4000
    assert scraped[("snapfeed_input_steps_total", label)] == 2 * dataset.steps_per_epoch
    assert scraped[("snapfeed_input_bytes_total", label)] == 4000 * 8
    stats = [iterator.stats() for iterator in iterators]
    assert scraped[("snapfeed_input_wait_seconds_total", label)] == pytest.approx(sum(s.wait_seconds for s in stats))
    busy = {
        dict(labels)["stage"]: v
        for (name, labels), v in scraped.items()
        if name == "snapfeed_reader_busy_seconds_total"
    }
    assert set(busy) == {"storage_reads", "decode", "gather", "receive", "convert"}
    assert busy["gather"] == pytest.approx(sum(s.reader.gather for s in stats)) and busy["gather"] > 0


def test_a_registry_given_is_counted_on_and_a_stopped_iterator_keeps_its_counts(uneven_snapshot):
    registry = CollectorRegistry()
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"], metrics=registry)
    assert dataset.metrics_address is None, "the trainer serves its own registry"
    iterator = iter(dataset)
    for _ in range(3):
        next(iterator)
    iterator.close()
    del iterator
    label = (("snapshot", reader.open_snapshot(uneven_snapshot).snapshot_id),)
    assert _samples(generate_latest(registry).decode())[("snapfeed_input_rows_total", label)] == 300


def test_wrong_metrics_are_one_line(uneven_snapshot):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"cannot serve metrics on 127.0.0.1:{port} .*give a free port"):
            reader.distributed_dataset(uneven_snapshot, 100, metrics=f"127.0.0.1:{port}")
    with pytest.raises(UsageError, match="neither a prometheus_client CollectorRegistry nor a port"):
        reader.distributed_dataset(uneven_snapshot, 100, metrics="localhost")
    with pytest.raises(UsageError, match="metrics= counts the steps of a dataset iterated in Python"):
        reader.distributed_dataset(uneven_snapshot, 100, metrics=0, strategy=object())
