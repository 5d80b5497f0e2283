"""`make demo`: materialize the bundled digits data, read it back, print a summary; then the full pass.

Runs the real job (DirectRunner, local disk) twice, the second time showing
that an identical run reuses the finalized snapshot, then verifies every
shard's CRC32C and reads it back with the reader (shuffled, 2 replicas).
Then materializes the bundled iris CSV through a tf.Transform function
(``examples/iris_tft.py``: z-scores, quartiles, a vocabulary) and prints what
its analyzers found, from the graph committed with the snapshot.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

import numpy as np

import reader
from beam_jobs import materialize
from schemas import storage

DIGITS = pathlib.Path(__file__).parent / "data" / "digits"
IRIS = pathlib.Path(__file__).parent / "data" / "iris" / "iris.csv"


def read_back(snapshot_path: str) -> None:
    """The training side: verify the snapshot, then read it shuffled in batches over 2 replicas."""
    snapshot = reader.open_snapshot(snapshot_path)
    checked = snapshot.verify()
    labels: collections.Counter = collections.Counter()
    dataset = reader.distributed_dataset(snapshot, global_batch_size=256, num_replicas=2, seed=0)
    first_image = None
    for step in dataset:
        for replica_batch in step:
            labels.update(replica_batch["label"].tolist())
            if first_image is None:
                first_image = replica_batch["image"][0]
    print(
        f"verified {checked} shards; read {sum(labels.values())} rows in {dataset.steps_per_epoch} steps x 2 replicas"
    )
    for name, spec in snapshot.element_spec.items():
        print(f"  column {name}: {spec.dtype}{list(spec.shape[1:])}")
    print(f"  labels: {dict(sorted(labels.items()))}")
    print("  first shuffled image (x16, rounded):")
    for row in np.rint(first_image[:, :, 0] * 16).astype(int):
        print("   " + " ".join(f"{v:2d}" for v in row))


def full_pass(output: str) -> None:
    """tf.Transform over the iris CSV: the analyzers' results and the first transformed rows."""
    result = materialize.run(
        [
            f"--input={IRIS}",
            "--input_format=csv",
            "--tft_preprocessing_fn=examples.iris_tft:preprocessing_fn",
            f"--output={output}",
        ]
    )
    print(result.summary())
    snapshot = reader.open_snapshot(result.path)
    summary = json.loads(storage.read_bytes(f"{snapshot.run_dir}/transform_summary.json"))
    print("  what the analyzers found (snapfeed show lists the same):")
    for analyzer in summary["analyzers"]:
        value = analyzer["value"]
        shown = [round(v, 3) for v in value] if isinstance(value, list) else round(value, 3)
        print(f"    {analyzer['input']}: {analyzer['label']} {shown}")
    print(f"    vocabulary species, most frequent first: {reader.vocabulary(snapshot, 'species')}")
    rows = next(iter(reader.distributed_dataset(snapshot, 3, shuffle=False)))
    print(
        f"  first rows: sepal_length_z {[round(float(v), 3) for v in rows['sepal_length_z']]}, "
        f"species_id {rows['species_id'].tolist()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default="out/demo")
    args = parser.parse_args()
    argv = [
        f"--input={DIGITS}/digits-*.tfrecord",
        "--input_format=tfrecord",
        f"--schema={DIGITS}/schema.pbtxt",
        "--preprocessing_fn=examples.digits_prep:preprocess",
        '--preprocessing_params={"scale": 0.0625}',
        f"--output={args.output}",
        "--shard_size_bytes=65536",
        "--block_size_bytes=16384",
    ]
    first = materialize.run(argv)
    print(first.summary())
    second = materialize.run(argv)
    print(second.summary())
    read_back(first.path)
    full_pass(str(pathlib.Path(args.output) / "iris-tft"))


if __name__ == "__main__":
    main()
