"""``snapfeed`` (also ``python -m reader.snapshots``): list, show, verify, explain, gc, view (``view_cli``).

Every subcommand takes ``--json`` for scripts. Exit codes (``schemas.errors``):
0 fine, 1 a check failed (verify found a bad shard) or an error, 2 usage error or
nothing to act on; an error ends in one ``error:`` line (``schemas.command``).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shlex
import subprocess
import sys
import time

from google.protobuf import json_format

from reader.core.snapshot import open_snapshot, verify_shards
from reader.snapshots import gc, inventory, view_cli
from reader.snapshots.output import emit, table
from schemas import command, metadata, paths, storage, views
from schemas.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, SnapfeedError, UsageError
from schemas.fingerprint_diff import explain_difference
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import FingerprintComponents
from schemas.state_machine import format_time

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    match = _DURATION.match(text.strip())
    if not match:
        raise UsageError(f"--older-than={text!r}; use a number with s, m, h, d or w, e.g. 7d or 12h")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _codec(manifest) -> str:
    """The manifest's codec; for AUTO, how many shards each codec was chosen for."""
    if manifest.compression != "auto":
        return manifest.compression
    chosen = collections.Counter(shard.compression for shard in manifest.shards)
    return "auto (" + ", ".join(f"{codec}: {count} shards" for codec, count in sorted(chosen.items())) + ")"


def _human_bytes(num: int | None) -> str:
    if num is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num) < 1000 or unit == "TB":
            return f"{num:.0f}{unit}" if unit == "B" else f"{num:.1f}{unit}"
        num /= 1000
    return str(num)


#: Table words where the state name alone would mislead: an unknown folder is not a broken snapshot.
_STATE_WORDS = {inventory.UNKNOWN: "unknown (not snapfeed's)"}


def cmd_list(args) -> int:
    entries = inventory.scan(args.root, now=time.time(), expiry_seconds=args.expiry_seconds)
    rows = [entry.summary() for entry in entries]
    text_rows = [
        {
            **row,
            "id": row["name"] or row["id"],
            "state": _STATE_WORDS.get(row["state"], row["state"]),
            "bytes": _human_bytes(row["bytes"]),
            "created": format_time(row["created"]) if row["created"] else None,
        }
        for row in rows
    ]
    columns = ["id", "state", "rows", "shards", "bytes", "codec", "created", "run_id"]
    emit(args, rows, table(text_rows, columns) if rows else f"no snapshots under {args.root}")
    return EXIT_OK


def _split_snapshot_path(path: str) -> SnapshotPaths:
    stripped = path.rstrip("/")
    root, _, snapshot_id = stripped.rpartition("/")
    return SnapshotPaths(root or ".", snapshot_id)


def cmd_show(args) -> int:
    snapshot = _split_snapshot_path(args.snapshot)
    entry = inventory.inspect(snapshot, now=time.time(), expiry_seconds=args.expiry_seconds)
    marker = entry.manifest or entry.pending
    if marker is None:
        raise UsageError(
            f"{snapshot.directory} holds no snapshot markers; `snapfeed list {snapshot.root}` shows what is there"
        )
    payload = {
        "state": entry.state,
        "metadata": json_format.MessageToDict(marker, preserving_proto_field_name=True),
        "runs": [{"run_id": r.run_id, "role": r.role, "bytes": r.num_bytes} for r in entry.runs],
    }
    lines = [f"{snapshot.directory}: {entry.state}"]
    if entry.manifest is not None:
        m = entry.manifest
        lines += [
            f"  name: {m.snapshot_name or '-'}   run: {m.run_id}   finalized: {format_time(m.finalize_time)}",
            f"  rows: {m.num_rows}   shards: {len(m.shards)}   bytes: {_human_bytes(m.num_bytes)}   codec: {_codec(m)}",
            "  columns:",
        ]
        lines += [f"    {c.name}: {c.dtype}{list(c.shape) if c.is_tensor else ''}" for c in m.columns]
    writer = marker.writer
    lines.append(
        f"  writer: {writer.tool} {writer.tool_version} on {writer.hostname or '?'} (runner {writer.runner or '-'}, "
        f"beam {writer.beam_version or '-'}, pyarrow {writer.pyarrow_version or '-'}, python {writer.python_version or '-'})"
    )
    components = marker.fingerprint_components
    kind = f" (tf.Transform, {components.transform_library})" if components.transform_library else ""
    lines += [
        f"  fingerprint: {marker.fingerprint or '(named snapshot)'}",
        f"    input: {components.input_format} {list(components.input_patterns)} ({len(components.input_files)} files, by {components.fingerprint_inputs})",
        f"    function: {components.function_name or '(identity)'} source sha256 {components.function_source_sha256[:12] or '-'}{kind}",
        f"    params: {components.function_params_json or '{}'}",
    ]
    if entry.manifest is not None and entry.manifest.transform_files:
        payload["transform"] = summary = _transform_summary(snapshot, entry.manifest)
        lines += _transform_lines(entry.manifest, summary)
    lines += [f"  run {r.run_id}: {r.role}, {_human_bytes(r.num_bytes)}" for r in entry.runs]
    emit(args, payload, "\n".join(lines))
    return EXIT_OK


def _transform_summary(snapshot: SnapshotPaths, manifest) -> dict:
    """What the run's tf.Transform analyzers found, as the job summarized it (``transform_summary.json``)."""
    path = paths.join(snapshot.run_dir(manifest.run_id), paths.TRANSFORM_SUMMARY)
    try:
        return json.loads(storage.read_bytes(path))
    except FileNotFoundError:
        return {"missing": path}


def _transform_lines(manifest, summary: dict) -> list[str]:
    files = manifest.transform_files
    lines = [f"  tf.Transform graph: {len(files)} files, {_human_bytes(sum(f.num_bytes for f in files))}"]
    if "missing" in summary:
        return [*lines, f"    its summary {summary['missing']} is missing: run `snapfeed verify`"]
    for analyzer in summary.get("analyzers", []):
        lines.append(f"    {analyzer['label']}: {_short_value(analyzer['value'])}   ({analyzer['input']})")
    for vocabulary in summary.get("vocabularies", []):
        top = ", ".join(vocabulary["top"])
        lines.append(f"    vocabulary {vocabulary['name']}: {vocabulary['size']} entries; most frequent first: {top}")
    return lines


def _short_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_short_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return f"{value['count']} values: {_short_value(value['first'])} ... {_short_value(value['last'])}"
    return str(value)


def cmd_verify(args) -> int:
    from tqdm import tqdm

    snapshot = open_snapshot(args.target)
    with tqdm(
        total=snapshot.metadata.num_bytes,
        unit="B",
        unit_scale=True,
        disable=args.json or None,
        desc=f"verify {snapshot.snapshot_id[:16]}",
        file=sys.stderr,
    ) as bar:
        reports = verify_shards(snapshot, sample=args.sample, progress=bar.update)
    bad = [r for r in reports if r.problem]
    payload = {"snapshot": snapshot.path, "checked": len(reports), "bad": [r.problem for r in bad]}
    what = "files (shards and the tf.Transform graph)" if snapshot.has_transform_graph else "shards"
    text = "\n".join([f"BAD {r.problem}" for r in bad] + [f"{len(reports) - len(bad)} of {len(reports)} {what} ok"])
    emit(args, payload, text)
    return EXIT_FAILURE if bad else EXIT_OK


def _components_of(root: str, snapshot_id: str) -> FingerprintComponents:
    snapshot = SnapshotPaths(root, snapshot_id)
    marker = metadata.read_manifest(snapshot) or metadata.read_pending(snapshot)
    if marker is None:
        raise UsageError(f"no snapshot {snapshot_id} under {root}; `snapfeed list {root}` shows the ids")
    return marker.fingerprint_components


def _job_fingerprint(root: str, flags: str) -> dict:
    command = [
        sys.executable,
        "-m",
        "beam_jobs.materialize",
        *shlex.split(flags),
        f"--output={root}",
        "--print_fingerprint",
    ]
    completed = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    if completed.returncode != 0:
        lines = completed.stderr.strip().splitlines()
        reason = lines[-1].partition(": ")[2] if lines else f"exit code {completed.returncode}"
        error = UsageError if completed.returncode == EXIT_USAGE else SnapfeedError
        raise error(f"the job flags do not plan: {reason}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def cmd_explain(args) -> int:
    if views.split_pinned(args.root)[1] is not None:  # VIEW@K VIEW@L
        if len(args.ids) != 1:
            raise UsageError("give two view versions: snapfeed explain VIEW@K VIEW@L")
        return view_cli.explain(args, args.root, args.ids[0])
    if args.job_flags is not None:
        planned = _job_fingerprint(args.root, args.job_flags)
        components = json_format.ParseDict(planned["fingerprint_components"], FingerprintComponents())
        entries = inventory.scan(args.root, now=time.time())
        same = [e for e in entries if e.snapshot_id == planned["snapshot_id"]]
        finals = [e for e in entries if e.state == inventory.FINAL and e.snapshot_id != planned["snapshot_id"]]
        stored = same[0].manifest if same else None
        changes: list[str] = []
        compared_with, reused = None, False
        if stored is not None and stored.fingerprint and stored.fingerprint != planned["fingerprint"]:
            # a --snapshot_name directory holds whatever job last wrote that name: the job compares and refuses
            verdict = (
                f"the job would refuse {planned['snapshot_id']}: it holds run {stored.run_id} of another job "
                f"(--mode=write replaces it); what differs:"
            )
            changes = explain_difference(stored.fingerprint_components, components)
            compared_with = planned["snapshot_id"]
        elif same:
            reused = True
            verdict = f"the job would reuse {planned['snapshot_id']} ({same[0].state}): nothing changed"
        else:
            verdict = f"the job would write a new snapshot {planned['snapshot_id']}"
            if finals:
                changes = explain_difference(finals[-1].manifest.fingerprint_components, components)
                compared_with = finals[-1].snapshot_id
                verdict += f"; compared with the newest finalized snapshot {compared_with}:"
        payload = {
            "snapshot_id": planned["snapshot_id"],
            "reused": reused,
            "changes": changes,
            "compared_with": compared_with,
        }
        emit(args, payload, "\n".join([verdict] + [f"  - {c}" for c in changes]))
        return EXIT_OK
    if not args.ids or len(args.ids) != 2:
        raise UsageError("give two snapshot ids (snapfeed explain ROOT ID_A ID_B) or --job-flags '...'")
    a, b = args.ids
    changes = explain_difference(_components_of(args.root, a), _components_of(args.root, b))
    text = (
        "\n".join([f"{a} -> {b}:"] + [f"  - {c}" for c in changes])
        if changes
        else f"{a} and {b} have the same fingerprint components"
    )
    emit(args, {"from": a, "to": b, "changes": changes}, text)
    return EXIT_OK


def cmd_gc(args) -> int:
    now = time.time()
    older_than = parse_duration(args.older_than)
    entries = inventory.scan(args.root, now=now, expiry_seconds=args.expiry_seconds)
    removals = gc.plan_removals(entries, now=now, older_than_seconds=older_than)
    if args.dry_run:
        removed, skipped = [], []
    else:
        removed, skipped = gc.remove(
            removals, now=now, older_than_seconds=older_than, expiry_seconds=args.expiry_seconds
        )
    rows = [{"path": r.path, "reason": r.reason, "bytes": r.num_bytes} for r in removals]
    verb = "would remove" if args.dry_run else "removed"
    done = removals if args.dry_run else removed
    left_alone = gc.left_alone(entries, now=now, older_than_seconds=older_than)
    lines = [f"{verb} {r.path} ({r.reason}, {_human_bytes(r.num_bytes)})" for r in done]
    lines += [f"kept {r.path}: it changed since the plan (a writer is active)" for r in skipped]
    lines += left_alone
    lines.append(f"{verb} {len(done)} item(s), {_human_bytes(sum(r.num_bytes for r in done))}")
    payload = {
        "dry_run": args.dry_run,
        "planned": rows,
        "skipped": [r.path for r in skipped],
        "left_alone": left_alone,
    }
    emit(args, payload, "\n".join(lines))
    return EXIT_OK


def build_parser() -> command.ArgumentParser:
    parser = command.ArgumentParser(prog="snapfeed", description="Inspect, verify and clean snapfeed snapshots.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler, help_text: str) -> command.ArgumentParser:
        return common(sub.add_parser(name, help=help_text, description=help_text), handler)

    def common(subcommand: command.ArgumentParser, handler) -> command.ArgumentParser:
        subcommand.add_argument("--json", action="store_true", help="machine-readable output")
        subcommand.add_argument(command.VERBOSE_FLAG, action="store_true", help=command.VERBOSE_HELP)
        subcommand.add_argument(
            "--expiry-seconds",
            type=float,
            default=inventory.DEFAULT_EXPIRY_SECONDS,
            help="a pending snapshot older than this is expired (the job's --pending_snapshot_expiry_seconds)",
        )
        subcommand.set_defaults(handler=handler)
        return subcommand

    add("list", cmd_list, "a table of the snapshots under ROOT").add_argument("root")
    add("show", cmd_show, "metadata, schema, fingerprint components and writer of ROOT/ID").add_argument("snapshot")
    verify = add("verify", cmd_verify, "recompute checksums and row counts of ROOT[/ID]; exit 1 naming bad shards")
    verify.add_argument("target")
    verify.add_argument("--sample", type=float, default=1.0, help="check this fraction of the shards (0 < f <= 1)")
    explain = add(
        "explain",
        cmd_explain,
        "which fingerprint components differ between two snapshots, or for job flags; or which snapshots "
        "VIEW@L adds and drops from VIEW@K",
    )
    explain.add_argument("root")
    explain.add_argument("ids", nargs="*")
    explain.add_argument("--job-flags", default=None, help="materialize flags to plan (nothing runs)")
    collect = add(
        "gc",
        cmd_gc,
        "remove lost, abandoned, expired and superseded runs past a grace period; folders that are not "
        "snapfeed's and files a finalized manifest lists are never removed",
    )
    collect.add_argument("root")
    collect.add_argument("--older-than", default="7d", help="grace period, e.g. 7d, 12h, 30m (default 7d)")
    collect.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    view_cli.add_commands(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    return command.run("snapfeed", lambda: _run(argv), argv)


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    sample = getattr(args, "sample", 1.0)
    if not 0 < sample <= 1:
        raise UsageError(f"--sample={sample}; give a fraction in (0, 1]")
    return args.handler(args)
