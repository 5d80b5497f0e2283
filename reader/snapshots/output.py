"""How the ``snapfeed`` subcommands print: a table for people, or JSON with ``--json`` for scripts."""

from __future__ import annotations

import json


def table(rows: list[dict], columns: list[str]) -> str:
    """``rows`` as aligned columns under upper-case headings; empty values as ``-``."""
    cells = [[str(row[c]) if row[c] not in (None, "") else "-" for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def emit(args, payload, text: str) -> None:
    """``payload`` as JSON when the subcommand was given ``--json``, else ``text``."""
    print(json.dumps(payload, indent=1, sort_keys=True, default=str) if args.json else text)
