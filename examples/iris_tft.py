"""A tf.Transform preprocessing function for the bundled iris CSV: the full pass `make demo` runs.

Each measurement is z-scored with the mean and variance of the whole dataset,
the species become ids of a vocabulary ordered by frequency, and the petal
length is cut into quartiles. Materialize it with
``--tft_preprocessing_fn=examples.iris_tft:preprocessing_fn``.
"""

import tensorflow as tf
import tensorflow_transform as tft

MEASUREMENTS = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def preprocessing_fn(inputs):
    outputs = {f"{name}_z": tft.scale_to_z_score(inputs[name]) for name in MEASUREMENTS}
    outputs["petal_length_quartile"] = tft.bucketize(inputs["petal_length"], 4)
    outputs["species_id"] = tft.compute_and_apply_vocabulary(
        tf.strings.as_string(inputs["species"]), vocab_filename="species"
    )
    return outputs
