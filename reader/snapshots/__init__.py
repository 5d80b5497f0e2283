"""The ``snapfeed`` snapshot tool: inventory, verification, fingerprint explanations and gc."""

from reader.snapshots.cli import main
from reader.snapshots.gc import Removal, plan_removals
from reader.snapshots.inventory import RunDir, SnapshotEntry, inspect, scan

__all__ = ["Removal", "RunDir", "SnapshotEntry", "inspect", "main", "plan_removals", "scan"]
