"""Regenerates the committed ``*_pb2.py`` modules from ``schemas/*.proto``.

Generated code is committed so that installing snapfeed needs no protoc; the
test suite runs ``--check`` so a stale module fails CI instead of silently
drifting from its ``.proto``. Run ``make protos`` after editing a ``.proto``.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import subprocess
import sys
import tempfile

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = REPO_ROOT / "schemas"


def proto_files() -> list[pathlib.Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Runs protoc (from grpcio-tools) for every proto; returns the generated files.

    protoc runs in a child process: grpc_tools' in-process compiler shares
    protobuf's C++ descriptor pool with whatever the caller has loaded
    (TensorFlow, Beam) and crashes the interpreter when both are present.
    """
    generated = []
    for proto in proto_files():
        relative = proto.relative_to(REPO_ROOT)
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO_ROOT}",
            f"--python_out={out_dir}",
            str(relative),
        ]
        completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise SystemExit(f"protoc failed on {relative}: {completed.stderr.strip()}")
        generated.append(out_dir / relative.with_name(relative.stem + "_pb2.py"))
    return generated


def stale_modules() -> list[str]:
    """Names of committed modules that differ from freshly generated ones."""
    with tempfile.TemporaryDirectory() as tmp:
        stale = []
        for fresh in generate(pathlib.Path(tmp)):
            committed = REPO_ROOT / fresh.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                stale.append(str(committed.relative_to(REPO_ROOT)))
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed module is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_modules()
        for name in stale:
            print(f"stale: {name} (run `make protos`)", file=sys.stderr)
        return 1 if stale else 0
    for path in generate(REPO_ROOT):
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
