import os

import pytest

from schemas.tft_import import import_tft
from tests import helpers

# Object-store emulator fixtures (s3_bucket, gcs_bucket, object_store) for every test package, and every thread's
# stack printed before a test's timeout.
pytest_plugins = ["tests.object_store_fixtures", "tests.stack_dumps"]

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# The tests' tf.Transform functions import tensorflow-transform the way users' do, which on its first import sets
# TF_USE_LEGACY_KERAS=1 for this process and every subprocess it starts; imported here first, through the job's and
# the reader's guard, it leaves the Keras 3 tests (and the docs' programs) on Keras 3, as a user's trainer is.
import_tft("the tests' tf.Transform functions")


@pytest.fixture(scope="session")
def tfrecord_input(tmp_path_factory):
    """3000 tf.Examples with unique ids in 3 files, plus their TFMD schema."""
    directory = tmp_path_factory.mktemp("raw")
    helpers.write_tfrecords(directory, num_rows=3000, num_files=3)
    schema = helpers.write_schema(directory / "schema.pbtxt")
    return {"pattern": str(directory / "*.tfrecord"), "schema": str(schema), "dir": directory}


@pytest.fixture
def repo_on_pythonpath(monkeypatch):
    """Worker subprocesses (multi_processing runner) must import tests.prep_functions too."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(helpers.REPO_ROOT), os.environ.get("PYTHONPATH", "")]))


#: The per-test timeout of a test marked slow that carries no timeout mark of its own (the default is pyproject's).
SLOW_TIMEOUT = 1200


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def pytest_configure(config):
    """Two logical CPU devices, so MirroredStrategy tests have two replicas without a GPU.

    Must run before TensorFlow initializes its runtime, hence here and not in a fixture.
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)


@pytest.fixture(scope="session")
def strategy():
    """One MirroredStrategy over the two logical CPUs for the whole session.

    Two strategies in one process hand out the same collective instance keys,
    so Keras models trained under each abort with a shape mismatch.
    """
    import tensorflow as tf

    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    assert len(devices) == 2, "pytest_configure sets up two logical CPUs"
    return tf.distribute.MirroredStrategy(devices)
