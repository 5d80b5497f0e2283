"""The optional parts of snapfeed, each one ``pip install 'snapfeed[EXTRA]'`` away, and the line a user gets without it.

``pip install snapfeed`` is the reader, the reader service and the ``snapfeed`` tool over local
snapshots, with NumPy, pyarrow and gRPC only. Each framework, store client and the Beam job is an
extra (setup.py lists what each installs). A feature whose packages are missing says so in one
``UsageError`` line naming the extra, where it is asked for, before anything is read.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from schemas.errors import UsageError

#: The extra that installs each optional module (by its top-level import name), and its distribution's name.
EXTRA_OF = {
    "tensorflow": ("tf", "TensorFlow"),
    "keras": ("tf", "Keras"),
    "torch": ("torch", "PyTorch"),
    "jax": ("jax", "JAX"),
    "apache_beam": ("job", "Apache Beam"),
    "tfx_bsl": ("job", "tfx-bsl"),
    "tensorflow_transform": ("job", "tensorflow-transform"),
    "google.cloud.storage": ("gcs", "google-cloud-storage"),
    "google.auth": ("gcs", "google-auth"),
    "boto3": ("s3", "boto3"),
}


def _refusal(module: str, what: str) -> UsageError:
    extra, name = EXTRA_OF[module]
    return UsageError(f"{what} needs {name}, which is not installed here: pip install 'snapfeed[{extra}]'")


def missing(module: str, what: str) -> UsageError | None:
    """The one-line error for ``what`` when ``module`` is not installed, else None (nothing is imported)."""
    if module in sys.modules:
        return None
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (google.cloud) is missing
        found = False
    return None if found else _refusal(module, what)


def check(module: str, what: str) -> None:
    """The one-line ``UsageError`` naming the extra that installs ``module`` when it is absent; imports nothing
    (a store imports its client only when it needs it)."""
    if (error := missing(module, what)) is not None:
        raise error


def require(module: str, what: str) -> ModuleType:
    """``import module``, or the one-line ``UsageError`` naming the extra that installs it.

    Imported at once, not looked up first: a command's first import of TensorFlow is the one that drops its
    start-up noise (``schemas.command.quiet_first_import``). Only a module that is absent is reported so: an
    installed one that fails to import (a dependency of its own missing) raises its own error.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module == exc.name or module.startswith(f"{exc.name}.")):
            raise
        raise _refusal(module, what) from None
