"""The job's last stage, the commit path: ``WriteSnapshot`` (shards written by workers, reported as data) and the
commit protocol it ends in (``commit``: pending marker, finalize with a no-overwrite create, failure records)."""
