"""``output="jax", placement=PlacementOptions(sharding=...)``: global arrays on a mesh of host devices, in one
process and in two.

JAX fixes its devices and processes when it starts, so each scenario is one
program (tests/reader/outputs/jax_sharding_program.py) in a subprocess, checking
several things per run; the assertions are here.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from testing.ports import free_port
from tests import helpers

pytest.importorskip("jax")

PROGRAM = pathlib.Path(__file__).with_name("jax_sharding_program.py")
ROOT = PROGRAM.parents[3]  # the repository
ROWS = 2000  # uneven_snapshot: not a multiple of the batch (64), so the last step is padded
BATCH = 64


def run_program(*arguments: str, devices: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, str(PROGRAM), *arguments], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def facts(process: subprocess.Popen, timeout: float = 240) -> dict:
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def clash_snapshot(tmp_path_factory):
    """A snapshot with a column named like the mask."""
    batch = {"id": np.arange(8, dtype=np.int64), "__valid__": np.ones(8, dtype=np.int64)}
    return helpers.write_snapshot(tmp_path_factory.mktemp("clash"), "clash", [batch])


@pytest.fixture(scope="module")
def single_process(uneven_snapshot, clash_snapshot):
    return facts(run_program("single", uneven_snapshot, clash_snapshot, devices=8))


def assert_epoch_of_global_arrays(steps: list[dict], *, padded: bool) -> None:
    keys = ["__valid__", "id", "image", "value"] if padded else ["id", "image", "value"]
    for step in steps:
        assert step["keys"] == keys
        assert step["sharded"]
        assert step["images_match"]
        assert step["shapes"]["id"] == [BATCH] and step["shapes"]["image"] == [BATCH, 4, 4, 3]
    ids = [row for step in steps for row in step["ids"]]
    if padded:
        assert len(steps) == -(-ROWS // BATCH)
        assert sorted(ids) == list(range(ROWS))
        assert [len(step["padding"]) for step in steps] == [0] * (len(steps) - 1) + [BATCH - ROWS % BATCH]
        assert set(steps[-1]["padding"]) == {0}  # padding rows are zeros
    else:
        assert len(steps) == ROWS // BATCH
        assert len(ids) == len(set(ids)) == ROWS // BATCH * BATCH


@pytest.mark.parametrize("mesh", ["mesh8", "mesh4x2"])
def test_steps_are_global_arrays_with_the_sharding_and_every_row_once(single_process, mesh):
    assert_epoch_of_global_arrays(single_process[mesh], padded=True)


def test_drop_remainder_drops_the_partial_step_and_has_no_mask(single_process):
    assert_epoch_of_global_arrays(single_process["mesh4x2_dropped"], padded=False)


@pytest.mark.parametrize("run", ["resume", "resume_prefetched"])
def test_a_restored_reader_repeats_and_skips_nothing(single_process, run):
    """With prefetch_to_device=2 the steps made ahead of the consumer are read again after the restore."""
    ids = single_process[run]
    assert ids["resumed"] == ids["straight"]
    assert len(ids["straight"]) == 2 * -(-ROWS // BATCH)


def test_element_spec_is_the_global_step(single_process):
    spec = single_process["element_spec"]
    assert spec["padded"] == {
        "__valid__": [[BATCH], "bool"],
        "id": [[BATCH], "int64"],
        "image": [[BATCH, 4, 4, 3], "uint8"],
        "value": [[BATCH], "float32"],
    }
    assert spec["dropped"] == {name: value for name, value in spec["padded"].items() if name != "__valid__"}


def test_map_fn_runs_on_the_steps_global_arrays(single_process):
    assert single_process["mapped"] == ["n"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("indivisible", r"global_batch_size=60 .*mesh axes \{'data': 8\}.* multiple of 8"),
        ("replicas", r"2 replicas per process: leave num_replicas= out"),
        ("strings", r"columns \['payload'\] are strings, bytes or variable-length lists.*columns=\["),
        ("clash", r"mask column '__valid__'.*has a column of that name"),
        ("not_a_sharding", r"give a jax.sharding.Sharding"),
        ("rank", r"does not fit column 'id', whose rows have shape \(\): it partitions more axes than the column's 1"),
        ("processes", r"cuts the batch into 8 parts, 8 of them on this process's devices.* 2 input pipelines"),
    ],
)
def test_bad_placement_is_refused_when_the_dataset_is_built(single_process, case, message):
    error = single_process["errors"][case]
    assert error is not None, f"{case}: no error"
    assert re.search(message, error), error


@pytest.fixture(scope="module")
def two_processes(uneven_snapshot):
    port = str(free_port())
    programs = [run_program("multi", uneven_snapshot, port, str(index), devices=4) for index in range(2)]
    return [facts(program) for program in programs]


def test_two_processes_default_to_their_jax_process_index_and_count(two_processes):
    assert [process["context"] for process in two_processes] == [[2, 0, 2], [2, 1, 2]]
    assert [process["devices"] for process in two_processes] == [[4, 8], [4, 8]]
    assert all("this is process" in process["other_context"] for process in two_processes)


@pytest.mark.parametrize("run", ["auto", "data_policy"])
def test_two_processes_make_global_arrays_and_read_every_row_once(two_processes, run):
    """Each process's shards hold its own rows; together they are the epoch, in equal numbers of steps.

    With DATA the last global batch (16 rows) falls wholly in process 0's half: process 1's share is
    all padding.
    """
    epochs = [process[run] for process in two_processes]
    assert len(epochs[0]) == len(epochs[1]) == -(-ROWS // BATCH)
    for steps in epochs:
        for step in steps:
            assert step["sharded"] and step["images_match"] and step["shapes"]["id"] == [BATCH]
    ids = [row for steps in epochs for step in steps for row in step["ids"]]
    assert sorted(ids) == list(range(ROWS))
    if run == "data_policy":
        assert [len(steps[-1]["ids"]) for steps in epochs] == [ROWS % BATCH, 0]
