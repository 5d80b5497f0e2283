"""``explain_difference``: one sentence per changed fingerprint component, in words a user understands."""

import datetime

from schemas.fingerprint_diff import explain_difference
from schemas.snapshot_pb2 import FingerprintComponents, InputFile

SHA_A, SHA_B = "a" * 64, "b" * 64
JAN_1 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp()


def stat(path: str, size: int = 100, seconds: float = JAN_1) -> InputFile:
    return InputFile(path=path, size_bytes=size, identity=f"mtime_ns:{round(seconds * 1e9)}")


def components(**overrides) -> FingerprintComponents:
    """A tfrecord job over two files with a schema and a preprocessing function."""
    fields = dict(
        format_version="1.0",
        input_format="tfrecord",
        input_patterns=["/data/*.tfrecord"],
        fingerprint_inputs="stat",
        input_files=[stat("/data/a.tfrecord"), stat("/data/b.tfrecord")],
        schema_sha256=SHA_A,
        function_name="my_pipeline.prep:normalize",
        function_source_sha256=SHA_A,
        function_params_json='{"scale":2}',
    )
    fields.update(overrides)
    return FingerprintComponents(**fields)


def test_equal_components_explain_nothing():
    assert explain_difference(components(), components()) == []


def test_a_file_added():
    after = components(input_files=[stat("/data/a.tfrecord"), stat("/data/b.tfrecord"), stat("/data/c.tfrecord")])
    assert explain_difference(components(), after) == ["input file added: /data/c.tfrecord"]


def test_a_file_removed():
    after = components(input_files=[stat("/data/b.tfrecord")])
    assert explain_difference(components(), after) == ["input file removed: /data/a.tfrecord"]


def test_a_file_that_grew():
    after = components(input_files=[stat("/data/a.tfrecord"), stat("/data/b.tfrecord", size=120)])
    assert explain_difference(components(), after) == ["input file changed: /data/b.tfrecord (size 100 -> 120 bytes)"]


def test_a_file_rewritten_with_the_same_size_names_both_modification_times():
    after = components(input_files=[stat("/data/a.tfrecord"), stat("/data/b.tfrecord", seconds=JAN_1 + 86400.5)])
    assert explain_difference(components(), after) == [
        "input file changed: /data/b.tfrecord (same size, modified 2026-01-01T00:00:00Z -> 2026-01-02T00:00:00.500000Z)"
    ]


def test_a_file_whose_content_changed_when_inputs_are_hashed():
    def hashed(digest: str) -> FingerprintComponents:
        files = [InputFile(path="/data/a.tfrecord", size_bytes=100, identity=f"sha256:{digest}")]
        return components(fingerprint_inputs="content", input_files=files)

    assert explain_difference(hashed(SHA_A), hashed(SHA_B)) == [
        "input file changed: /data/a.tfrecord (same size, content differs: sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb)"
    ]


def test_added_removed_and_changed_files_are_told_apart():
    after = components(input_files=[stat("/data/b.tfrecord", size=7), stat("/data/c.tfrecord")])
    assert explain_difference(components(), after) == [
        "input file added: /data/c.tfrecord",
        "input file removed: /data/a.tfrecord",
        "input file changed: /data/b.tfrecord (size 100 -> 7 bytes)",
    ]


def test_a_change_of_how_inputs_are_fingerprinted_is_one_sentence_not_one_per_file():
    after = components(fingerprint_inputs="pattern", input_files=[])
    assert explain_difference(components(), after) == [
        "how inputs are fingerprinted (--fingerprint_inputs): stat -> pattern"
    ]


def test_function_source_changed_names_the_module_that_was_edited():
    assert explain_difference(components(), components(function_source_sha256=SHA_B)) == [
        "preprocessing function my_pipeline.prep:normalize: the source of its module my_pipeline.prep changed "
        "(sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb)"
    ]


def test_function_replaced_or_removed():
    renamed = components(function_name="my_pipeline.prep:standardize", function_source_sha256=SHA_B)
    assert explain_difference(components(), renamed) == [
        "preprocessing function: my_pipeline.prep:normalize -> my_pipeline.prep:standardize"
    ]
    identity = components(function_name="", function_source_sha256="", function_params_json="")
    assert explain_difference(components(), identity) == [
        "preprocessing function: my_pipeline.prep:normalize -> (none: rows are written as read)",
        'preprocessing params: {"scale":2} -> {}',
    ]


def test_input_format_options_changed():
    assert explain_difference(components(), components(schema_sha256=SHA_B)) == [
        "input schema (--schema) changed (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb)"
    ]
    assert explain_difference(components(schema_sha256=""), components()) == [
        "input schema (--schema) given (sha256 aaaaaaaaaaaa); before, none was given"
    ]
    assert explain_difference(components(), components(schema_sha256="")) == [
        "input schema (--schema) no longer given (was sha256 aaaaaaaaaaaa)"
    ]
    csv = components(input_format="csv", csv_column_names=["id", "label"])
    renamed = components(input_format="csv", csv_column_names=["id", "target"])
    assert explain_difference(csv, renamed) == [
        "CSV column names (--csv_column_names, or the header line): ['id', 'label'] -> ['id', 'target']"
    ]


def test_input_format_and_patterns_changed():
    after = components(input_format="parquet", input_patterns=["/data/*.parquet"], input_files=[], schema_sha256="")
    changes = explain_difference(components(), after)
    assert changes[:2] == [
        "input format (--input_format): tfrecord -> parquet",
        "input patterns (--input): ['/data/*.tfrecord'] -> ['/data/*.parquet']",
    ]
    assert "input file removed: /data/a.tfrecord" in changes


def test_another_tensorflow_transform_version_is_named():
    before = components(transform_library="tensorflow-transform==1.20.0")
    after = components(transform_library="tensorflow-transform==1.21.0")
    assert explain_difference(before, after) == [
        "tf.Transform library (its analyzers' semantics change between versions): "
        "tensorflow-transform==1.20.0 -> tensorflow-transform==1.21.0"
    ]
    assert "instance-level" in explain_difference(components(), after)[0]
