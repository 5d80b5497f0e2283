"""Reading and writing the metadata messages as sorted-key JSON.

Every file carries ``format_version`` ("MAJOR.MINOR"); a newer MAJOR than
this code knows is refused with a clear error instead of being misread.
"""

from __future__ import annotations

import json
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from schemas import storage
from schemas.errors import CorruptSnapshotError, FormatVersionError
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import Manifest, PendingMarker

FORMAT_VERSION = "1.1"  # 1.1: ShardInfo.block_crc32c, PendingMarker.failed_time
FORMAT_MAJOR = int(FORMAT_VERSION.split(".")[0])
#: The format version a job's fingerprint names (schemas.fingerprint): raised with FORMAT_VERSION only when a
#: snapshot written before can no longer serve as the job's output. 1.1 added what readers do without (block
#: CRC32Cs, a failed run's time), so a 1.0 snapshot is still reused: upgrading snapfeed rewrites nothing.
FINGERPRINT_FORMAT_VERSION = "1.0"

M = TypeVar("M", bound=Message)


def to_json(message: Message) -> bytes:
    """Canonical form: sorted keys, proto field names, stable across processes."""
    as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return (json.dumps(as_dict, sort_keys=True, indent=1) + "\n").encode("utf-8")


def canonical_json(message: Message) -> bytes:
    """Compact canonical JSON: the bytes the fingerprint hashes."""
    as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return json.dumps(as_dict, sort_keys=True, separators=(",", ":")).encode("utf-8")


def from_json(data: bytes, message_type: type[M], where: str) -> M:
    try:
        as_dict = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptSnapshotError(
            f"{where} is not valid JSON ({exc}); the file is damaged. "
            f"Remove the snapshot directory and materialize it again."
        ) from exc
    check_format_version(str(as_dict.get("format_version", "")), where)
    try:
        return json_format.ParseDict(as_dict, message_type(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise CorruptSnapshotError(f"{where} does not match the {message_type.__name__} schema: {exc}") from exc


def check_format_version(version: str, where: str) -> None:
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise CorruptSnapshotError(f"{where} has no valid format_version ({version!r}).") from None
    if major > FORMAT_MAJOR:
        raise FormatVersionError(
            f"{where} uses snapshot format {version}, newer than this snapfeed reads "
            f"({FORMAT_VERSION}). Upgrade snapfeed to read it."
        )


def _read_optional(path: str, message_type: type[M]) -> M | None:
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        return None
    return from_json(data, message_type, path)


def read_pending(snapshot: SnapshotPaths) -> PendingMarker | None:
    return _read_optional(snapshot.pending_marker, PendingMarker)


def read_manifest(snapshot: SnapshotPaths) -> Manifest | None:
    return _read_optional(snapshot.final_marker, Manifest)
