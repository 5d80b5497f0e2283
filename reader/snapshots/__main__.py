import sys

from reader.snapshots.cli import main

sys.exit(main())
