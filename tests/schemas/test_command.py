"""The error edge of every command line (``schemas.command``): a reader that closes stdout early is not an error."""

import subprocess
import sys

from tests import helpers

PRINTS_MANY_LINES = (
    "import sys\n"
    "from schemas import command\n"
    "def body():\n"
    "    for index in range(200_000):\n"
    "        print(f'line {index}')\n"
    "    return 0\n"
    "sys.exit(command.run('lines', body, []))\n"
)


def test_a_reader_closing_stdout_early_ends_the_command_quietly():
    process = subprocess.Popen(
        [sys.executable, "-c", PRINTS_MANY_LINES],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=helpers.cli_env(),
    )
    assert process.stdout.readline() == b"line 0\n"
    process.stdout.close()  # as `| head -1` does
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, stderr
    assert stderr == "", "no 'unexpected BrokenPipeError ... a bug in snapfeed' line, no traceback"
