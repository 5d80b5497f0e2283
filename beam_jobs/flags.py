"""The materialize job's command line: snapfeed's flags with help, Beam's passed through, typos refused.

Beam's ``PipelineOptions`` silently drops a flag that no options class knows,
so a typo (``--compresion=LZ4``) would run the job with the default codec and a
fingerprint nobody asked for. Here every flag must be snapfeed's or belong to a
registered Beam options class; anything else is a usage error naming the
nearest valid flag. ``--help`` lists snapfeed's flags (Beam's are Beam's docs).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, _BeamArgumentParser

from beam_jobs.options import MaterializeOptions
from schemas import command
from schemas.errors import UsageError

PROG = "python -m beam_jobs.materialize"
_DESCRIPTION = "Preprocess raw files once with Apache Beam into a fingerprinted, finalized snapshot."
_EPILOG = (
    "Any Beam pipeline option passes through (--runner, --direct_running_mode, --direct_num_workers, "
    "--temp_location, --setup_file, ...). Exit codes: 0 written or reused, 1 failure, 2 usage error, "
    "3 another writer is in progress (--wait waits for it), 130/143 stopped by Ctrl-C/SIGTERM (the run is marked "
    "failed; a rerun starts over at once)."
)
#: Runners that Beam ships but does not resolve by short name, keyed like Beam's map (lowercase, no "runner").
#: DaskRunner is Beam's with its upstream bugs worked around (beam_jobs/runners/dask_runner.py says which).
_RUNNER_PATHS = {"dask": "beam_jobs.runners.dask_runner.DaskRunner"}
_RUNNER_PACKAGES = {"dask": ("dask", "distributed")}


class _AllFlagsParser(_BeamArgumentParser, command.ArgumentParser):
    """Beam's parser (value-provider flags, no abbreviations) whose mistakes are usage errors."""


def help_parser() -> argparse.ArgumentParser:
    """snapfeed's own flags, with their help: what ``--help`` prints."""
    parser = command.ArgumentParser(prog=PROG, description=_DESCRIPTION, epilog=_EPILOG, allow_abbrev=False)
    MaterializeOptions._add_argparse_args(parser)
    parser.add_argument(command.VERBOSE_FLAG, action="store_true", help=command.VERBOSE_HELP)
    return parser


def _every_beam_flag() -> argparse.ArgumentParser:
    parser = _AllFlagsParser(prog=PROG, add_help=False, allow_abbrev=False)
    for cls in {str(cls): cls for cls in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return parser


def _refuse_unknown(rest: list[str]) -> None:
    """Raises a usage error for the first of ``rest`` that neither snapfeed nor Beam knows."""
    beam = _every_beam_flag()
    _, unknown = beam.parse_known_args(rest)
    unknown = [arg for arg in unknown if arg != "--"]
    if not unknown:
        return
    flag = next((arg for arg in unknown if arg.startswith("-")), None)
    if flag is None:
        raise UsageError(f"unexpected argument {unknown[0]!r}: every job input is a --flag (see `{PROG} --help`)")
    name = flag.split("=", 1)[0]
    known = [
        option for parser in (help_parser(), beam) for action in parser._actions for option in action.option_strings
    ]
    nearest = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {nearest[0]}?" if nearest else f"`{PROG} --help` lists snapfeed's flags"
    raise UsageError(f"unknown flag {name}: not a snapfeed or Beam option; {hint}")


def _resolve_runner(options: PipelineOptions) -> None:
    """Makes the short names of Beam's runners outside Beam's own list work (``--runner=DaskRunner``).

    The runner's module (also of a runner given by its path) is imported here so its options class
    (``--dask_client_address``) is registered before unknown flags are looked for.
    """
    standard = options.view_as(StandardOptions)
    given = standard.runner or ""
    if "." in given:  # a runner named by its module path: that module may define options too
        module, _, _ = given.rpartition(".")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"--runner={given}: cannot import {module} ({exc})") from exc
        return
    key = given.lower().removesuffix("runner")
    if key not in _RUNNER_PATHS:
        return
    missing = [package for package in _RUNNER_PACKAGES[key] if importlib.util.find_spec(package) is None]
    if missing:
        raise UsageError(f"--runner={given} needs {' and '.join(missing)}: pip install {' '.join(missing)}")
    module, _, _ = _RUNNER_PATHS[key].rpartition(".")
    importlib.import_module(module)
    standard.runner = _RUNNER_PATHS[key]


def parse(argv: list[str]) -> PipelineOptions:
    """The job's options from ``argv``; ``--help`` prints and exits, any unknown flag is a ``UsageError``."""
    _, rest = help_parser().parse_known_args(argv)
    options = PipelineOptions(argv)
    _resolve_runner(options)
    _refuse_unknown(rest)
    return options
