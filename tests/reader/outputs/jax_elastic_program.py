"""A JAX program for tests/reader/outputs/test_elastic_jax.py: part of an epoch on 2 processes, then the rest on 1.

    python jax_elastic_program.py save SNAPSHOT PORT PROCESS_ID STATE_FILE   (2 processes x 4 host devices)
    python jax_elastic_program.py resume SNAPSHOT STATE_FILE                 (1 process, 4 host devices)

Prints one JSON object: what each step held (``jax_sharding_program.describe``).
"""

import json
import sys

import jax

from tests.reader.outputs.jax_sharding_program import describe, read, sharding_of

STEPS = 5


def save(path: str, port: str, process_id: str, state_file: str) -> dict:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
    sharding = sharding_of((8,))
    steps = iter(read(path, sharding, num_epochs=1))
    head = [describe(next(steps), sharding) for _ in range(STEPS)]
    if jax.process_index() == 0:  # the chief's checkpoint
        with open(state_file, "w") as file:
            json.dump(steps.get_state(), file)
    return {"processes": jax.process_count(), "steps": head}


def resume(path: str, state_file: str) -> dict:
    sharding = sharding_of((4,))
    steps = iter(read(path, sharding, num_epochs=1))
    with open(state_file) as file:
        steps.set_state(json.load(file))
    return {"processes": jax.process_count(), "steps": [describe(step, sharding) for step in steps]}


if __name__ == "__main__":
    scenario, *arguments = sys.argv[1:]
    print(json.dumps({"save": save, "resume": resume}[scenario](*arguments)))
