"""Storage with one interface and a backend per URI scheme (local disk, ``gs://``, ``s3://``).

``store_for(path)`` returns the backend; ``schemas.storage`` is the
path-level API the job, the reader and the tools call.
"""

from schemas.stores.base import Entry, OutputFile, Store
from schemas.stores.registry import forget, store_for, supported_schemes, using

__all__ = ["Entry", "OutputFile", "Store", "forget", "store_for", "supported_schemes", "using"]
