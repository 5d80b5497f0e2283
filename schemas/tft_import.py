"""Importing tensorflow-transform without switching the process's Keras.

tensorflow-transform 1.21 sets ``TF_USE_LEGACY_KERAS=1`` in ``os.environ``
when it is first imported (its ``keras_lib``), so a ``tf.keras`` first touched
after it is Keras 2: a Keras 3 training program that read a snapshot's graph
(``reader.transform_output``) or ran the job in-process would build its model
with another Keras than it was written for (``model.fit`` then refuses a
distributed dataset without ``steps_per_epoch``, among other differences).
``import_tft`` resolves ``tf.keras`` as the environment says first, imports
tensorflow-transform (which then uses the ``tf_keras`` package for its own
layer), and puts the variable back as it was. The job and the reader both
import it through here, the first import being the one that counts.
"""

from __future__ import annotations

import os

from schemas import extras
from schemas.errors import UsageError

LEGACY_KERAS = "TF_USE_LEGACY_KERAS"


def import_tft(needed_for: str):
    """The ``tensorflow_transform`` module, ``tf.keras`` left as it was; one line naming ``needed_for`` (what
    needs it, e.g. a flag) if the environment lacks it."""
    tf = extras.require("tensorflow", needed_for)
    extras.check("tensorflow_transform", needed_for)
    getattr(tf.keras, "version", None)  # resolves the lazy tf.keras now, before tensorflow-transform flips the variable
    before = os.environ.get(LEGACY_KERAS)
    try:
        import tensorflow_transform
    except ImportError as exc:  # installed, but one of its own dependencies is missing or broken
        raise UsageError(
            f"{needed_for} needs tensorflow-transform, which cannot be imported here ({exc}): "
            f"pip install 'snapfeed[job]'"
        ) from exc
    finally:
        if before is None:
            os.environ.pop(LEGACY_KERAS, None)
        else:
            os.environ[LEGACY_KERAS] = before
    return tensorflow_transform
