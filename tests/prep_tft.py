"""tf.Transform preprocessing functions the tests run through the job (``--tft_preprocessing_fn``)."""

import tensorflow as tf
import tensorflow_transform as tft

#: Quantile buckets of ``bucketize`` below.
BUCKETS = 4


def iris(inputs):
    """Every analyzer the tests check against NumPy, over the bundled iris CSV."""
    return {
        "sepal_length_z": tft.scale_to_z_score(inputs["sepal_length"]),
        "sepal_width_01": tft.scale_to_0_1(inputs["sepal_width"]),
        "petal_length_bucket": tft.bucketize(inputs["petal_length"], BUCKETS),
        "species_id": tft.compute_and_apply_vocabulary(tf.strings.as_string(inputs["species"]), vocab_filename="species"),
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
    return {"x": tft.compute_and_apply_vocabulary(inputs["sepal_length"])}
