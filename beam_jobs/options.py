"""Command-line options of the materialize job and the frozen config built from them.

Only the entry module turns ``PipelineOptions`` into a ``MaterializeConfig``;
transforms take plain values, never ``PipelineOptions``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from schemas import paths
from schemas.errors import UsageError
from schemas.fingerprint import FINGERPRINT_INPUTS
from schemas.shard_codec import AUTO_BLOCK_BYTES, AUTO_SHARD_BYTES, Compression
from schemas.state_machine import Mode

INPUT_FORMATS = ("tfrecord", "csv", "parquet")
JOB_MODES = (Mode.AUTO, Mode.WRITE)


class MaterializeOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        group = parser.add_argument_group("snapfeed materialize")
        group.add_argument("--input", help="comma-separated file patterns (local, gs://, s3://)")
        group.add_argument(
            "--input_format",
            default=None,
            help="tfrecord | csv | parquet (default: by the patterns' extension, .csv or .parquet; else tfrecord)",
        )
        group.add_argument("--schema", default=None, help="TFMD schema (.pbtxt) for tfrecord/csv input")
        group.add_argument("--csv_column_names", default=None, help="a,b,c (default: the header line)")
        group.add_argument("--preprocessing_fn", default=None, help="module:function (default: identity)")
        group.add_argument("--preprocessing_params", default=None, help="JSON object passed to the function")
        group.add_argument(
            "--tft_preprocessing_fn",
            default=None,
            help="module:function, a tf.Transform preprocessing_fn: full-pass analyzers (means, vocabularies, "
            "quantiles), its transform graph committed with the snapshot",
        )
        group.add_argument("--output", help="snapshot root directory")
        group.add_argument("--snapshot_name", default=None, help="use this name instead of the fingerprint")
        group.add_argument(
            "--compression",
            default=None,
            help="AUTO (LZ4 per shard where it saves 10%%, else NONE) | LZ4 | ZSTD | NONE",
        )
        group.add_argument(
            "--shard_size_bytes",
            type=int,
            default=AUTO_SHARD_BYTES,
            help="largest shard file (blocks are made small enough to fit); only a row larger than it is exceeded by",
        )
        group.add_argument(
            "--block_size_bytes",
            type=int,
            default=AUTO_BLOCK_BYTES,
            help="rows per record batch in a shard: about this many bytes (the reader's unit of random access)",
        )
        group.add_argument(
            "--mode", default="auto", help="auto (reuse a finalized snapshot) | write (always a new run)"
        )
        group.add_argument(
            "--pending_snapshot_expiry_seconds",
            type=float,
            default=86400.0,
            help="take over a pending snapshot whose writer started longer ago than this",
        )
        group.add_argument("--wait", action="store_true", help="wait for another writer instead of exiting 3")
        group.add_argument(
            "--wait_poll_seconds", type=float, default=5.0, help="with --wait: how often to look at the other writer"
        )
        group.add_argument(
            "--fingerprint_inputs",
            default="stat",
            help="what identifies an input file: stat (size, mtime) | content (sha256) | pattern (the patterns only)",
        )
        group.add_argument(
            "--progress_interval_seconds",
            type=float,
            default=10.0,
            help="print the rows, bytes and shards committed so far this often, on every runner (0: never)",
        )
        group.add_argument(
            "--allow_empty",
            action="store_true",
            help="commit a snapshot with zero rows instead of failing (empty inputs, or a function that keeps none)",
        )
        group.add_argument(
            "--view",
            default=None,
            help="a view's folder (local, gs://, s3://): once the snapshot is written or reused, add it as the "
            "view's new version (nothing when the latest version lists it already)",
        )
        group.add_argument(
            "--view_keep",
            type=int,
            default=None,
            help="with --view: the new version keeps the newest N snapshots (default: all)",
        )
        group.add_argument(
            "--print_fingerprint",
            action="store_true",
            help="print the snapshot id and fingerprint components as JSON and exit; writes and runs nothing",
        )


#: File extensions that name an input format; any other pattern is read as TFRecord, the default.
FORMAT_EXTENSIONS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def input_format_of(patterns: tuple[str, ...]) -> str:
    """The format ``--input`` names by its extensions when ``--input_format`` is not given: ``csv`` or ``parquet``
    when every pattern ends so, else ``tfrecord``; patterns naming two formats are one line."""
    named = {FORMAT_EXTENSIONS.get(os.path.splitext(p)[1].lower(), "tfrecord") for p in patterns}
    if len(named) > 1:
        raise UsageError(
            f"--input names files of {' and '.join(sorted(named))} by their extensions; one job reads one format: "
            f"split the inputs or pass --input_format"
        )
    return named.pop() if named else "tfrecord"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaterializeConfig:
    input_patterns: tuple[str, ...]
    input_format: str
    output: str
    schema_path: str | None = None
    csv_column_names: tuple[str, ...] = ()
    preprocessing_fn: str | None = None
    preprocessing_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    tft_preprocessing_fn: str | None = None
    snapshot_name: str | None = None
    compression: Compression = Compression.AUTO
    compression_given: bool = False  # said on the command line: a reuse reports a stored codec that differs
    shard_size_bytes: int = AUTO_SHARD_BYTES
    block_size_bytes: int = AUTO_BLOCK_BYTES
    mode: Mode = Mode.AUTO
    pending_snapshot_expiry_seconds: float = 86400.0
    wait: bool = False
    wait_poll_seconds: float = 5.0
    fingerprint_inputs: str = "stat"
    progress_interval_seconds: float = 10.0
    print_fingerprint: bool = False
    allow_empty: bool = False
    view: str | None = None  # added to once the snapshot is committed or reused (not part of the fingerprint)
    view_keep: int | None = None

    def __post_init__(self) -> None:
        if not self.input_patterns:
            raise UsageError("--input is required: comma-separated file patterns, e.g. --input='raw/*.tfrecord'")
        if not self.output:
            raise UsageError("--output is required: the snapshot root directory, e.g. --output=/saved/data")
        if self.input_format not in INPUT_FORMATS:
            raise UsageError(f"--input_format={self.input_format}; choose one of {', '.join(INPUT_FORMATS)}")
        if self.csv_column_names and self.input_format != "csv":
            raise UsageError("--csv_column_names only applies to --input_format=csv")
        if self.schema_path and self.input_format == "parquet":
            raise UsageError("--schema does not apply to parquet input: parquet files carry their own schema")
        if self.preprocessing_fn and self.tft_preprocessing_fn:
            raise UsageError(
                "--preprocessing_fn and --tft_preprocessing_fn are both given; pass one: --preprocessing_fn for a "
                "function of each batch, --tft_preprocessing_fn for a tf.Transform preprocessing_fn (full-pass analyzers)"
            )
        if self.preprocessing_params and self.tft_preprocessing_fn:
            raise UsageError(
                "--preprocessing_params applies to --preprocessing_fn; a tf.Transform preprocessing_fn takes only its "
                "inputs (put constants in its module)"
            )
        if self.preprocessing_params and not self.preprocessing_fn:
            raise UsageError("--preprocessing_params needs --preprocessing_fn: the params are that function's")
        if self.mode not in JOB_MODES:
            raise UsageError(f"--mode={self.mode.value}: the job supports auto or write")
        if self.shard_size_bytes < 1 or self.block_size_bytes < 1:
            raise UsageError("--shard_size_bytes and --block_size_bytes must be positive")
        if self.pending_snapshot_expiry_seconds < 0:
            raise UsageError("--pending_snapshot_expiry_seconds must be >= 0")
        if self.fingerprint_inputs not in FINGERPRINT_INPUTS:
            raise UsageError(
                f"--fingerprint_inputs={self.fingerprint_inputs}; choose one of {', '.join(FINGERPRINT_INPUTS)}"
            )
        if self.view_keep is not None and not self.view:
            raise UsageError("--view_keep needs --view: it is how many snapshots the view's new version keeps")
        if self.view_keep is not None and self.view_keep < 1:
            raise UsageError(
                f"--view_keep={self.view_keep}: keep at least the newest snapshot (--view_keep=1), or give none to "
                f"keep all"
            )
        if self.view and paths.canonical(self.view) == paths.canonical(self.output):
            raise UsageError(
                f"--view={self.view} is the --output root, whose folders are snapshots: give the view a folder of "
                f"its own, e.g. --view={self.output.rstrip('/')}-views/daily"
            )
        if self.snapshot_name is not None and not paths.is_valid_snapshot_id(self.snapshot_name):
            raise UsageError(
                f"--snapshot_name={self.snapshot_name!r}: use letters, digits, '.', '_' or '-' (at most 128)"
            )

    @classmethod
    def from_options(cls, options: MaterializeOptions) -> MaterializeConfig:
        patterns = tuple(paths.absolute(p.strip()) for p in (options.input or "").split(",") if p.strip())
        return cls(
            input_patterns=patterns,
            input_format=options.input_format.lower() if options.input_format else input_format_of(patterns),
            output=paths.absolute(options.output) if options.output else "",
            schema_path=paths.absolute(options.schema) if options.schema else None,
            csv_column_names=tuple(c.strip() for c in options.csv_column_names.split(","))
            if options.csv_column_names
            else (),
            preprocessing_fn=options.preprocessing_fn,
            preprocessing_params=_parse_params(options.preprocessing_params),
            tft_preprocessing_fn=options.tft_preprocessing_fn,
            snapshot_name=options.snapshot_name,
            compression=Compression.parse(options.compression),
            compression_given=options.compression is not None,
            shard_size_bytes=options.shard_size_bytes,
            block_size_bytes=options.block_size_bytes,
            mode=Mode.parse(options.mode),
            pending_snapshot_expiry_seconds=options.pending_snapshot_expiry_seconds,
            wait=options.wait,
            wait_poll_seconds=options.wait_poll_seconds,
            fingerprint_inputs=options.fingerprint_inputs,
            progress_interval_seconds=options.progress_interval_seconds,
            print_fingerprint=options.print_fingerprint,
            allow_empty=options.allow_empty,
            view=paths.absolute(options.view) if options.view else None,
            view_keep=options.view_keep,
        )


def _parse_params(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--preprocessing_params is not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(params, dict):
        raise UsageError(f"--preprocessing_params must be a JSON object, got {type(params).__name__}")
    return params
