"""JAX elastic resume: 2 processes (jax.distributed on 127.0.0.1, CPU) read 5 steps of global arrays; the state
process 0 saved restores in 1 process, whose steps keep their sharding and deliver the rest of the epoch once."""

import os
import pathlib
import subprocess
import sys

import pytest

from testing.ports import free_port
from tests.reader.outputs.test_jax_sharding import BATCH, ROOT, ROWS, facts

pytest.importorskip("jax")

PROGRAM = pathlib.Path(__file__).with_name("jax_elastic_program.py")


def run_program(*arguments: str) -> subprocess.Popen:
    devices = "--xla_force_host_platform_device_count=4"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": devices, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(PROGRAM), *arguments], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow  # 3 JAX processes: about 15 s on 2 loaded cores
def test_two_processes_state_resumes_in_one_with_sharded_global_arrays(uneven_snapshot, tmp_path):
    state, port = str(tmp_path / "state.json"), str(free_port())
    saving = [run_program("save", uneven_snapshot, port, str(i), state) for i in (0, 1)]
    before = [facts(process) for process in saving]
    after = facts(run_program("resume", uneven_snapshot, state))
    assert [out["processes"] for out in before + [after]] == [2, 2, 1]
    steps = [step for out in before + [after] for step in out["steps"]]
    assert all(step["sharded"] and step["images_match"] and step["shapes"]["id"] == [BATCH] for step in steps)
    ids = [row for step in steps for row in step["ids"]]
    assert sorted(ids) == list(range(ROWS)), "the rest of the epoch exactly once"
    assert len(after["steps"]) == -(-(ROWS - 5 * BATCH) // BATCH), "the rest in full global batches of one process"
