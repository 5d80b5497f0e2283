"""Why two fingerprints differ, in words a user understands (``snapfeed explain``).

Pure: compares two ``FingerprintComponents`` messages field by field, and input
files by path, so "a file changed" is told apart from "a file was added".
"""

from __future__ import annotations

from schemas.snapshot_pb2 import FingerprintComponents, InputFile


def _short(digest: str) -> str:
    return digest[:12] if digest else "(none)"


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
            how = "content" if b.identity.startswith("sha256:") else "modification time"
            changes.append(f"input file changed: {path} ({how} differs: {a.identity} -> {b.identity})")
    return changes


def explain_difference(before: FingerprintComponents, after: FingerprintComponents) -> list[str]:
    """Every component that differs, one sentence each; [] when the fingerprints are equal."""
    changes: list[str] = []
    if before.format_version != after.format_version:
        changes.append(f"snapshot format version: {before.format_version} -> {after.format_version}")
    if before.input_format != after.input_format:
        changes.append(f"input format: {before.input_format} -> {after.input_format}")
    if list(before.input_patterns) != list(after.input_patterns):
        changes.append(f"input patterns: {list(before.input_patterns)} -> {list(after.input_patterns)}")
    if before.fingerprint_inputs != after.fingerprint_inputs:
        changes.append(
            f"how inputs are fingerprinted (--fingerprint_inputs): {before.fingerprint_inputs} -> {after.fingerprint_inputs}"
        )
    else:
        changes += _file_changes(list(before.input_files), list(after.input_files))
    if before.schema_sha256 != after.schema_sha256:
        changes.append(
            f"input schema (--schema) changed: {_short(before.schema_sha256)} -> {_short(after.schema_sha256)}"
        )
    if list(before.csv_column_names) != list(after.csv_column_names):
        changes.append(f"CSV column names: {list(before.csv_column_names)} -> {list(after.csv_column_names)}")
    if before.function_name != after.function_name:
        changes.append(
            f"preprocessing function: {before.function_name or '(identity)'} -> {after.function_name or '(identity)'}"
        )
    elif before.function_source_sha256 != after.function_source_sha256:
        changes.append(
            f"source of {after.function_name}'s module changed "
            f"({_short(before.function_source_sha256)} -> {_short(after.function_source_sha256)})"
        )
    if before.function_params_json != after.function_params_json:
        changes.append(
            f"preprocessing params: {before.function_params_json or '{}'} -> {after.function_params_json or '{}'}"
        )
    return changes
