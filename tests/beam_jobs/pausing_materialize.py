"""``python -m tests.beam_jobs.pausing_materialize DIR ARGS...``: the materialize CLI, paused in finalize.

A preprocessing barrier holds writers before their commit protocol starts, so
it cannot open the window *inside* finalize. This driver can: once the writer
has checked that it owns the snapshot (right after it builds its manifest) it
touches ``DIR/finalizing-<pid>`` and blocks until ``DIR/release`` exists, so a
test can run another writer's whole commit in between. The DirectRunner runs
finalize in this process, so patching the module here is enough.
"""

from __future__ import annotations

import functools
import os
import pathlib
import sys
import time

from beam_jobs import materialize
from beam_jobs.writing import commit


def _pausing(function, directory: pathlib.Path, timeout: float = 120.0):
    @functools.wraps(function)
    def paused(*args, **kwargs):
        result = function(*args, **kwargs)
        (directory / f"finalizing-{os.getpid()}").touch()
        deadline = time.monotonic() + timeout
        while not (directory / "release").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no release file in {directory}")
            time.sleep(0.05)
        return result

    return paused


def main() -> int:
    directory = pathlib.Path(sys.argv[1])
    commit.build_manifest = _pausing(commit.build_manifest, directory)
    return materialize.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
