"""snapfeed's Beam side: the materialize job and the ``WriteSnapshot`` transform."""

__version__ = "0.1.0"

from beam_jobs.commit import FinalizeOutcome, RunSpec  # noqa: E402
from beam_jobs.write_snapshot import WriteSnapshot  # noqa: E402

__all__ = ["FinalizeOutcome", "RunSpec", "WriteSnapshot", "__version__"]
