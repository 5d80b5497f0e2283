"""``snapfeed view add | show | list`` and ``snapfeed explain VIEW@K VIEW@L``: views from the command line.

A view (``schemas.views``) holds numbered versions of a list of snapshots: the
daily window a scheduled job trains on. ``add`` resolves what it is given as a
reader would (a snapshot's folder, or a root holding one) and records that
snapshot's current run, so a later rewrite under that root never changes an
existing version.
"""

from __future__ import annotations

from reader.core.snapshot import open_snapshot
from reader.snapshots.output import emit, table
from schemas import views
from schemas.errors import EXIT_OK, UsageError
from schemas.state_machine import format_time


def _member_rows(members) -> list[dict]:
    return [
        {"snapshot": m.snapshot_id[:16], "run": m.run_id, "rows": m.num_rows, "folder": m.directory} for m in members
    ]


def cmd_add(args) -> int:
    snapshot = open_snapshot(args.snapshot)
    version, added = views.add(args.view, snapshot.paths, snapshot.metadata, keep=args.keep)
    text = views.describe_add(version, added, snapshot.path, snapshot.metadata.run_id, snapshot.num_rows)
    emit(args, {"added": added, **version.summary()}, text)
    return EXIT_OK


def cmd_show(args) -> int:
    view, number = views.split_pinned(args.view)
    version = views.read_version(view, number)
    latest = views.version_numbers(view)[-1]
    heading = (
        f"{view}@{version.number} (latest {latest}), created {format_time(version.created)}: "
        f"{len(version.members)} snapshots, {version.num_rows} rows"
    )
    if version.transform_graph is not None:
        heading += f"; tf.Transform window graph {version.transform_graph['directory']}"
    rows = _member_rows(version.members)
    emit(args, version.summary(), heading + "\n" + table(rows, ["snapshot", "run", "rows", "folder"]))
    return EXIT_OK


def cmd_list(args) -> int:
    rows = []
    for view in views.find_views(args.root):
        numbers = views.version_numbers(view)
        latest = views.read_version(view, numbers[-1]) if numbers else None
        rows.append(
            {
                "view": view,
                "versions": len(numbers),
                "latest": latest.number if latest else None,
                "snapshots": len(latest.members) if latest else 0,
                "rows": latest.num_rows if latest else 0,
                "created": format_time(latest.created) if latest else None,
            }
        )
    columns = ["view", "versions", "latest", "snapshots", "rows", "created"]
    emit(args, rows, table(rows, columns) if rows else f"no views under {args.root}")
    return EXIT_OK


def explain(args, older_path: str, newer_path: str) -> int:
    """The snapshots added and dropped from ``VIEW@K`` to ``VIEW@L``."""
    (view_a, number_a), (view_b, number_b) = views.split_pinned(older_path), views.split_pinned(newer_path)
    if number_a is None or number_b is None:
        raise UsageError(f"give two view versions: snapfeed explain VIEW@K VIEW@L (got {older_path} {newer_path})")
    older, newer = views.read_version(view_a, number_a), views.read_version(view_b, number_b)
    added, dropped = views.difference(older, newer)
    lines = [f"{older_path} -> {newer_path}:"]
    lines += [f"  + {m.directory} (run {m.run_id}, {m.num_rows} rows)" for m in added]
    lines += [f"  - {m.directory} (run {m.run_id}, {m.num_rows} rows)" for m in dropped]
    if not added and not dropped:
        lines = [f"{older_path} and {newer_path} list the same snapshots"]
    payload = {"from": older_path, "to": newer_path, "added": _member_rows(added), "dropped": _member_rows(dropped)}
    emit(args, payload, "\n".join(lines))
    return EXIT_OK


def add_commands(sub, common) -> None:
    """``snapfeed view ...`` under the CLI's subcommands; ``common`` adds the flags every subcommand has."""
    view = sub.add_parser("view", help="versions of a list of snapshots (a daily window)", description=__doc__)
    actions = view.add_subparsers(dest="view_command", required=True)
    add = common(actions.add_parser("add", help="add a snapshot as a new version of VIEW (creates the view)"), cmd_add)
    add.add_argument("view")
    add.add_argument("snapshot", help="a snapshot's folder, or a root holding one")
    add.add_argument("--keep", type=int, default=None, help="keep the newest N snapshots in the new version")
    show = common(actions.add_parser("show", help="the snapshots of VIEW's latest version, or of VIEW@K"), cmd_show)
    show.add_argument("view")
    listing = common(actions.add_parser("list", help="the views under ROOT"), cmd_list)
    listing.add_argument("root")
