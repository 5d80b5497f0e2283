"""tf.Transform preprocessing functions the tests run through the job (``--tft_preprocessing_fn``)."""

import csv
import os
import pathlib
import time

import apache_beam as beam
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

#: A directory where ``held_in_analysis`` leaves ``analyzing-<pid>`` and waits for ``release`` (the tests set it).
BARRIER_ENV = "SNAPFEED_TEST_ANALYSIS_BARRIER"

#: Quantile buckets of ``bucketize`` below.
BUCKETS = 4


def iris(inputs):
    """Every analyzer the tests check against NumPy, over the bundled iris CSV."""
    return {
        "sepal_length_z": tft.scale_to_z_score(inputs["sepal_length"]),
        "sepal_width_01": tft.scale_to_0_1(inputs["sepal_width"]),
        "petal_length_bucket": tft.bucketize(inputs["petal_length"], BUCKETS),
        "species_id": tft.compute_and_apply_vocabulary(
            tf.strings.as_string(inputs["species"]), vocab_filename="species"
        ),
        "petal_width": inputs["petal_width"],
    }


def digits(inputs):
    """Over the bundled digits tf.Examples (pixels int64[64], label): a z-scored image and a label vocabulary."""
    pixels = tf.cast(inputs["pixels"], tf.float32)
    return {
        "image": tf.reshape(tft.scale_to_z_score(pixels), [-1, 8, 8, 1]),
        "label": inputs["label"],
        "label_id": tft.compute_and_apply_vocabulary(tf.strings.as_string(inputs["label"]), vocab_filename="labels"),
    }


def reads_a_missing_feature(inputs):
    return {"x": tft.scale_to_z_score(inputs["no_such_feature"])}


def vocabulary_of_floats(inputs):
    return {"x": tft.compute_and_apply_vocabulary(inputs["x"])}


#: How often each category occurs: the vocabulary orders them by it.
FREQUENCIES = {"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}


def write_categories_csv(path, rows: int, seed: int = 7) -> dict[str, np.ndarray]:
    """A CSV of ``id, x, y, category`` and its columns as NumPy arrays (what the analyzers see, in float32)."""
    generator = np.random.default_rng(seed)
    columns = {
        "id": np.arange(rows, dtype=np.int64),
        "x": generator.normal(3.0, 2.0, rows).astype(np.float32),
        "y": generator.exponential(5.0, rows).astype(np.float32),
        "category": np.repeat(list(FREQUENCIES), [round(rows * f) for f in FREQUENCIES.values()]),
    }
    generator.shuffle(columns["category"])
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(columns)
        for row in zip(*columns.values(), strict=True):
            writer.writerow([row[0], repr(float(row[1])), repr(float(row[2])), row[3]])
    return columns


def categories(inputs):
    """The analyzers the job tests check against NumPy: z-score, 0-1 scaling, quantile buckets, a vocabulary."""
    return {
        "id": inputs["id"],
        "x_z": tft.scale_to_z_score(inputs["x"]),
        "y_01": tft.scale_to_0_1(inputs["y"]),
        "y_bucket": tft.bucketize(inputs["y"], BUCKETS),
        "category_id": tft.compute_and_apply_vocabulary(inputs["category"], vocab_filename="category"),
    }


def _hold(batch, directory: str):
    """Leaves ``analyzing-<pid>`` in ``directory`` and waits there until ``release`` exists (600 s at most)."""
    folder = pathlib.Path(directory)
    (folder / f"analyzing-{os.getpid()}").touch()
    deadline = time.monotonic() + 600
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(batch[0])


class _HoldAnalysis(beam.PTransform):
    """An analyzer's own Beam step (``tft.experimental.ptransform_analyzer``) that holds the Analyze phase."""

    def expand(self, batches):
        directory = os.environ[BARRIER_ENV]
        return (
            batches
            | "Hold" >> beam.Map(_hold, directory)
            | "Rows" >> beam.CombineGlobally(sum)
            | "AsArray" >> beam.Map(lambda rows: np.array(rows, np.int64))
        )


def held_in_analysis(inputs):
    """``categories`` plus an analyzer that waits at the barrier: a signal sent then lands in the Analyze phase."""
    (rows,) = tft.experimental.ptransform_analyzer([inputs["x"]], _HoldAnalysis(), [tf.int64], [[]])
    outputs = categories(inputs)
    outputs["rows_analyzed"] = tf.fill(tf.shape(inputs["id"]), rows)
    return outputs
