"""``pip install snapfeed``: the base install reads snapshots on Python 3.11, 3.12 and 3.13, alone.

A wheel built from this checkout (``pip wheel --no-deps``) goes into a fresh virtualenv of each
interpreter with its base dependencies from the package index, then reads a snapshot that this (full)
environment wrote: locally, through the reader service it starts from that virtualenv, and with the
``snapfeed`` tool. Nothing of the job or of a framework is there, and what needs one says, in one line,
which extra installs it. ``[torch]`` adds torch and reads tensors. (The sdist the job stages for remote
workers requires the job's dependencies: tests/beam_jobs/runners/test_worker_packages.py.)

pip's cache lives in the repository (``.cache/pip``): nothing is cached outside it.
"""

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from tests import helpers

VERSIONS = ("3.11", "3.12", "3.13")
HEAVY = ("tensorflow", "apache_beam", "tfx_bsl", "tensorflow_transform", "torch", "jax", "keras")

#: Run by each virtualenv's python: reads the snapshot locally and through the service, says what it imported.
READ_PROGRAM = """
import importlib.util, json, sys, time
import reader
from reader.service import DispatchServer, WorkerConfig, WorkerServer
from schemas.errors import UsageError

snapshot = sys.argv[1]
report = {"python": sys.version.split()[0]}
report["ids"] = sorted(i for step in reader.distributed_dataset(snapshot, 64, seed=1) for i in step["id"].tolist())
dispatcher = DispatchServer().start()
worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start()
try:
    served = reader.distributed_dataset(snapshot, 64, seed=1, service=dispatcher.target)
    report["served"] = sorted(i for step in served for i in step["id"].tolist())
finally:
    worker.stop()
    dispatcher.stop()
report["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in json.loads(sys.argv[2]))
report["installed"] = sorted(m for m in json.loads(sys.argv[2]) if importlib.util.find_spec(m) is not None)
refusals = {}
for name, ask in {
    "torch": lambda: reader.distributed_dataset(snapshot, 64, output="torch"),
    "jax": lambda: reader.distributed_dataset(snapshot, 64, output="jax"),
    "tf": lambda: reader.dataset(snapshot, 64),
    "to_torch": lambda: reader.distributed_dataset(snapshot, 64).to_torch(),
}.items():
    try:
        ask()
    except UsageError as exc:
        refusals[name] = str(exc)
report["refusals"] = refusals
print(json.dumps(report))
"""


def interpreter(version: str) -> str | None:
    """A python of ``version``: pyenv's (this machine kind has 3.11, 3.12 and 3.13 there), else on PATH."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = os.path.expanduser("~/.pyenv")
    found = sorted(pathlib.Path(root, "versions").glob(f"{version}.*/bin/python"))
    if found:
        return str(found[-1])
    on_path = subprocess.run(["which", f"python{version}"], capture_output=True, text=True)
    return on_path.stdout.strip() or None


def pip_env() -> dict[str, str]:
    return {**helpers.cli_env(), "PIP_CACHE_DIR": str(helpers.REPO_ROOT / ".cache" / "pip"), "PYTHONPATH": ""}


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, env=pip_env(), **kwargs)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}: {done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(helpers.REPO_ROOT)])
    (built,) = out.glob("snapfeed-*.whl")
    return str(built)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> str:
    return helpers.write_snapshot(tmp_path_factory.mktemp("written"), "full-env", helpers.id_batches([300, 200]))


def virtualenv(version: str, path: pathlib.Path, *requirements: str) -> pathlib.Path:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (pyenv versions)")
    run([python, "-m", "venv", str(path)])
    run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", *requirements])
    return path / "bin"


def requires(wheel_file: str) -> list[str]:
    """The wheel's unconditional requirements (Requires-Dist without an extra)."""
    with zipfile.ZipFile(wheel_file) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    return [
        line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_base_install_reads_a_snapshot_on_each_python(version, wheel, snapshot, tmp_path):
    bin_dir = virtualenv(version, tmp_path / "venv", wheel)
    done = run([str(bin_dir / "python"), "-c", READ_PROGRAM, snapshot, json.dumps(HEAVY)], cwd=tmp_path)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["python"].startswith(version)
    assert report["ids"] == report["served"] == list(range(500))
    assert report["installed"] == [] and report["imported"] == [], "the base install holds no framework, no job"
    extras = {"torch": "torch", "jax": "jax", "tf": "tf", "to_torch": "torch"}
    for asked, extra in extras.items():
        assert f"pip install 'snapfeed[{extra}]'" in report["refusals"][asked], report["refusals"]
        assert "\n" not in report["refusals"][asked]

    tool = run([str(bin_dir / "snapfeed"), "verify", snapshot], cwd=tmp_path)
    assert "ok" in tool.stdout
    for job in (
        [str(bin_dir / "python"), "-m", "beam_jobs.materialize", "--help"],
        [str(bin_dir / "snapfeed-materialize")],
    ):
        refused = subprocess.run(job, capture_output=True, text=True, env=pip_env(), cwd=tmp_path)
        assert refused.returncode == 2
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("usage error: ") and "pip install 'snapfeed[job]'" in line


def test_the_torch_extra_reads_torch_tensors(wheel, snapshot, tmp_path):
    # torch 2.13.0: the CPU wheel this machine kind has on disk (an unpinned torch is a multi-GB CUDA download).
    bin_dir = virtualenv("3.11", tmp_path / "venv", f"{wheel}[torch]", "torch==2.13.0")
    program = (
        "import sys, torch, reader; steps = list(reader.distributed_dataset(sys.argv[1], 100, output='torch'));"
        "assert all(isinstance(s['id'], torch.Tensor) for s in steps);"
        "print(sorted(torch.cat([s['id'] for s in steps]).tolist()) == list(range(500)))"
    )
    assert run([str(bin_dir / "python"), "-c", program, snapshot], cwd=tmp_path).stdout.strip() == "True"


def test_the_base_wheel_requires_no_framework(wheel):
    base = " ".join(requires(wheel))
    assert "numpy" in base and "pyarrow" in base and "grpcio" in base
    for heavy in ("tensorflow", "apache-beam", "tfx-bsl", "torch", "jax"):
        assert heavy not in base
