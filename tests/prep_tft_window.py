"""The tf.Transform function the window tests run over ``tests.helpers.write_tfrecords`` days."""

import tensorflow as tf
import tensorflow_transform as tft


def window(inputs):
    """A z-score (mean and variance over every day), a label vocabulary and the id passed through."""
    return {
        "features_z": tft.scale_to_z_score(inputs["features"]),
        "label_id": tft.compute_and_apply_vocabulary(tf.strings.as_string(inputs["label"]), vocab_filename="labels"),
        "id": inputs["id"],
    }
