"""What remote workers install: snapfeed itself, staged by the job, and the user's package, staged by the user.

The stock Beam worker image has neither ``beam_jobs``/``schemas`` nor the
user's preprocessing module (nor TensorFlow and tfx-bsl). Unless a worker
image is named (``--sdk_container_image``, built from
``examples/dataflow/Dockerfile``), the job builds snapfeed's sdist from its
source tree and adds it to ``--extra_package``: the workers' boot installs it
with its dependencies, the job's included (``JOB_PACKAGE_MARKER``). The user's module travels the same way, in a package
the user names (docs/engines-and-stores.md "Running on other engines").
"""

from __future__ import annotations

import atexit
import functools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, SetupOptions, WorkerOptions

import beam_jobs
from schemas import file_lock
from schemas.errors import SnapfeedError, UsageError

#: The directory holding snapfeed's setup.py when snapfeed runs from its source tree (an editable install).
SOURCE_ROOT = pathlib.Path(beam_jobs.__file__).resolve().parent.parent
SNAPFEED_MODULE = "beam_jobs"
#: A file setup.py looks for: present, snapfeed installs with the job's dependencies (setup.py's JOB).
JOB_PACKAGE_MARKER = "snapfeed-job-package"


def worker_image(options: PipelineOptions) -> str:
    """The worker image the user named, or ""."""
    portable = options.view_as(PortableOptions)
    docker = (portable.environment_type or "docker").lower() == "docker"
    image = portable.lookup_environment_option("docker_container_image") or (docker and portable.environment_config)
    return options.view_as(WorkerOptions).sdk_container_image or image or ""


def _module_pattern(module: str) -> re.Pattern:
    top = re.escape(module.split(".", 1)[0])
    return re.compile(rf"(^|/){top}(\.py|/__init__\.py)$")


def archive_has_module(archive: str, module: str) -> bool:
    """Whether an sdist (.tar.gz) or wheel/zip holds the top-level package or module of ``module``."""
    if not os.path.isfile(archive):
        raise UsageError(f"--extra_package={archive} does not exist: build the package first (python setup.py sdist)")
    try:
        if archive.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as bundle:
                names = bundle.namelist()
        else:
            with tarfile.open(archive) as bundle:
                names = bundle.getnames()
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise UsageError(f"--extra_package={archive} cannot be opened as a package archive: {exc}") from exc
    pattern = _module_pattern(module)
    return any(pattern.search(name) for name in names)


def tree_has_module(directory: str, module: str) -> bool:
    """Whether a setup.py's directory holds ``module`` at its top or under src/."""
    top = module.split(".", 1)[0]
    roots = (pathlib.Path(directory), pathlib.Path(directory) / "src")
    return any((root / f"{top}.py").is_file() or (root / top / "__init__.py").is_file() for root in roots)


def shipped(options: PipelineOptions, module: str) -> bool:
    """Whether --extra_package or --setup_file carries ``module`` to the workers."""
    setup = options.view_as(SetupOptions)
    if setup.setup_file and tree_has_module(os.path.dirname(os.path.abspath(setup.setup_file)), module):
        return True
    return any(archive_has_module(package, module) for package in setup.extra_packages or [])


@functools.cache
def snapfeed_sdist() -> str:
    """Builds snapfeed's sdist once per process into a temporary directory removed at exit; returns its path."""
    if not (SOURCE_ROOT / "setup.py").is_file():
        raise UsageError(
            f"snapfeed is installed without its source tree ({SOURCE_ROOT} has no setup.py), so the job cannot "
            f"stage it for remote workers: pass --extra_package=snapfeed-VERSION.tar.gz or a worker image "
            f"(--sdk_container_image) that has it"
        )
    dist = tempfile.mkdtemp(prefix="snapfeed-worker-package-")
    atexit.register(shutil.rmtree, dist, ignore_errors=True)
    # ``setup.py sdist`` assembles its release tree (``snapfeed-VERSION/``, hard links) and the egg-info in the
    # source root, not in --dist-dir: builds from one checkout take turns, or two jobs launched at once (or two test
    # processes) remove each other's tree mid-archive ("No such file or directory: 'snapfeed-0.1.0/...'").
    (SOURCE_ROOT / "build").mkdir(exist_ok=True)
    with file_lock.locked(SOURCE_ROOT / "build" / "snapfeed-sdist.lock"):
        built = subprocess.run(
            [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", dist],
            cwd=SOURCE_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    archives = list(pathlib.Path(dist).glob("snapfeed-*.tar.gz"))
    if built.returncode != 0 or len(archives) != 1:
        raise SnapfeedError(
            f"building snapfeed's sdist for the workers in {SOURCE_ROOT} failed: {built.stderr.strip()[-500:]}"
        )
    _mark_as_job_package(archives[0])
    return str(archives[0])


def _mark_as_job_package(archive: pathlib.Path) -> None:
    """Puts ``JOB_PACKAGE_MARKER`` beside the sdist's setup.py, so that installing it brings the job's
    dependencies (``snapfeed[job]``): a worker's boot installs a staged archive as it is, no extra named."""
    with tempfile.TemporaryDirectory(prefix="snapfeed-worker-package-") as unpacked:
        with tarfile.open(archive) as bundle:
            bundle.extractall(unpacked, filter="data")
        (top,) = pathlib.Path(unpacked).iterdir()
        (top / JOB_PACKAGE_MARKER).write_text(
            "staged by beam_jobs for remote workers: install the job's dependencies\n"
        )
        with tarfile.open(archive, "w:gz") as bundle:
            bundle.add(top, arcname=top.name)


def stage_snapfeed(options: PipelineOptions) -> None:
    """Adds snapfeed's sdist to --extra_package unless the image or a named package already has it."""
    if worker_image(options) or shipped(options, SNAPFEED_MODULE):
        return
    setup = options.view_as(SetupOptions)
    setup.extra_packages = [*(setup.extra_packages or []), snapfeed_sdist()]


def staged_artifacts(proto_pipeline) -> tuple[str, tuple[str, ...]]:
    """The worker image and the names of the files staged for workers, from a translated pipeline."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    images, names = set(), set()
    for environment in proto_pipeline.components.environments.values():
        if environment.urn == common_urns.environments.DOCKER.urn:
            images.add(beam_runner_api_pb2.DockerPayload.FromString(environment.payload).container_image)
        for artifact in environment.dependencies:
            if artifact.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
                role = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload)
                names.add(role.staged_name)
    return ", ".join(sorted(images)), tuple(sorted(names))
