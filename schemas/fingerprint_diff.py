"""Why two fingerprints differ, in words a user understands (``snapfeed explain``).

Pure: compares two ``FingerprintComponents`` messages field by field, and input
files by path, so "a file changed" is told apart from "a file was added".
Sentences name the job flag behind a component and show times as UTC dates and
digests as short sha256 prefixes, never raw identity strings.
"""

from __future__ import annotations

import datetime

from schemas.snapshot_pb2 import FingerprintComponents, InputFile


def _short(digest: str) -> str:
    return digest[:12] if digest else "(none)"


def _readable_mtime(identity: str) -> str:
    """``mtime_ns:<n>`` as a UTC time; sub-second digits only when there are any."""
    nanoseconds = int(identity.split(":", 1)[1])
    when = datetime.datetime.fromtimestamp(nanoseconds / 1e9, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S" + (".%f" if when.microsecond else "") + "Z")


def _identity_change(before: str, after: str) -> str:
    """How a same-size file differs, by the kind of identity ``--fingerprint_inputs`` recorded."""
    if before.startswith("mtime_ns:") and after.startswith("mtime_ns:"):
        return f"modified {_readable_mtime(before)} -> {_readable_mtime(after)}"
    if before.startswith("sha256:") and after.startswith("sha256:"):
        return f"content differs: sha256 {_short(before[7:])} -> {_short(after[7:])}"
    return f"identity {before or '(none)'} -> {after or '(none)'}"


def _file_changes(before: list[InputFile], after: list[InputFile]) -> list[str]:
    old = {f.path: f for f in before}
    new = {f.path: f for f in after}
    changes = [f"input file added: {path}" for path in sorted(new.keys() - old.keys())]
    changes += [f"input file removed: {path}" for path in sorted(old.keys() - new.keys())]
    for path in sorted(old.keys() & new.keys()):
        a, b = old[path], new[path]
        if a.size_bytes != b.size_bytes:
            changes.append(f"input file changed: {path} (size {a.size_bytes} -> {b.size_bytes} bytes)")
        elif a.identity != b.identity:
            changes.append(f"input file changed: {path} (same size, {_identity_change(a.identity, b.identity)})")
    return changes


def _input_changes(before: FingerprintComponents, after: FingerprintComponents) -> list[str]:
    """What was read: format, patterns, files and how they were fingerprinted."""
    changes: list[str] = []
    if before.input_format != after.input_format:
        changes.append(f"input format (--input_format): {before.input_format} -> {after.input_format}")
    if list(before.input_patterns) != list(after.input_patterns):
        changes.append(f"input patterns (--input): {list(before.input_patterns)} -> {list(after.input_patterns)}")
    if before.fingerprint_inputs != after.fingerprint_inputs:
        # Identities of different kinds are not comparable: one sentence, not one per file.
        changes.append(
            f"how inputs are fingerprinted (--fingerprint_inputs): {before.fingerprint_inputs} -> {after.fingerprint_inputs}"
        )
    else:
        changes += _file_changes(list(before.input_files), list(after.input_files))
    return changes


def _schema_change(before: str, after: str) -> list[str]:
    """The TFMD schema is stored as a digest, so say whether it was given, dropped or edited."""
    if before == after:
        return []
    if not before:
        return [f"input schema (--schema) given (sha256 {_short(after)}); before, none was given"]
    if not after:
        return [f"input schema (--schema) no longer given (was sha256 {_short(before)})"]
    return [f"input schema (--schema) changed (sha256 {_short(before)} -> {_short(after)})"]


def _format_option_changes(before: FingerprintComponents, after: FingerprintComponents) -> list[str]:
    """Options of the input format that change how rows are parsed."""
    changes = _schema_change(before.schema_sha256, after.schema_sha256)
    if list(before.csv_column_names) != list(after.csv_column_names):
        changes.append(
            f"CSV column names (--csv_column_names, or the header line): "
            f"{list(before.csv_column_names)} -> {list(after.csv_column_names)}"
        )
    return changes


def _function_changes(before: FingerprintComponents, after: FingerprintComponents) -> list[str]:
    """The preprocessing function: which one, its module's source (helpers included) and its params."""
    changes: list[str] = []
    identity = "(none: rows are written as read)"
    if before.function_name != after.function_name:
        changes.append(
            f"preprocessing function: {before.function_name or identity} -> {after.function_name or identity}"
        )
    elif before.function_source_sha256 != after.function_source_sha256:
        module = after.function_name.split(":", 1)[0]
        changes.append(
            f"preprocessing function {after.function_name}: the source of its module {module} changed "
            f"(sha256 {_short(before.function_source_sha256)} -> {_short(after.function_source_sha256)})"
        )
    if before.function_params_json != after.function_params_json:
        changes.append(
            f"preprocessing params: {before.function_params_json or '{}'} -> {after.function_params_json or '{}'}"
        )
    if before.transform_library != after.transform_library:
        none = "(none: an instance-level --preprocessing_fn)"
        changes.append(
            f"tf.Transform library (its analyzers' semantics change between versions): "
            f"{before.transform_library or none} -> {after.transform_library or none}"
        )
    return changes


def explain_difference(before: FingerprintComponents, after: FingerprintComponents) -> list[str]:
    """Every component that differs, one sentence each; [] when the fingerprints are equal."""
    changes: list[str] = []
    if before.format_version != after.format_version:
        changes.append(f"snapshot format version: {before.format_version} -> {after.format_version}")
    changes += _input_changes(before, after)
    changes += _format_option_changes(before, after)
    changes += _function_changes(before, after)
    return changes
