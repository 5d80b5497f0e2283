"""A bench's systems each in their own process, interleaved, and the median run of each kept.

One process per run keeps each system's memory and threads its own; interleaving spreads the
noise of a shared machine over every system alike, and the median run is what is reported.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
from collections.abc import Sequence

RESULTS = pathlib.Path(__file__).parent / "results"


#: A bench's own command-line option: the flag and ``ArgumentParser.add_argument``'s keywords.
Option = tuple[str, dict]


def arguments(description: str, systems: Sequence[str] = (), options: Sequence[Option] = ()) -> argparse.Namespace:
    """A bench's command line: ``--systems`` (for a bench that has systems to choose), ``--repeats``,
    ``--worker``/``--path`` for one run in its own process, then the bench's own ``options``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if systems:
        parser.add_argument("--systems", default=",".join(systems))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--path", default=None, help=argparse.SUPPRESS)
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)
    return parser.parse_args()


def median_runs(
    module: str, systems: Sequence[str], repeats: int, arguments: Sequence[str], key: str, env: dict | None = None
) -> list[dict]:
    """``python -m module --worker=SYSTEM *arguments`` for every system, ``repeats`` rounds; each run
    prints one JSON object as its last line. Per system: the run with the median ``key``, and ``runs``."""
    runs: dict[str, list[dict]] = {system: [] for system in systems}
    for _ in range(repeats):
        for system in systems:
            command = [sys.executable, "-m", module, f"--worker={system}", *arguments]
            completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if completed.returncode != 0:
                raise SystemExit(f"{system} failed:\n{completed.stderr[-3000:]}")
            runs[system].append(json.loads(completed.stdout.strip().splitlines()[-1]))
    results = []
    for system in systems:
        ranked = sorted(runs[system], key=lambda run: run[key])
        results.append({"system": system, "runs": len(ranked), **ranked[len(ranked) // 2]})
    return results


def write_results(name: str, results: list[dict]) -> None:
    """``bench/results/<name>.json`` (ignored by git), as every bench leaves its figures."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1))
