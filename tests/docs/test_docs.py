"""Every fenced block of README.md and docs/*.md runs here, as a user would paste it, so the docs cannot rot.

A page runs in a fresh directory laid out like a clone of the repository (its top-level entries
linked, a ``.venv`` that is this test run's environment, already installed), with ``.venv/bin``
first on PATH as after ``source .venv/bin/activate``. README.md starts there with nothing built;
every other page starts with ``out/digits``, the snapshot README's quick start writes, materialized
once per session with README's own command. A page's blocks run in order, each group (a block and
the blocks marked ``continues`` after it) as one bash script, so a block may start servers in the
background that the next ones use (once each printed ``serving on``, as the pages tell the reader to
wait for); whatever a group leaves running is killed when it ends. Pages
run on two lanes side by side (each its own directory and quick-start snapshot), so the module
takes about half the time it would one page after another.

How a block is checked, by its language:

- ``python``: run by the environment's python (``python -`` from the page's directory).
- ``bash``/``sh``: run by bash with ``set -eo pipefail``.
- ``console``: each ``$ `` line is a command; the lines after it are its expected output. A command
  without expected output must succeed.
- ``text``: not run (diagrams, layouts); marked ``output``, the expected output of the block before.

Expected output is matched line by line, in order, against what the block printed (stdout and
stderr, lines stripped, other lines in between allowed); ``...`` in a line matches anything.

Markers, an HTML comment just before the block: ``<!-- doc-test: KIND (why) -->``. The kinds marked
with * change what runs or where and must say why, in the comment:

- ``continues``: part of the group of the block before it (same shell: background jobs, files).
- ``output``: see ``text`` above.
- ``file PATH``: the block is written to PATH (a Python file is also compiled), as the page tells
  the reader to save it.
- ``syntax`` *: only parsed (``compile``, ``bash -n``): what it needs cannot exist here.
- ``make-n`` *: ``make`` runs as ``make -n`` (prints the target's commands, fails on a missing target).
- ``plan-only`` *: the job runs with ``--print_fingerprint``: every flag parsed, the runner checks,
  inputs matched, the function loaded; nothing runs on the engine.
- ``s3`` *, ``gcs`` *: the group runs against moto's S3 server / fake-gcs-server on 127.0.0.1 with a
  fresh bucket ``my-bucket`` (on GCS holding ``raw/``: the bundled digits TFRecords).
- ``airflow`` *: the Python block runs with the Airflow environment's python (``.venv-airflow``).
- ``slow`` *: the group runs only with the tests marked slow (``make test-all``).

Fixed ports in the docs (5050, 50000) become free ports, the same within a page. A block in any other
language, or a marker without its reason, fails ``test_every_block_has_a_way_to_be_checked``.
"""

from __future__ import annotations

import ast
import builtins
import concurrent.futures
import contextlib
import dataclasses
import inspect
import os
import pathlib
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests import helpers

REPO = helpers.REPO_ROOT
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
RUNNABLE = {"python", "bash", "sh", "console"}
NEEDS_REASON = {"syntax", "make-n", "plan-only", "s3", "gcs", "airflow", "slow"}
KINDS = NEEDS_REASON | {"continues", "output", "file"}
PORTS = re.compile(r"\b(5050|50000)\b")
GROUP_TIMEOUT_S = 300
#: Pages run side by side, each lane in a directory of its own.
LANES = max(1, min(2, len(os.sched_getaffinity(0))))
EOF_WORD = "__SNAPFEED_DOC_BLOCK__"
#: Top-level entries of the repository a clone has that the page directories do not link.
NOT_LINKED = {".git", ".venv", ".venv-airflow", "out", "build", "dist", ".pytest_cache", ".ruff_cache", "__pycache__"}
MARKER = re.compile(r"^<!--\s*doc-test:\s*(?P<kind>[a-z0-9-]+)(?P<rest>.*?)-->\s*$")


@dataclasses.dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    markers: dict[str, str]  # kind -> the rest of the comment (a reason, or the file path)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE and "syntax" not in self.markers


def parse_page(page: str) -> list[Block]:
    """The fenced blocks of ``page`` with the markers just before each; raises on a dangling marker."""
    blocks: list[Block] = []
    lines = (REPO / page).read_text().splitlines()
    pending: dict[str, str] = {}
    index = 0
    while index < len(lines):
        line = lines[index]
        match = MARKER.match(line.strip())
        if match:
            pending[match["kind"]] = match["rest"].strip()
        elif line.startswith("```"):
            start, language = index, line[3:].strip()
            index += 1
            body = []
            while index < len(lines) and not lines[index].startswith("```"):
                body.append(lines[index])
                index += 1
            assert index < len(lines), f"{page}:{start + 1}: the block is never closed"
            blocks.append(Block(page, start + 1, language, "\n".join(body) + "\n", pending))
            pending = {}
        elif line.strip() and pending:
            raise AssertionError(f"{page}:{index + 1}: a doc-test marker must come just before a fenced block")
        index += 1
    assert not pending, f"{page}: a doc-test marker at the end of the page marks no block"
    return blocks


def problems(block: Block) -> list[str]:
    """Why ``block`` cannot be checked (empty when it can)."""
    found = []
    for kind, rest in block.markers.items():
        if kind not in KINDS:
            found.append(f"unknown marker kind {kind!r} (known: {', '.join(sorted(KINDS))})")
        elif kind in NEEDS_REASON and not re.fullmatch(r"\(.+\)", rest):
            found.append(f"marker {kind!r} must say why, in parentheses")
        elif kind == "file" and not rest:
            found.append("marker 'file' needs the path to write the block to")
    if "file" in block.markers:
        return found
    if block.language not in RUNNABLE | {"text"}:
        found.append(f"language {block.language or '(none)'!r}: use python, bash, sh, console or text, or a marker")
    if "output" in block.markers and block.language != "text":
        found.append("an 'output' block must be ```text")
    if block.language == "text" and set(block.markers) - {"output"}:
        found.append("a text block is not run: only 'output' applies to it")
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in parse_page(page)]


# --- grouping a page into scripts ----------------------------------------------------------------------------


@dataclasses.dataclass
class Group:
    blocks: list[Block]
    expected: dict[int, Block] = dataclasses.field(default_factory=dict)  # index in blocks -> its output block

    @property
    def markers(self) -> set[str]:
        return {kind for block in self.blocks for kind in block.markers}

    @property
    def slow(self) -> bool:
        return "slow" in self.markers


def groups_of(page: str) -> list[Group]:
    groups: list[Group] = []
    last: Block | None = None
    for block in parse_page(page):
        if block.language == "text":
            if "output" in block.markers:
                assert last is not None and groups, f"{block.where}: an output block follows no block that runs"
                groups[-1].expected[groups[-1].blocks.index(last)] = block
            continue
        if "syntax" in block.markers:
            last = None  # parsed by test_syntax_only_blocks_parse; it has no output to compare
            continue
        if "continues" in block.markers:
            assert groups, f"{block.where}: 'continues' on the first block of the page"
            groups[-1].blocks.append(block)
        else:
            groups.append(Group([block]))
        last = block
    return groups


def _heredoc(command: str, text: str) -> str:
    assert EOF_WORD not in text
    return f"{command} <<'{EOF_WORD}'\n{text}{EOF_WORD}\n"


def _console_commands(block: Block) -> list[tuple[str, list[str]]]:
    """``(command, expected output lines)`` of each ``$ `` line of a console block."""
    commands: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            assert commands, f"{block.where}: a console block starts with a `$ ` command"
            commands[-1][1].append(line)
    return commands


def _transformed(block: Block) -> str:
    text = block.text
    if "plan-only" in block.markers:
        assert "beam_jobs.materialize" in text, f"{block.where}: plan-only applies to the materialize job"
        text = text.replace("beam_jobs.materialize", "beam_jobs.materialize --print_fingerprint")
    return text


def background_servers(text: str) -> int:
    """How many reader.service servers a bash block starts in the background."""
    commands = text.replace("\\\n", " ").splitlines()
    return sum(1 for c in commands if re.search(r"reader\.service (dispatcher|worker)\b.*&\s*(#.*)?$", c))


def script_of(group: Group, state: pathlib.Path, airflow_python: str | None) -> str:
    """One bash script running ``group``'s blocks in order; block i's output goes to ``state/out-i``."""
    parts = ["set -eo pipefail\n"]
    for i, block in enumerate(group.blocks):
        out = state / f"out-{i}"
        parts.append(f"echo {i} > {state / 'current'}\n")
        text = _transformed(block)
        if "file" in block.markers:
            path = block.markers["file"]
            parts.append(f"mkdir -p \"$(dirname '{path}')\"\n" + _heredoc(f"cat > '{path}'", text))
            continue
        if "make-n" in block.markers:
            parts.append('make() { command make -n "$@"; }\n')
        if block.language == "python":
            python = airflow_python if "airflow" in block.markers else "python"
            parts.append("{\n" + _heredoc(f"{python} -", text) + f"}} > {out} 2>&1\n")
        elif block.language in ("bash", "sh"):
            parts.append("{\n" + text + f"}} > {out} 2>&1\n")
            servers = background_servers(text)
            if servers:  # as the pages say: wait until each prints `serving on`
                parts.append(
                    f"for _ in $(seq 1200); do [ $(grep -c '^serving on' {out}) -ge {servers} ] && break; sleep 0.1; done\n"
                )
        else:  # console: commands may fail (they show errors); their output is compared
            parts.append("set +e\n")
            for j, (command, _) in enumerate(_console_commands(block)):
                # $? of each command stays what it was for the next one (`echo $?` shows it)
                parts.append(f"{{ {command}\n}} > {out}-{j} 2>&1\nrc=$?; echo $rc > {out}-{j}.rc; (exit $rc)\n")
            parts.append("set -e\n")
        if "make-n" in block.markers:
            parts.append("unset -f make\n")
    return "".join(parts)


# --- matching output -----------------------------------------------------------------------------------------


def _pattern(line: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in line.strip().split("...")))


def unmatched(expected: list[str], actual: str) -> str | None:
    """The first expected line not found, in order, among the actual lines; None when all are."""
    lines = [line.strip() for line in actual.splitlines()]
    position = 0
    for wanted in expected:
        if not wanted.strip() or wanted.strip() == "...":
            continue
        pattern = _pattern(wanted)
        while position < len(lines) and not pattern.fullmatch(lines[position]):
            position += 1
        if position == len(lines):
            return wanted
        position += 1
    return None


# --- the page's directory, environment and run -----------------------------------------------------------------


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _linked_venv(target: pathlib.Path, venv: pathlib.Path) -> None:
    """``target`` as ``venv``: every entry linked, and a fresh install stamp, so `make install` has nothing to do."""
    target.mkdir()
    for entry in venv.iterdir():
        if entry.name != ".installed":
            (target / entry.name).symlink_to(entry)
    (target / ".installed").touch()


def _airflow_venv() -> pathlib.Path | None:
    python = os.environ.get("SNAPFEED_AIRFLOW_PYTHON") or str(REPO / ".venv-airflow" / "bin" / "python")
    return pathlib.Path(python).parent.parent if os.path.exists(python) else None


def make_clone(clone: pathlib.Path) -> None:
    if clone.exists():
        shutil.rmtree(clone)
    clone.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name not in NOT_LINKED and not entry.name.endswith(".egg-info"):
            (clone / entry.name).symlink_to(entry)
    _linked_venv(clone / ".venv", pathlib.Path(sys.prefix))
    airflow = _airflow_venv()
    if airflow is not None:
        _linked_venv(clone / ".venv-airflow", airflow)


def page_env(clone: pathlib.Path, extra: dict[str, str]) -> dict[str, str]:
    env = helpers.cli_env(**extra)  # PYTHONPATH: this checkout's code for console scripts and subprocesses
    env["PATH"] = os.pathsep.join([str(clone / ".venv" / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(clone / ".venv")
    env["AIRFLOW_HOME"] = str(clone / "out" / "airflow-home")  # never the user's ~/airflow
    env["TMPDIR"] = str(clone.parent / "tmp")  # the log files of failing commands, sdists built for workers
    (clone.parent / "tmp").mkdir(exist_ok=True)
    env.pop("SNAPFEED_JOB_PYTHON", None)
    return env


@dataclasses.dataclass
class Outcome:
    failure: str | None
    seconds: float
    timings: list[str] = dataclasses.field(default_factory=list)


def run_group(group: Group, clone: pathlib.Path, env: dict[str, str], ports: dict[str, str]) -> Outcome:
    state = pathlib.Path(tempfile.mkdtemp(prefix="state-", dir=clone.parent))
    airflow = clone / ".venv-airflow" / "bin" / "python"
    script = PORTS.sub(lambda m: ports.setdefault(m[1], _free_port()), script_of(group, state, str(airflow)))
    started = time.monotonic()
    with open(state / "script.log", "w") as log:
        process = subprocess.Popen(
            ["bash", "-c", script], cwd=clone, env=env, stdout=log, stderr=log, start_new_session=True
        )
        try:
            code = process.wait(timeout=GROUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # background servers the group left running
            process.wait()
    seconds = time.monotonic() - started
    current = int((state / "current").read_text()) if (state / "current").exists() else 0
    block = group.blocks[current]

    def shown(path: pathlib.Path) -> str:
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no output)"

    if code is None or code != 0:
        why = f"timed out after {GROUP_TIMEOUT_S} s" if code is None else f"exited {code}"
        return Outcome(
            f"{block.where} ({block.language}) {why}:\n{shown(state / f'out-{current}')}\n{shown(state / 'script.log')}",
            seconds,
        )
    for i, block in enumerate(group.blocks):
        if block.language == "console":
            for j, (command, expected) in enumerate(_console_commands(block)):
                out = state / f"out-{i}-{j}"
                rc = (state / f"out-{i}-{j}.rc").read_text().strip()
                if not any(line.strip() for line in expected) and rc != "0":
                    return Outcome(f"{block.where}: `{command}` exited {rc}:\n{shown(out)}", seconds)
                missing = unmatched(expected, out.read_text(errors="replace"))
                if missing is not None:
                    return Outcome(
                        f"{block.where}: `{command}` never printed {missing!r}; it printed:\n{shown(out)}", seconds
                    )
        if i in group.expected:
            out = state / f"out-{i}"
            missing = unmatched(group.expected[i].text.splitlines(), out.read_text(errors="replace"))
            if missing is not None:
                return Outcome(
                    f"{block.where}: the output shown at {group.expected[i].where} has {missing!r}, "
                    f"not printed; it printed:\n{shown(out)}",
                    seconds,
                )
    return Outcome(None, seconds)


@dataclasses.dataclass
class Lane:
    """A directory pages run in, one page at a time, with README's quick-start snapshot written there once.

    The snapshot's fingerprint holds the absolute paths of its inputs, so a page that reruns the quick
    start (and expects a reuse, or a rewrite of the same snapshot) must run where it was written.
    """

    base: pathlib.Path
    digits: pathlib.Path | None = None  # out/digits as README's quick start leaves it
    failure: str | None = None

    @property
    def clone(self) -> pathlib.Path:
        return self.base / "snapfeed"

    def quick_start(self) -> None:
        if self.digits is not None or self.failure is not None:
            return
        make_clone(self.clone)
        outcome = run_group(Group([quick_start_block()]), self.clone, page_env(self.clone, {}), {})
        self.failure = outcome.failure
        if self.failure is None:
            self.digits = self.base / "quick-start-digits"
            shutil.move(self.clone / "out" / "digits", self.digits)


def quick_start_block() -> Block:
    (block,) = [b for b in parse_page("README.md") if "--output=out/digits" in b.text]
    return block


def _stores(groups: list[Group], servers: dict) -> dict[str, str]:
    """The emulators' environment for a page whose blocks use them, with a fresh ``my-bucket`` on each."""
    wanted = set().union(*(g.markers for g in groups)) & {"s3", "gcs"}
    env: dict[str, str] = {}
    for kind in sorted(wanted):
        server = servers[kind]
        with contextlib.suppress(Exception):  # left by an earlier page
            server.delete_bucket("my-bucket")
        server.make_bucket("my-bucket")
        if kind == "gcs":
            bucket = server.client().bucket("my-bucket")
            for source in sorted((REPO / "examples" / "data" / "digits").glob("*.tfrecord")):
                bucket.blob(f"raw/{source.name}").upload_from_filename(str(source))
        env.update(server.env)
    return env


def run_page(page: str, lane: Lane, servers: dict, *, slow: bool) -> Outcome:
    """Runs ``page``'s groups in order in a fresh clone on ``lane``; the first failure ends it."""
    started = time.monotonic()
    groups = groups_of(page)
    lane.quick_start()
    if lane.failure is not None:
        return Outcome(f"README's quick start failed, so no page can start from it: {lane.failure}", 0)
    make_clone(lane.clone)
    if page != "README.md":
        shutil.copytree(lane.digits, lane.clone / "out" / "digits", symlinks=True)
    stores = _stores(groups, servers)
    ports: dict[str, str] = {}
    timings = []
    for group in groups:
        if group.slow and not slow:
            continue
        extra = stores if group.markers & {"s3", "gcs"} else {}
        outcome = run_group(group, lane.clone, page_env(lane.clone, extra), ports)
        timings.append(f"{group.blocks[0].where}: {outcome.seconds:.1f} s")
        if outcome.failure is not None:
            return Outcome(outcome.failure, time.monotonic() - started, timings)
    return Outcome(None, time.monotonic() - started, timings)


class PageRuns:
    """The pages this session selected, run in the background on ``LANES`` lanes; each page's test waits for it.

    Running a page is mostly starting Python processes (Beam, TensorFlow, torch, JAX imports), so
    two lanes on two cores take about half the time of one.
    """

    def __init__(self, base: pathlib.Path, selected: list[tuple[str, bool]], servers: dict) -> None:
        lanes = [Lane(base / f"lane-{i}") for i in range(LANES)]
        self._free: queue.Queue[Lane] = queue.Queue()
        for lane in lanes:
            lane.base.mkdir()
            self._free.put(lane)
        self._pool = concurrent.futures.ThreadPoolExecutor(len(lanes), thread_name_prefix="docs-lane")
        self._servers = servers
        self._stores_lock = threading.Lock()
        # the longest first, so the two lanes end together
        by_cost = sorted(selected, key=lambda item: -sum(len(g.blocks) for g in groups_of(item[0])))
        self.futures = {item: self._pool.submit(self._run, *item) for item in by_cost}

    def _run(self, page: str, slow: bool) -> Outcome:
        lane = self._free.get()
        uses_stores = any(g.markers & {"s3", "gcs"} for g in groups_of(page))
        try:
            with self._stores_lock if uses_stores else contextlib.nullcontext():
                return run_page(page, lane, self._servers, slow=slow)
        finally:
            self._free.put(lane)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def page_runs(request, tmp_path_factory) -> PageRuns:
    names = ("test_page_runs_as_written", "test_page_runs_as_written_with_its_slow_blocks")
    selected = [
        (item.callspec.params["page"], item.originalname == names[1])
        for item in request.session.items
        if item.originalname in names and not _skipped_for_airflow(item.callspec.params["page"])
    ]
    markers = set().union(*(g.markers for page, _ in selected for g in groups_of(page)))
    # the emulators start here, in pytest's thread (fixtures are not thread-safe)
    servers = {kind: request.getfixturevalue(f"{kind}_emulator") for kind in ("s3", "gcs") if kind in markers}
    runs = PageRuns(tmp_path_factory.mktemp("docs"), selected, servers)
    yield runs
    runs.close()


def _skipped_for_airflow(page: str) -> bool:
    return any("airflow" in g.markers for g in groups_of(page)) and _airflow_venv() is None


def _needs_airflow(page: str) -> None:
    if _skipped_for_airflow(page):
        pytest.skip("needs the Airflow environment: SNAPFEED_AIRFLOW_PYTHON or .venv-airflow (run `make test`)")


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page, page_runs):
    _needs_airflow(page)
    outcome = page_runs.futures[(page, False)].result()
    print("\n".join(outcome.timings))
    assert outcome.failure is None, outcome.failure


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if any(g.slow for g in groups_of(p))])
def test_page_runs_as_written_with_its_slow_blocks(page, page_runs):
    _needs_airflow(page)
    outcome = page_runs.futures[(page, True)].result()
    print("\n".join(outcome.timings))
    assert outcome.failure is None, outcome.failure


# --- checks that run nothing -----------------------------------------------------------------------------------


def test_every_block_has_a_way_to_be_checked():
    found = [f"{block.where}: {problem}" for block in all_blocks() for problem in problems(block)]
    assert not found, "\n".join(found)


def test_syntax_only_blocks_parse():
    for block in all_blocks():
        if "syntax" not in block.markers:
            continue
        if block.language == "python":
            compile(block.text, block.where, "exec")
        else:
            checked = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, check=False)
            assert checked.returncode == 0, f"{block.where}: {checked.stderr}"


def test_files_the_docs_save_are_valid_python():
    for block in all_blocks():
        if "file" in block.markers and block.markers["file"].endswith(".py"):
            compile(block.text, block.where, "exec")


def test_the_markers_that_skip_running_stay_rare():
    """Each marker that keeps a block from running as written is a promise to keep them few."""
    partial = [b.where for b in all_blocks() if b.markers.keys() & {"syntax", "make-n", "plan-only"}]
    assert len(partial) <= 5, partial


def _headings(text: str) -> set[str]:
    return {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}


def test_links_between_pages_resolve():
    for page in PAGES:
        text = (REPO / page).read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target:
                assert (REPO / page).parent.joinpath(target).exists(), f"{page}: link to {target} goes nowhere"


def _code_files():
    for folder in ("beam_jobs", "reader", "schemas", "bench", "examples", "tests"):
        yield from (REPO / folder).rglob("*.py")
    yield REPO / "examples" / "dataflow" / "Dockerfile"


def test_what_the_code_cites_exists():
    """A docs page and section that code names (in messages and comments: the page's path, then the heading in double
    quotes) is a heading of that page, no code points at README for what moved to docs/; a `§N.M` of
    docs/architecture.md that code cites is a heading there."""
    architecture = "\n".join(_headings((REPO / "docs" / "architecture.md").read_text()))
    missing = []
    cited = 0
    for path in _code_files():
        text = path.read_text()
        for page, section in re.findall(r"(docs/[\w-]+\.md):? \"([^\"]+)\"", text):
            cited += 1
            if not (REPO / page).exists() or not any(
                h.startswith(section) for h in _headings((REPO / page).read_text())
            ):
                missing.append(f"{path.relative_to(REPO)}: {page} {section!r}")
        missing += [f"{path.relative_to(REPO)}: README {s!r}" for s in re.findall(r"README:? \"([^\"]+)\"", text)]
        for number in re.findall(r"architecture\.md §(\d+(?:\.\d+)?)", text):
            if not re.search(rf"^{re.escape(number)}\.? ", architecture, re.MULTILINE):
                missing.append(f"{path.relative_to(REPO)}: architecture.md §{number}")
    assert cited >= 5 and not missing, missing


# --- the docs name what the code has -----------------------------------------------------------------------------


def _flags(parser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings if option.startswith("--")}


def test_every_materialize_flag_is_in_the_flag_table():
    from beam_jobs import flags

    table = (REPO / "docs" / "materialize.md").read_text()
    documented = set(re.findall(r"^\| `(--[a-z_]+)`", table, re.MULTILINE))
    assert documented == _flags(flags.help_parser()) - {"--help"}


def test_every_service_and_snapfeed_flag_is_documented():
    from reader.service.__main__ import build_parser as service_parser
    from reader.snapshots.cli import build_parser as snapfeed_parser

    for page, parser in (("docs/service.md", service_parser()), ("docs/snapshot-tool.md", snapfeed_parser())):
        text = (REPO / page).read_text()
        (subparsers,) = [a for a in parser._actions if a.choices and isinstance(a.choices, dict)]
        for name, sub in subparsers.choices.items():
            assert name in text, f"{page}: subcommand {name}"
            for flag in _flags(sub) - {"--help"}:
                assert flag in text, f"{page}: {name} {flag}"


def test_every_distributed_dataset_argument_is_documented():
    import reader

    text = "\n".join((REPO / "docs" / page).read_text() for page in ("reading.md", "accelerators.md", "service.md"))
    for name in list(inspect.signature(reader.distributed_dataset).parameters)[2:]:
        assert f"{name}=" in text or f"`{name}`" in text, name


def test_every_error_class_and_exit_code_is_in_the_errors_page():
    from schemas import errors

    text = (REPO / "docs" / "errors.md").read_text()
    for name, value in vars(errors).items():
        if isinstance(value, type) and issubclass(value, errors.SnapfeedError):
            assert f"| `{name}` |" in text, name
        if name.startswith("EXIT_"):
            assert f"| {value} |" in text, name


def module_map_paths() -> list[str]:
    """The files and folders docs/architecture.md §7 names; a bare name is in the folder named before it in its row."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("## 7. Module map") : text.index("## 8.")]
    paths = []
    for row in table.splitlines():
        if not row.startswith("| ") or row.startswith("| Concept"):
            continue
        folder = ""
        for token in re.findall(r"`([\w/.-]+)`", row.split("|")[-2]):
            if "/" in token:
                folder = token.rstrip("/") if token.endswith("/") else token.rsplit("/", 1)[0]
                paths.append(token)
            else:
                paths.append(f"{folder}/{token}")
    return paths


def test_the_module_map_names_files_that_exist():
    """Every file architecture.md §7 names exists."""
    paths = module_map_paths()
    assert len(paths) > 60 and any(p.startswith("reader/core/") for p in paths)
    assert [p for p in paths if not (REPO / p).exists()] == []


def test_the_module_map_covers_every_module():
    """Every module of the packages and of the shared harness is in architecture.md §7 (generated protobuf code
    beside its .proto, which the map names, aside)."""
    listed = set(module_map_paths())
    modules = [
        str(path.relative_to(REPO))
        for package in ("reader", "beam_jobs", "schemas", "testing")
        for path in (REPO / package).rglob("*.py")
        if path.name != "__init__.py" and not path.name.endswith("_pb2.py")
    ]
    assert len(modules) > 100
    assert [module for module in sorted(modules) if module not in listed] == []


def test_the_readme_stays_a_first_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 175, len(lines)
    text = "\n".join(lines)
    for needed in ("source .venv/bin/activate", "make demo", "make test", *(f"docs/{p}" for p in _doc_pages())):
        assert needed in text, needed


def _doc_pages() -> list[str]:
    return sorted(p.name for p in (REPO / "docs").glob("*.md"))


def test_python_blocks_define_what_they_use():
    """A pasted block runs alone: every name it loads is bound in it (or a builtin), unless it continues one."""
    known = set(dir(builtins))
    for block in all_blocks():
        if block.language != "python" or "continues" in block.markers or "file" in block.markers:
            continue
        tree = ast.parse(block.text)
        bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert loaded <= bound | known, f"{block.where}: {sorted(loaded - bound - known)} undefined"


# --- the harness itself ------------------------------------------------------------------------------------------


def test_expected_output_matches_in_order_with_wildcards():
    printed = "/tmp/x/out/digits/ab12 state=written rows=1797 shards=1\nepoch 0: 1797 rows\n"
    assert unmatched([".../out/digits/... state=written rows=1797 ...", "epoch 0: 1797 rows"], printed) is None
    assert unmatched(["epoch 0: 1797 rows", "...state=written..."], printed) == "...state=written..."
    assert unmatched(["state=reused"], printed) == "state=reused"


def test_a_block_that_fails_midway_fails_with_its_place_and_output(tmp_path):
    make_clone(tmp_path / "snapfeed")
    blocks = [
        Block("page.md", 3, "bash", "echo first\n", {}),
        Block("page.md", 9, "python", "print('second')\nundefined_name\nprint('never')\n", {"continues": ""}),
        Block("page.md", 15, "bash", "echo third\n", {"continues": ""}),
    ]
    outcome = run_group(Group(blocks), tmp_path / "snapfeed", page_env(tmp_path / "snapfeed", {}), {})
    assert outcome.failure is not None and outcome.failure.startswith("page.md:9 (python) exited 1")
    assert "second" in outcome.failure and "NameError" in outcome.failure and "never" not in outcome.failure
