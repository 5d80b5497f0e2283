import json
import subprocess
import sys

from schemas import fingerprint
from schemas.snapshot_pb2 import InputFile
from tests.helpers import REPO_ROOT

_SCRIPT = """
import json
from schemas import fingerprint
from schemas.snapshot_pb2 import InputFile
from tests import prep_functions
components = fingerprint.build_components(
    input_format="tfrecord", input_patterns=["b/*", "a/*"], fingerprint_inputs="stat",
    input_files=[InputFile(path=p, size_bytes=len(p), identity="mtime_ns:1") for p in ("z", "a", "m")],
    preprocessing_fn=prep_functions.normalize,
    preprocessing_params={"scale": 2, "names": {"b": 1, "a": 2, "c": [1, 2]}},
)
print(fingerprint.fingerprint(components))
"""


def _fingerprint_in_process(seed: str) -> str:
    env = {"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_equal_across_processes_and_hash_seeds():
    values = {_fingerprint_in_process(seed) for seed in ("0", "1", "12345", "random")}
    assert len(values) == 1
    assert len(values.pop()) == 64


def _components(**overrides):
    from tests import prep_functions

    arguments = dict(
        input_format="tfrecord",
        input_patterns=["a/*"],
        fingerprint_inputs="stat",
        input_files=[InputFile(path="a/1", size_bytes=10, identity="mtime_ns:5")],
        preprocessing_fn=prep_functions.normalize,
        preprocessing_params={"scale": 1},
    )
    arguments.update(overrides)
    return fingerprint.fingerprint(fingerprint.build_components(**arguments))


def test_changes_with_each_component():
    from tests import prep_functions

    base = _components()
    assert _components(input_files=[InputFile(path="a/1", size_bytes=11, identity="mtime_ns:5")]) != base
    assert _components(input_files=[InputFile(path="a/1", size_bytes=10, identity="mtime_ns:6")]) != base
    assert _components(preprocessing_params={"scale": 2}) != base
    assert _components(preprocessing_fn=prep_functions.keep_ids) != base
    assert _components(input_format="csv") != base
    assert _components(schema_text="feature {}") != base


def test_pattern_mode_ignores_file_identity():
    a = _components(fingerprint_inputs="pattern")
    b = _components(fingerprint_inputs="pattern", input_files=[InputFile(path="a/2", size_bytes=1)])
    assert a == b


def test_params_are_canonical_json():
    assert fingerprint.canonical_params_json({"b": 1, "a": [1, 2]}) == json.dumps(
        {"a": [1, 2], "b": 1}, separators=(",", ":")
    )


def test_function_identity_hashes_the_module_source():
    from tests import prep_functions

    name, digest = fingerprint.function_identity(prep_functions.normalize)
    assert name == "tests.prep_functions:normalize"
    import hashlib
    import inspect

    assert digest == hashlib.sha256(inspect.getsource(prep_functions).encode()).hexdigest()


def test_a_format_change_readers_do_without_keeps_the_fingerprint():
    """1.1 added block CRC32Cs: the 1.0 snapshots a job wrote are still its output, not written again."""
    from schemas import metadata

    assert metadata.FORMAT_VERSION == "1.1"
    components = fingerprint.build_components(
        input_format="csv", input_patterns=["a/*.csv"], fingerprint_inputs="pattern", input_files=[]
    )
    assert components.format_version == "1.0"
