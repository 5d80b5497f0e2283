"""The materialize job, its commit guarantees, gc and the reader service on gs:// and s3://.

Against moto's S3 server and fake-gcs-server on 127.0.0.1. A reverse proxy in
front of an emulator loses the response to a commit, as a network can: the
client library retries, the retry is refused (412) because the first attempt
did commit, and the job must report committed with its shards intact.
"""

import json
import pathlib
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

import reader
from beam_jobs import WriteSnapshot, materialize
from reader.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer
from reader.snapshots import main as snapfeed
from schemas import metadata, storage, stores
from schemas.errors import StorageError
from schemas.paths import SnapshotPaths
from testing.http_proxy import http_proxy
from testing.ports import free_port
from tests import helpers, prep_tft
from tests.reader.service.probes import wait_for_workers

ROWS = 3000


def upload_inputs(tfrecord_input, bucket: str) -> tuple[str, str]:
    """The session's TFRecord files and schema copied into ``bucket``; (input pattern, schema) there."""
    for path in pathlib.Path(tfrecord_input["dir"]).iterdir():
        storage.atomic_write(f"{bucket}/raw/{path.name}", path.read_bytes())
    return f"{bucket}/raw/*.tfrecord", f"{bucket}/raw/schema.pbtxt"


def materialize_to(output: str, pattern: str, schema: str, *extra: str) -> materialize.MaterializeResult:
    return materialize.run([f"--input={pattern}", f"--schema={schema}", f"--output={output}", *extra])


def run_dirs(snapshot: SnapshotPaths) -> list[str]:
    return [entry.name for entry in storage.list_dir(snapshot.directory) if entry.is_dir]


def test_materialize_reads_inputs_from_and_commits_to_a_bucket(object_store, tfrecord_input):
    """Inputs, schema and output on the store; the snapshot reads back the very rows of a local one."""
    bucket = object_store.root
    pattern, schema = upload_inputs(tfrecord_input, bucket)
    result = materialize_to(f"{bucket}/snapshots", pattern, schema, "--snapshot_name=daily")
    assert (result.state, result.rows) == ("written", ROWS)
    local = materialize_to(str(object_store.tmp_path / "local"), tfrecord_input["pattern"], tfrecord_input["schema"])
    assert helpers.snapshot_rows(f"{bucket}/snapshots", "daily") == helpers.snapshot_rows(
        str(object_store.tmp_path / "local"), local.snapshot_id
    )
    ids = [
        int(i) for batch in reader.distributed_dataset(f"{bucket}/snapshots", 256, output="numpy") for i in batch["id"]
    ]
    assert sorted(ids) == list(range(ROWS))
    assert reader.open_snapshot(f"{bucket}/snapshots").metadata.run_id == result.run_id  # found under the root


def _is_commit_of_final_marker(scheme: str, replace: bool):
    """Matches the conditional write of metadata.final: a create (first commit) or a swap (forced write)."""

    def matches(method: str, target: str, headers) -> bool:
        lowered = {name.lower(): value for name, value in headers.items()}
        if scheme == "s3":
            return (
                method == "PUT"
                and target.split("?")[0].endswith("/metadata.final")
                and ("if-match" in lowered if replace else "if-none-match" in lowered)
            )
        # google-cloud-storage uploads POST the object's name in the body: the precondition names the commit.
        created = "ifGenerationMatch=0" in target
        return method == "POST" and "ifGenerationMatch=" in target and (created != replace)

    return matches


def test_a_commit_whose_response_is_lost_keeps_its_shards_and_reports_committed(
    object_store, tfrecord_input, monkeypatch
):
    bucket = object_store.root
    with http_proxy(object_store.endpoint) as proxy:
        for name, value in object_store.env_via(proxy.endpoint).items():
            monkeypatch.setenv(name, value)
        output = f"{bucket}/snapshots"
        snapshot = SnapshotPaths(output, "daily")
        proxy.drop_response(_is_commit_of_final_marker(object_store.scheme, replace=False))
        first = materialize_to(output, tfrecord_input["pattern"], tfrecord_input["schema"], "--snapshot_name=daily")
        assert proxy.responses_dropped == 1
        assert (first.state, first.rows) == ("written", ROWS)
        manifest = metadata.read_manifest(snapshot)
        assert manifest.run_id == first.run_id
        assert sum(helpers.snapshot_rows(output, "daily").values()) == ROWS, "the shards it committed are all there"

        proxy.drop_response(_is_commit_of_final_marker(object_store.scheme, replace=True))
        second = materialize_to(
            output, tfrecord_input["pattern"], tfrecord_input["schema"], "--snapshot_name=daily", "--mode=write"
        )
        assert proxy.responses_dropped == 2
        assert second.state == "written"
        replaced = metadata.read_manifest(snapshot)
        assert (replaced.run_id, replaced.supersedes_run_id) == (second.run_id, first.run_id)
        assert sum(helpers.snapshot_rows(output, "daily").values()) == ROWS
        assert sorted(run_dirs(snapshot)) == sorted([first.run_id, second.run_id]), "the old run stays until gc"


def test_gc_removes_a_superseded_run_from_a_bucket(object_store, tfrecord_input, capsys):
    output = f"{object_store.root}/snapshots"
    args = (output, tfrecord_input["pattern"], tfrecord_input["schema"], "--snapshot_name=daily")
    first = materialize_to(*args)
    second = materialize_to(*args, "--mode=write")
    snapshot = SnapshotPaths(output, "daily")
    assert snapfeed(["gc", output, "--older-than=0s", "--dry-run"]) == 0
    assert sorted(run_dirs(snapshot)) == sorted([first.run_id, second.run_id]), "a dry run removes nothing"
    assert snapfeed(["gc", output, "--older-than=0s"]) == 0
    assert run_dirs(snapshot) == [second.run_id]
    capsys.readouterr()
    assert snapfeed(["list", output, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["id"], row["state"]) for row in rows] == [("daily", "final")]
    assert sum(helpers.snapshot_rows(output, "daily").values()) == ROWS
    assert snapfeed(["verify", snapshot.directory, "--json"]) == 0
    capsys.readouterr()
    assert snapfeed(["show", snapshot.directory, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(run["run_id"], run["role"]) for run in shown["runs"]] == [(second.run_id, "live")]


def test_the_reader_service_reads_a_bucket_inside_its_allowed_roots_only(object_store, tfrecord_input):
    bucket = object_store.root
    result = materialize_to(
        f"{bucket}/snapshots", tfrecord_input["pattern"], tfrecord_input["schema"], "--snapshot_name=daily"
    )
    dispatcher = DispatchServer(DispatcherConfig(allowed_roots=[f"{bucket}/snapshots"])).start()
    worker = WorkerServer(
        WorkerConfig(dispatcher_address=dispatcher.target, allowed_roots=[f"{bucket}/snapshots"])
    ).start()
    try:
        wait_for_workers(dispatcher.target, 1)
        dataset = reader.distributed_dataset(result.path, 256, output="numpy", service=dispatcher.target)
        ids = sorted(int(i) for batch in dataset for i in batch["id"])
        assert ids == list(range(ROWS))
        outside = materialize_to(
            f"{bucket}/elsewhere", tfrecord_input["pattern"], tfrecord_input["schema"], "--snapshot_name=daily"
        )
        with pytest.raises(reader.UsageError, match="allowed_roots"):
            list(reader.distributed_dataset(outside.path, 256, service=dispatcher.target))
    finally:
        worker.stop()
        dispatcher.stop()


def test_a_standalone_write_snapshot_commits_to_a_bucket_and_refuses_a_missing_one_before_running(object_store):
    root = f"{object_store.root}/user-pipeline"
    for start in (0, 1000):  # the second run supersedes the first with a compare-and-swap
        with TestPipeline() as pipeline:
            _ = (
                pipeline
                | beam.Create([start, start + 500])
                | beam.Map(id_batch)
                | WriteSnapshot(root, snapshot_name="ids")
            )
        ids = sorted(
            int(i) for batch in reader.distributed_dataset(f"{root}/ids", 100, output="numpy") for i in batch["id"]
        )
        assert ids == list(range(start, start + 1000))
    missing = f"{object_store.scheme}://no-such-{object_store.bucket}/snapshots"
    with pytest.raises(StorageError, match="does not exist"):
        WriteSnapshot(missing, snapshot_name="ids")


def id_batch(start: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + 500), pa.int64())})


@pytest.mark.slow  # 22-26 s per store
def test_a_tf_transform_job_commits_its_graph_to_a_bucket_and_the_reader_serves_it(object_store, tmp_path):
    """CSV on the store, output on the store: the graph's files are written through the store (tf.io.gfile writes
    no s3://), listed and verified; the reader copies the graph once into its cache and serves it."""
    bucket = object_store.root
    columns = prep_tft.write_categories_csv(tmp_path / "rows.csv", rows=500)
    storage.atomic_write(f"{bucket}/raw/rows.csv", (tmp_path / "rows.csv").read_bytes())
    flags = ["--input_format=csv", "--tft_preprocessing_fn=tests.prep_tft:categories", "--progress_interval_seconds=0"]
    result = materialize.run([f"--input={bucket}/raw/rows.csv", f"--output={bucket}/tft", *flags])
    local = materialize.run([f"--input={tmp_path / 'rows.csv'}", f"--output={tmp_path / 'local'}", *flags])
    assert (result.state, result.rows) == ("written", 500)
    assert helpers.snapshot_rows(f"{bucket}/tft", result.snapshot_id) == helpers.snapshot_rows(
        str(tmp_path / "local"), local.snapshot_id
    )
    snapshot = reader.open_snapshot(f"{bucket}/tft")
    assert snapshot.metadata.transform_files and snapshot.verify() > snapshot.num_shards
    output = reader.transform_output(snapshot, cache_dir=str(tmp_path / "cache"))
    assert output.transform_savedmodel_dir.startswith(str(tmp_path / "cache"))
    served = reader.transform_features(
        output, {name: columns[name] for name in ("id", "x", "y")} | {"category": columns["category"].astype(bytes)}
    )
    stored = next(iter(reader.distributed_dataset(f"{bucket}/tft", 500, shuffle=False)))
    order = np.argsort(stored["id"])
    np.testing.assert_array_equal(served["category_id"], stored["category_id"][order])
    np.testing.assert_allclose(served["x_z"], stored["x_z"][order])


@pytest.mark.parametrize(
    ("scheme", "env", "cause"),
    [
        ("gs", {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:{port}"}, "cannot reach Google Cloud Storage at"),
        (
            "s3",
            {
                "AWS_ENDPOINT_URL": "http://127.0.0.1:{port}",
                "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:{port}",
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            },
            "cannot reach S3 at",
        ),
    ],
)
def test_an_input_bucket_out_of_reach_is_one_line_within_seconds(scheme, env, cause, tmp_path, monkeypatch):
    """Beam's match retried an unreachable gs:// for 120 s and then reported 'unexpected BeamIOError'."""
    port = free_port()  # nothing listens there
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(port=port))
    stores.forget()
    pattern = f"{scheme}://bucket/x*.csv"
    started = time.monotonic()
    try:
        with pytest.raises(StorageError) as raised:
            materialize.plan([f"--input={pattern}", f"--output={tmp_path}"])
    finally:
        stores.forget()  # its clients point at the closed port
    assert time.monotonic() - started < 30
    message = str(raised.value)
    assert message.startswith(f"--input={pattern}: {cause} http://127.0.0.1:{port}: check the network"), message
    assert "\n" not in message
