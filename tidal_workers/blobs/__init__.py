"""File bytes: uploads, and the output and error files finalize writes; streamed in and out, never held whole.

One interface, :class:`Blobs`, and two stores behind it, chosen by ``TIDAL_STORAGE``:

- ``local`` (:mod:`.local`): a directory (``TIDAL_BLOB_DIR``), for one host or a directory every host mounts;
- ``s3`` (:mod:`.s3`): S3-compatible object storage (bucket and prefix by settings), for a fleet on several hosts.

A blob's name is what the ``files.blob`` column stores. Names starting with a dot are Tidal's own bookkeeping
(the shared-storage sentinel, writes in progress) and are never listed as blobs. Every process checks at start
that it sees the same storage as the rest of the fleet (:mod:`.sentinel`).
"""

from __future__ import annotations

from config import Settings
from tidal_workers.blobs.base import CHUNK
from tidal_workers.blobs.base import BlobNotFound
from tidal_workers.blobs.base import Blobs
from tidal_workers.blobs.base import IterReader
from tidal_workers.blobs.base import StorageUnavailable
from tidal_workers.blobs.base import TooLarge
from tidal_workers.blobs.base import Written
from tidal_workers.blobs.base import buffered
from tidal_workers.blobs.base import new_name
from tidal_workers.blobs.local import LocalBlobs
from tidal_workers.blobs.s3 import S3Blobs


def open_blobs(settings: Settings) -> Blobs:
    """The store ``TIDAL_STORAGE`` names."""
    if settings.storage == "local":
        return LocalBlobs(settings.blob_path)
    if settings.storage == "s3":
        return S3Blobs.from_settings(settings)
    raise ValueError(f"TIDAL_STORAGE must be 'local' or 's3', not {settings.storage!r}")


__all__ = [
    "CHUNK",
    "BlobNotFound",
    "Blobs",
    "IterReader",
    "StorageUnavailable",
    "TooLarge",
    "Written",
    "buffered",
    "new_name",
    "open_blobs",
]
