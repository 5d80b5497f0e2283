"""The reader service's consumer: the source behind ``reader.distributed_dataset(service=...)``.

It talks to the servers only through the wire (``reader.service.rpc``,
``transport``, ``auth``) and the names both sides share
(``reader.service.protocol``, ``splits``, ``delivery``); no server module
imports it.
"""

from reader.service.client.connection import ServiceConnection
from reader.service.client.source import ServiceIterator, ServiceJob, ServiceSource

__all__ = ["ServiceConnection", "ServiceIterator", "ServiceJob", "ServiceSource"]
