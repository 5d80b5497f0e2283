"""``testing`` is the harness both ``tests`` and ``bench`` import: it imports neither, ``bench`` never imports
``tests``, and ``tests`` imports ``bench`` only in ``tests/bench`` (the benches' own tests)."""

from __future__ import annotations

import ast
import pathlib

from tests import helpers

TREES = ("testing", "bench", "tests", "examples")


def imported_trees(path: pathlib.Path) -> set[str]:
    """The top-level packages a file imports, lazily or not."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def crossings(files: dict[str, set[str]]) -> list[str]:
    """``relative path -> trees imported`` to the imports the harness rule refuses."""
    refused = {"testing": {"tests", "bench"}, "bench": {"tests"}, "examples": {"tests", "bench"}}
    found = []
    for name, trees in sorted(files.items()):
        top = name.split("/")[0]
        banned = refused.get(top, set()) | (
            {"bench"} if top == "tests" and not name.startswith("tests/bench/") else set()
        )
        found += [f"{name} imports {tree}" for tree in sorted(trees & banned)]
    return found


def test_tests_and_benches_meet_only_in_the_harness():
    files = {
        str(path.relative_to(helpers.REPO_ROOT)): imported_trees(path)
        for tree in TREES
        for path in (helpers.REPO_ROOT / tree).rglob("*.py")
    }
    assert len(files) > 100
    assert crossings(files) == []


def test_the_rule_sees_a_crossing():
    assert crossings({"bench/x.py": {"tests"}, "tests/reader/y.py": {"bench", "testing"}}) == [
        "bench/x.py imports tests",
        "tests/reader/y.py imports bench",
    ]
    assert crossings({"tests/bench/test_x.py": {"bench"}, "testing/z.py": {"schemas"}}) == []
