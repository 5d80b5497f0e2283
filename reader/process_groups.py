"""Which input pipeline this process is, from the framework's process group.

Multi-process training already says how many processes there are and which
one this is: a ``torch.distributed`` process group (DDP: rank / world size) or
a multi-process JAX program (``jax.process_index()`` / ``jax.process_count()``).
Without an explicit ``input_context=`` the reader takes that, so every rank
reads a disjoint part of the snapshot and takes the same number of steps; an
explicit context that disagrees with the process group would duplicate or drop
rows, so it is refused before the first step.

Frameworks are looked up, never imported: a NumPy user pays nothing, and JAX
is asked only when its output is (``jax.process_count()`` starts its backends).
"""

from __future__ import annotations

import sys

from reader.core.plan import InputContext
from schemas.errors import UsageError


def _torch_group() -> tuple[int, int] | None:
    """(rank, world size) of an initialized ``torch.distributed`` default group, else None."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    return distributed.get_rank(), distributed.get_world_size()


def _jax_processes(output: str) -> tuple[int, int] | None:
    """(process index, process count) of a JAX program with several processes, when reading for JAX."""
    if output != "jax" or "jax" not in sys.modules:
        return None
    import jax

    count = jax.process_count()
    return (jax.process_index(), count) if count > 1 else None


def _group(output: str) -> tuple[str, int, int] | None:
    if (torch_group := _torch_group()) is not None:
        return ("torch.distributed", *torch_group)
    if (jax_group := _jax_processes(output)) is not None:
        return ("JAX", *jax_group)
    return None


def default_context(output: str) -> InputContext:
    """One input pipeline (and one replica's batch) per process of the running process group, else one pipeline."""
    group = _group(output)
    if group is None:
        return InputContext()
    _, index, count = group
    return InputContext(num_input_pipelines=count, input_pipeline_id=index, num_replicas_in_sync=count)


def check_context(context: InputContext, output: str) -> None:
    """Refuses an explicit input context whose pipelines are not the process group's processes."""
    group = _group(output)
    if group is None:
        return
    framework, index, count = group
    if (context.num_input_pipelines, context.input_pipeline_id) != (count, index):
        raise UsageError(
            f"input_context says input pipeline {context.input_pipeline_id} of {context.num_input_pipelines}, "
            f"but this is process {index} of {count} in the {framework} process group: every process would not "
            f"read its own part once. Leave input_context out (the reader takes the process group's) or make it match"
        )
