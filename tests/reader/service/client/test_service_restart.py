"""A whole trainer killed (kill -9 of every consumer process) and restarted from its checkpoint, with the
dispatcher killed and restarted from its --work_dir meanwhile or not: exactly once against the checkpoint.

Rows handed out before the state was saved are not delivered again, rows handed out after it (lost with the
trainer's progress) are, every other row once; the next epoch is whole. Real processes on loopback, 10-25 s
each (slow); test_service_resume.py has the same in one process in the default suite.
"""

import collections
import json
import signal
import subprocess
import sys
import threading

import pytest

from tests import helpers
from tests.reader.service.probes import start_process, wait_for_workers

#: A consumer process: reads BEFORE steps, saves its state to STATE, reads AFTER steps (lost with the trainer),
#: then waits to be killed; or, given a state to restore, reads to the end of its epochs. Prints each step's ids
#: as [epoch or "before"/"after", ids].
CONSUMER = r"""
import json, sys, time
import reader
path, target, job, mode, before, after, state_file, restore = sys.argv[1:9]
service = reader.ServiceOptions(address=target, processing_mode=mode, job_name=job, timeout_seconds=60)
dataset = reader.distributed_dataset(path, 64, seed=5, num_epochs=2, service=service)
iterator = iter(dataset)
def emit(tag, step):
    print(json.dumps([tag, step["id"].tolist()]), flush=True)
if restore == "1":
    with open(state_file) as handle:
        iterator.set_state(json.load(handle))
    for step in iterator:
        emit(iterator.get_state()["epoch"], step)
    print(json.dumps(["finished", []]), flush=True)
else:
    for _ in range(int(before)):
        emit("before", next(iterator))
    with open(state_file, "w") as handle:
        json.dump(iterator.get_state(), handle)
    for _ in range(int(after)):
        emit("after", next(iterator))
    print(json.dumps(["parked", []]), flush=True)
    time.sleep(600)
"""

ALL = range(2000)


class Consumer:
    """A consumer process and the steps it printed, by tag."""

    def __init__(self, snapshot, target, job, mode, state_file, *, before=0, after=0, restore=False):
        self.process = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, str(snapshot), target, job, mode, str(before), str(after)]
            + [str(state_file), "1" if restore else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=helpers.cli_env(),
        )
        self.rows: dict = collections.defaultdict(collections.Counter)
        self._stderr: list[str] = []
        threading.Thread(target=lambda: self._stderr.extend(self.process.stderr), daemon=True).start()

    def read_until(self, last: str) -> None:
        for line in self.process.stdout:
            tag, ids = json.loads(line)
            if tag == last:
                return
            self.rows[tag].update(ids)
        raise AssertionError(f"consumer exited {self.process.wait()}: {''.join(self._stderr)[-3000:]}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


def train_then_crash(snapshot, target, job, mode, tmp_path, *, before=4, after=3):
    """Two consumers read ``before`` steps, save their states, read ``after`` more; then all are killed -9."""
    consumers = [
        Consumer(snapshot, target, job, mode, tmp_path / f"state{i}.json", before=before, after=after) for i in (0, 1)
    ]
    for consumer in consumers:
        consumer.read_until("parked")
    for consumer in consumers:
        consumer.kill()
    assert all(sum(c.rows["after"].values()) == 64 * after for c in consumers), "full steps after the save"
    return consumers


def resume(snapshot, target, job, mode, states):
    """Consumer processes restored from ``states`` (one each), read to the end of their two epochs."""
    consumers = [Consumer(snapshot, target, job, mode, state, restore=True) for state in states]
    for consumer in consumers:
        consumer.read_until("finished")
    return consumers


@pytest.fixture
def service(tmp_path):
    """A dispatcher process journaling to a work_dir (2 s leases), two worker processes; ``restart()`` kills -9
    the dispatcher and starts it again on the same port and work_dir."""

    class Service:
        work_dir = tmp_path / "dispatcher"
        flags = [f"--work_dir={tmp_path / 'dispatcher'}", "--lease_seconds=2"]

        def __init__(self):
            self.dispatcher, self.target, _ = start_process("dispatcher", "--port=0", *self.flags)
            self.workers = [start_process("worker", f"--dispatcher={self.target}")[0] for _ in range(2)]
            wait_for_workers(self.target, 2)

        def restart(self):
            self.dispatcher.send_signal(signal.SIGKILL)
            self.dispatcher.wait()
            port = self.target.rsplit(":", 1)[1]
            self.dispatcher, _, _ = start_process("dispatcher", f"--port={port}", *self.flags)
            wait_for_workers(self.target, 2)

    started = Service()
    yield started
    for process in [started.dispatcher, *started.workers]:
        process.send_signal(signal.SIGTERM)
    for process in [started.dispatcher, *started.workers]:
        process.wait(timeout=30)


def delivered(consumers, *tags) -> collections.Counter:
    return sum((c.rows[tag] for c in consumers for tag in tags), collections.Counter())


@pytest.mark.slow
@pytest.mark.parametrize("restart_dispatcher, resumed_consumers", [(False, 1), (True, 1), (False, 3), (True, 3)])
def test_a_killed_trainer_resumes_distributed_epoch_from_the_chiefs_state_exactly_once(
    service, uneven_snapshot, tmp_path, restart_dispatcher, resumed_consumers
):
    job = f"trainer-{restart_dispatcher}-{resumed_consumers}"
    crashed = train_then_crash(uneven_snapshot, service.target, job, "distributed_epoch", tmp_path)
    if restart_dispatcher:
        service.restart()
    chief_state = tmp_path / "state0.json"
    resumed = resume(uneven_snapshot, service.target, job, "distributed_epoch", [chief_state] * resumed_consumers)
    assert delivered(crashed, "before") + delivered(resumed, 0) == {i: 1 for i in ALL}, "the epoch, once"
    assert delivered(resumed, 1) == {i: 1 for i in ALL}, "the next epoch, whole"
    assert sum(bool(c.rows[1]) for c in resumed) >= min(2, resumed_consumers), "the next epoch is shared"


@pytest.mark.slow
def test_parallel_epochs_consumers_killed_resume_each_from_its_own_state(service, uneven_snapshot, tmp_path):
    crashed = train_then_crash(uneven_snapshot, service.target, "parallel", "parallel_epochs", tmp_path)
    service.restart()
    states = [tmp_path / "state0.json", tmp_path / "state1.json"]
    resumed = resume(uneven_snapshot, service.target, "parallel", "parallel_epochs", states)
    for before, after in zip(crashed, resumed, strict=True):
        assert before.rows["before"] + after.rows[0] == {i: 2 for i in ALL}, "each worker's stream once"
        assert after.rows[1] == {i: 2 for i in ALL}
