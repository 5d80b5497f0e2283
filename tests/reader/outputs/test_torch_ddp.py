"""PyTorch DDP: two real processes (gloo on 127.0.0.1) train on the reader without hanging.

Each rank reads as input pipeline rank / world size of the process group, with
no input_context given; with DataLoader workers, each rank x worker is one
pipeline. 2000 rows do not divide by the global batch of 64: every rank still
takes the same number of steps, and every row arrives once per epoch.
"""

import dataclasses
import json

import pytest

import reader
from testing.ports import free_port
from tests import helpers

torch = pytest.importorskip("torch")

WORLD = 2
GLOBAL_BATCH = 64
ROWS = 2000
EPOCHS = 2
DEADLINE_S = 240


def train_rank(rank: int, path: str, port: int, num_workers: int, out: str) -> None:
    """One DDP rank: 2 epochs of a tiny model on the reader's steps; what it saw goes to ``out``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(48, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    dataset = reader.distributed_dataset(path, GLOBAL_BATCH, seed=5, columns=["id", "image"])
    loader = torch.utils.data.DataLoader(dataset.to_torch(), batch_size=None, num_workers=num_workers)
    epochs = []
    for epoch in range(EPOCHS):
        loader.dataset.set_epoch(epoch)
        ids = []
        steps = 0
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch["image"].float().flatten(1)).sum()  # a sum: a short last batch is fine
            loss.backward()  # all-reduces with the other rank: a rank with a step more would hang here
            optimizer.step()
            ids += batch["id"].tolist()
            steps += 1
        epochs.append({"ids": ids, "steps": steps})
    try:
        reader.distributed_dataset(path, GLOBAL_BATCH, input_context=reader.InputContext(3, rank, 3))
        refused = None
    except reader.UsageError as error:
        refused = str(error)
    with open(out, "w") as file:
        json.dump({"context": dataclasses.asdict(dataset.options.context), "epochs": epochs, "refused": refused}, file)
    dist.destroy_process_group()


def run_ranks(path, tmp_path, num_workers: int) -> list[dict]:
    outputs = [str(tmp_path / f"rank{rank}.json") for rank in range(WORLD)]
    return helpers.run_ranks(_rank_entry, (str(path), free_port(), num_workers, outputs), outputs, DEADLINE_S)


def _rank_entry(rank: int, path: str, port: int, num_workers: int, outputs: list[str]) -> None:
    train_rank(rank, path, port, num_workers, outputs[rank])


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_ddp_ranks_read_disjoint_parts_and_take_equal_steps(uneven_snapshot, tmp_path, num_workers):
    ranks = run_ranks(uneven_snapshot, tmp_path, num_workers)
    assert [rank["context"] for rank in ranks] == [
        {"num_input_pipelines": WORLD, "input_pipeline_id": rank, "num_replicas_in_sync": WORLD}
        for rank in range(WORLD)
    ]
    for epoch in range(EPOCHS):
        steps = [rank["epochs"][epoch]["steps"] for rank in ranks]
        assert steps[0] == steps[1] >= ROWS // GLOBAL_BATCH, "equal steps per rank, or DDP hangs"
        ids = [row for rank in ranks for row in rank["epochs"][epoch]["ids"]]
        assert sorted(ids) == list(range(ROWS)), "every row once per epoch across ranks"
    assert ranks[0]["epochs"][0]["ids"] != ranks[0]["epochs"][1]["ids"], "set_epoch: a fresh shuffle"
    for rank, result in enumerate(ranks):
        assert result["refused"] == (
            f"input_context says input pipeline {rank} of 3, but this is process {rank} of 2 in the "
            f"torch.distributed process group: every process would not read its own part once. Leave "
            f"input_context out (the reader takes the process group's) or make it match"
        )
