"""The SQL store: the source of truth for files, batches, items and results."""

from tidal_workers.store.db import Store
from tidal_workers.store.db import make_engine
from tidal_workers.store.db import rows_updated
from tidal_workers.store.models import ApiKey
from tidal_workers.store.models import Base
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus
from tidal_workers.store.models import Tenant

__all__ = [
    "ApiKey",
    "Base",
    "Batch",
    "BatchStatus",
    "File",
    "Item",
    "ItemStatus",
    "Store",
    "Tenant",
    "make_engine",
    "rows_updated",
]
