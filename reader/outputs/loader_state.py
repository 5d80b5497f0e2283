"""One reader state for a DataLoader's workers: where the steps the training loop received leave the epoch.

With ``num_workers=K`` (K > 1) loader worker ``w`` of rank ``r`` reads as input pipeline ``r*K + w`` of
``world*K`` (``reader.outputs.torch_dataset``), every worker takes the same number of steps per epoch, and
the loader hands their steps over in turn: worker 0, 1, ..., K-1, 0, ... So after ``n`` steps of the
loop, workers ``w < n % K`` have delivered one step more than the others, and as every DDP rank's loop is
at the same ``n``, worker ``w`` of every rank is where this rank's worker ``w`` is. Each worker's state
after a step travels with that step (what it prefetched beyond does not count); this module makes one
state of the K: a worker's own when all are at one position, else the rest of the epoch as a remainder
(``reader.core.elastic``), which every pipeline of this topology or any other reads once. Pure logic.
"""

from __future__ import annotations

from collections.abc import Sequence

from reader.core.elastic import Remainder, Topology, epoch_cut, remainder_cut
from schemas.errors import UsageError


def loader_state(states: Sequence[dict], block_rows: Sequence[Sequence[int]]) -> dict:
    """One state restoring every pipeline, from ``states``: this rank's workers' states, in worker order."""
    position = [(state["epoch"], state["step"], state["finished"]) for state in states]
    if len(set(position)) == 1:
        return states[0]
    if len({state["seed"] for state in states}) > 1:
        raise UsageError(
            f"state_dict() after a step of some of the {len(states)} loader workers but not of the others: "
            f"each drew its own seed (seed=None), so no one state says where they all are; pass seed=<int> "
            f"to distributed_dataset"
        )
    behind = states[-1]  # the last worker is among those a step behind (n % K < K)
    topology = Topology.from_json(behind["topology"])
    if topology.shared:
        raise UsageError(
            f"state_dict() with shard_policy={topology.streams.policy.value} after a step of some of the "
            f"{len(states)} loader workers but not of the others: their slices of one shared stream make no one "
            f"state; call it after a multiple of num_workers={len(states)} steps, or use shard_policy AUTO or FILE"
        )
    epoch, step, saved = behind["epoch"], behind["step"], behind["remainder"]
    if saved is None:
        cut, base = epoch_cut(topology, block_rows), topology.streams
    else:
        remainder = Remainder.from_json(epoch, saved)
        cut, base = remainder_cut(topology, remainder.segments), remainder.base
    ahead = [int(mine != position[-1]) for mine in position]
    left = cut.left_after([step + ahead[pipeline % len(states)] for pipeline in range(topology.pipelines)])
    if not left:  # those behind have only empty steps left of the epoch
        return states[0]
    remainder = Remainder(epoch, base, left).to_json()
    return {**behind, "step": 0, "finished": False, "seed_shared": True, "remainder": remainder}
