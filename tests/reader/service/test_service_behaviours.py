"""The reader service as a new user meets it: wrong addresses, a dispatcher gone, a refused worker, status, paths."""

import collections
import logging
import threading

import pytest

import reader
from reader.service import DispatcherConfig, DispatchServer, ServerSecurity, WorkerConfig, WorkerServer
from testing.ports import free_port
from tests.reader.service.probes import ids_of, start_process, status, wait_for_workers


def warnings_about(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_wrong_service_port_fails_within_seconds_with_a_warning_while_retrying(range_root, caplog):
    wrong = f"grpc://127.0.0.1:{free_port()}"
    caplog.set_level(logging.WARNING, logger="reader.service")
    with pytest.raises(reader.ServiceUnavailableError, match=rf"{wrong}: unreachable for \d s .*Check the address"):
        list(reader.distributed_dataset(range_root / "range10", 4, service=wrong))
    assert warnings_about(caplog, f"{wrong}: unreachable"), "nothing was logged while retrying"
    with pytest.raises(reader.UsageError, match="^timeout_seconds=0; give a positive number of seconds"):
        reader.distributed_dataset(
            range_root / "range10", 4, service=reader.ServiceOptions(address=wrong, timeout_seconds=0)
        )


def test_a_dispatcher_stopped_mid_read_is_logged_then_a_clear_error_after_the_timeout(uneven_snapshot, caplog):
    dispatcher = DispatchServer().start()
    workers = [WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start() for _ in range(2)]
    caplog.set_level(logging.WARNING, logger="reader.service")
    try:
        wait_for_workers(dispatcher.target, 2)
        dataset = reader.distributed_dataset(
            uneven_snapshot, 20, service=reader.ServiceOptions(address=dispatcher.target, timeout_seconds=2)
        )
        steps = iter(dataset)
        for _ in range(5):
            next(steps)
        dispatcher.stop()
        with pytest.raises(reader.ServiceUnavailableError, match=r"dispatcher at .* unreachable for \d s"):
            for _ in steps:
                pass
        assert warnings_about(caplog, "unreachable"), "the consumer waited without a word"
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_a_dispatcher_back_within_the_timeout_resumes_the_read_exactly_once(uneven_snapshot, tmp_path, caplog):
    work_dir = str(tmp_path / "journal")
    dispatcher = DispatchServer(DispatcherConfig(work_dir=work_dir)).start()
    port = int(dispatcher.target.rsplit(":", 1)[1])
    workers = [WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start() for _ in range(2)]
    caplog.set_level(logging.WARNING, logger="reader.service")
    restarted = []
    try:
        wait_for_workers(dispatcher.target, 2)
        dataset = reader.distributed_dataset(
            uneven_snapshot, 20, service=reader.ServiceOptions(address=dispatcher.target, timeout_seconds=30)
        )
        steps = iter(dataset)
        seen = collections.Counter()
        for _ in range(5):
            seen.update(next(steps)["id"].tolist())
        dispatcher.stop()
        back = threading.Timer(
            1.0, lambda: restarted.append(DispatchServer(DispatcherConfig(port=port, work_dir=work_dir)).start())
        )
        back.start()
        for step in steps:
            seen.update(step["id"].tolist())
        back.join()
        assert seen == {i: 1 for i in range(2000)}
        assert warnings_about(caplog, "unreachable"), "the wait for the dispatcher was not logged"
    finally:
        for worker in workers:
            worker.stop()
        for server in [dispatcher, *restarted]:
            server.stop()


def test_a_worker_the_dispatcher_refuses_exits_non_zero_saying_why(tmp_path):
    dispatcher = DispatchServer(DispatcherConfig(security=ServerSecurity(auth_token="right"))).start()
    wrong = tmp_path / "wrong-token"
    wrong.write_text("wrong\n")
    try:
        worker, _, _ = start_process("worker", f"--dispatcher={dispatcher.target}", f"--auth_token_file={wrong}")
        assert worker.wait(timeout=60) == 2
        error = worker.stderr.read()
        assert "refused it (UNAUTHENTICATED" in error and "--auth_token_file" in error, error[-2000:]
        assert status(dispatcher.target, token="right")["workers"] == []
    finally:
        dispatcher.stop()


def test_a_drained_worker_leaves_status_and_a_parallel_job_read_to_the_end_is_finished(cluster, range_root):
    dispatcher, workers = cluster
    dataset = reader.distributed_dataset(
        range_root / "range10",
        4,
        service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs", job_name="all"),
    )
    assert ids_of(dataset) == {i: 2 for i in range(10)}
    (job,) = [job for job in status(dispatcher.target)["jobs"] if job["job_name"] == "all"]
    assert job["finished"] and list(job["consumers"].values()) == [{"streams_read": True}], job
    workers[0].stop()
    assert status(dispatcher.target)["workers"] == [workers[1].target], "a drained worker is no longer listed"


def test_a_relative_snapshot_path_inside_the_allowed_roots_is_read(range_root, monkeypatch):
    roots = f"--allowed_roots={range_root}"
    dispatcher, target, _ = start_process("dispatcher", "--port=0", roots)
    worker, _, _ = start_process("worker", f"--dispatcher={target}", roots)
    try:
        wait_for_workers(target, 1)
        monkeypatch.chdir(range_root)  # the servers' working directory is another one
        assert ids_of(reader.distributed_dataset("range10", 4, service=target)) == {i: 1 for i in range(10)}
    finally:
        for process in (worker, dispatcher):
            process.terminate()
            process.wait(timeout=30)


def test_a_worker_stopping_after_its_dispatcher_says_so_in_one_line(caplog):
    dispatcher = DispatchServer().start()
    worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start()
    wait_for_workers(dispatcher.target, 1)
    dispatcher.stop()
    caplog.set_level(logging.WARNING, logger="reader.service")
    worker.stop()
    (said,) = warnings_about(caplog, "could not tell the dispatcher")
    assert "\n" not in said and "UNAVAILABLE" in said and dispatcher.target in said, said
