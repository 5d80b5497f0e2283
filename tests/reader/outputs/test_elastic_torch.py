"""PyTorch resume: ``dataset.to_torch().loader(...)``'s ``state_dict()`` is the position of the steps the loop
received (not what workers prefetched), and ``load_state_dict()`` resumes it on another world size or number
of loader workers: the rest of the epoch exactly once, equal steps per rank; DDP ranks in real processes."""

import collections
import json

import pytest

import reader
from reader.outputs.loader_state import loader_state
from testing.ports import free_port
from tests import helpers

torch = pytest.importorskip("torch")

ROWS = 2000  # uneven_snapshot: ids 0..1999
DEADLINE_S = 240


def torch_dataset(path, batch, *, context=None, seed=5, **kwargs):
    data = reader.distributed_dataset(
        path, batch, output="torch", seed=seed, columns=["id"], input_context=context, **kwargs
    )
    return data.to_torch()


def ids(steps):
    return [i for step in steps for i in step["id"].tolist()]


def exactly_once(rows):
    counts = collections.Counter(rows)
    assert max(counts.values()) == 1, [row for row, n in counts.items() if n > 1][:10]
    assert sorted(counts) == list(range(ROWS))


def test_the_state_round_trips_through_json_and_resumes_with_another_batch(uneven_snapshot):
    loader = torch_dataset(uneven_snapshot, 64).loader()
    steps = iter(loader)
    head = ids(next(steps) for _ in range(5))
    state = json.loads(json.dumps(loader.state_dict()))
    assert (state["epoch"], state["step"]) == (0, 5), "the steps received, not the prefetched ones"
    other = torch_dataset(uneven_snapshot, 100).loader()
    other.load_state_dict(state)
    assert other.state_dict() == state
    rest = ids(other)
    exactly_once(head + rest)
    assert other.state_dict()["epoch"] == 1
    assert sorted(ids(other)) == list(range(ROWS)), "the next iteration is the next epoch, whole"


def test_a_state_after_the_last_step_resumes_with_the_next_epoch(uneven_snapshot):
    loader = torch_dataset(uneven_snapshot, 64).loader()
    first = ids(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["step"], state["stop_epoch"]) == (1, 0, 1)
    again = torch_dataset(uneven_snapshot, 64).loader()
    again.load_state_dict(state)
    second = ids(again)
    assert sorted(second) == list(range(ROWS)) and second != first, "epoch 1, not an empty iteration"


def test_a_wrong_state_is_refused_in_the_training_process_with_one_line(uneven_snapshot):
    state = torch_dataset(uneven_snapshot, 64).loader().state_dict()
    other_seed = torch_dataset(uneven_snapshot, 64, seed=6).loader()
    with pytest.raises(reader.UsageError) as refused:
        other_seed.load_state_dict(state)
    assert "seed=5" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(reader.UsageError, match="no batch_size or collate_fn"):
        torch_dataset(uneven_snapshot, 64).loader(batch_size=4)


def worker_iterators(path, world, rank, workers, batch, **kwargs):
    """What ``workers`` loader workers of DDP rank ``rank`` read: pipeline rank*k + w of world*k, batch x k."""
    pipelines = world * workers
    return [
        iter(
            reader.distributed_dataset(
                path,
                batch * workers,
                input_context=reader.InputContext(pipelines, rank * workers + w, pipelines),
                num_epochs=1,
                columns=["id"],
                **{"seed": 5, **kwargs},
            )
        )
        for w in range(workers)
    ]


@pytest.mark.parametrize("received", [6, 7, 8], ids=str)
def test_workers_a_step_apart_make_one_state_of_the_rest_of_the_epoch(uneven_snapshot, received):
    """2 ranks x 3 workers after ``received`` loop steps (the loader takes the workers' steps in turn): rank 0's
    workers' states make one state, which 3 pipelines with another batch read the rest of the epoch from."""
    seen, states = [], None
    for rank in range(2):
        iterators = worker_iterators(uneven_snapshot, 2, rank, 3, 32)
        for n in range(received):
            seen += next(iterators[n % 3])["id"].tolist()
        if rank == 0:
            states = [iterator.get_state() for iterator in iterators]
    state = json.loads(json.dumps(loader_state(states, reader.open_snapshot(uneven_snapshot).block_rows)))
    assert (state["remainder"] is None) == (received % 3 == 0)
    rest = []
    for pipeline in range(3):
        data = reader.distributed_dataset(
            uneven_snapshot, 90, input_context=reader.InputContext(3, pipeline, 3), seed=5, columns=["id"]
        )
        iterator = iter(data)
        iterator.set_state(state)
        rest.append([step["id"].tolist() for step in iterator])
    assert len({len(steps) for steps in rest}) == 1, "equal steps per new pipeline"
    exactly_once(seen + [i for steps in rest for step in steps for i in step])


@pytest.mark.parametrize(
    "options, says", [({"shard_policy": "DATA"}, "multiple of num_workers=2"), ({"seed": None}, "seed=<int>")]
)
def test_workers_a_step_apart_that_make_no_one_state_are_refused_in_one_line(uneven_snapshot, options, says):
    iterators = worker_iterators(uneven_snapshot, 1, 0, 2, 32, **options)
    next(iterators[0])
    with pytest.raises(reader.UsageError, match=says) as refused:
        loader_state([it.get_state() for it in iterators], reader.open_snapshot(uneven_snapshot).block_rows)
    assert "\n" not in str(refused.value)


@pytest.mark.slow  # spawns 2 loader workers: about 10 s on 2 loaded cores
@pytest.mark.parametrize("received", [4, 5], ids=["workers-even", "workers-a-step-apart"])
def test_loader_workers_state_resumes_on_one_process_exactly_once(uneven_snapshot, received):
    """2 workers (2 pipelines): after 5 steps worker 0 is a step ahead of worker 1, which one state says."""
    loader = torch_dataset(uneven_snapshot, 64).loader(num_workers=2, multiprocessing_context="spawn")
    steps = iter(loader)
    head = ids(next(steps) for _ in range(received))
    state = json.loads(json.dumps(loader.state_dict()))
    del steps
    assert state["topology"]["pipelines"] == 2
    assert (state["remainder"] is not None) == (received % 2 != 0)
    again = torch_dataset(uneven_snapshot, 100).loader()
    again.load_state_dict(state)
    exactly_once(head + ids(again))


def train_rank(rank, world, path, port, workers, state_path, steps, out):
    """One DDP rank: ``steps`` steps (-1: to the epoch's end) of a tiny model, from ``state_path`` if any."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    loader = (
        reader.distributed_dataset(path, 48, output="torch", seed=9, columns=["id"])
        .to_torch()
        .loader(num_workers=workers)
    )
    if state_path:
        with open(state_path) as file:
            loader.load_state_dict(json.load(file))
    seen = []
    for step in loader:
        model(step["id"].float()[:, None]).sum().backward()  # all-reduces: a rank a step short would hang
        seen.append(step["id"].tolist())
        if len(seen) == steps:
            break
    with open(out, "w") as file:
        json.dump({"steps": seen, "state": loader.state_dict()}, file)
    dist.destroy_process_group()


def _rank_entry(rank, world, path, port, workers, state_path, steps, outputs):
    train_rank(rank, world, path, port, workers, state_path, steps, outputs[rank])


def run_ranks(tmp_path, name, world, *args):
    outputs = [str(tmp_path / f"{name}{rank}.json") for rank in range(world)]
    return helpers.run_ranks(_rank_entry, (world, *args[:1], free_port(), *args[1:], outputs), outputs, DEADLINE_S)


@pytest.mark.slow  # 6 DDP ranks and 8 loader workers: about 90 s on 2 loaded cores
def test_ddp_world_size_4_with_workers_resumes_on_world_size_2(uneven_snapshot, tmp_path):
    """4 ranks x 2 loader workers take 5 steps (worker 0 a step ahead); rank 0's state resumes 2 ranks x 1."""
    before = run_ranks(tmp_path, "four", 4, uneven_snapshot, 2, "", 5)
    assert all(len(rank["steps"]) == 5 for rank in before)
    state = tmp_path / "rank0.json"
    state.write_text(json.dumps(before[0]["state"]))
    after = run_ranks(tmp_path, "two", 2, uneven_snapshot, 0, str(state), -1)
    assert len(after[0]["steps"]) == len(after[1]["steps"]) > 0, "equal steps per rank"
    exactly_once([i for rank in before + after for step in rank["steps"] for i in step])
    assert after[0]["state"]["epoch"] == 1


@pytest.mark.slow  # 3 DDP ranks and 4 loader workers: about 40 s on 2 loaded cores
def test_the_elastic_resume_example_finishes_the_epoch_on_one_rank(uneven_snapshot):
    completed = helpers.run_module("examples.elastic_resume_torch", uneven_snapshot, "--steps", "5", timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.splitlines() == [
        "world size 2 x 2 loader workers: 5 steps per rank, 320 rows, then stopped",
        "world size 1, resumed: 27 steps, 1680 rows",
        "epoch 0: 2000 of 2000 rows",
    ]
