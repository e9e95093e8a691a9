"""The SQL store: the source of truth for files, batches, items and results."""
from tidal_workers.store.db import Store, make_engine
from tidal_workers.store.models import ApiKey, Base, Batch, BatchStatus, File, Item, ItemStatus, Tenant

__all__ = [
    "ApiKey", "Base", "Batch", "BatchStatus", "File", "Item", "ItemStatus", "Store", "Tenant", "make_engine",
]
