"""Blobs in a local directory: one host, or a directory every host mounts at the same path."""

from __future__ import annotations

import errno
import os
import time
import typing as t
from pathlib import Path

from tidal_workers.blobs.base import CHUNK
from tidal_workers.blobs.base import PART_MAX_AGE_SECONDS
from tidal_workers.blobs.base import BlobNotFound
from tidal_workers.blobs.base import Blobs
from tidal_workers.blobs.base import LineCounter
from tidal_workers.blobs.base import StorageUnavailable
from tidal_workers.blobs.base import Written
from tidal_workers.blobs.base import new_name


class LocalBlobs(Blobs):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.location = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    def sweep_parts(self, max_age: float = PART_MAX_AGE_SECONDS) -> int:
        """Delete ``.part`` files untouched for ``max_age`` seconds: what a writer killed mid-copy left behind.

        Every process runs it at start (``prepare_storage``); younger parts may be another process's write in
        progress.
        """
        cutoff = time.time() - max_age
        swept = 0
        for part in self.root.glob(".*.part"):
            try:
                if part.stat().st_mtime < cutoff:
                    part.unlink()
                    swept += 1
            except FileNotFoundError:  # another process swept it first
                pass
        return swept

    def path(self, name: str) -> Path:
        return self.root / name

    def write_stream(self, stream: t.IO[bytes], limit: int | None = None, name: str | None = None) -> Written:
        """Bytes go to ``.<name>.part`` and are renamed into place only when complete and synced; the directory is
        synced after the rename, so the name survives a power loss as well as the bytes do."""
        name = name or new_name()
        tmp = self.root / f".{name}.part"
        counter = LineCounter(limit)
        try:
            with open(tmp, "wb") as out:
                while chunk := stream.read(CHUNK):
                    counter.add(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path(name))
            _sync_dir(self.root)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return counter.written(name)

    def open(self, name: str) -> t.BinaryIO:
        try:
            return open(self.path(name), "rb")
        except FileNotFoundError:
            raise BlobNotFound(name) from None

    def iter_chunks(self, name: str) -> t.Iterator[bytes]:
        f = self.open(name)  # opened now, so a missing blob raises here rather than at the first chunk

        def chunks() -> t.Iterator[bytes]:
            with f:
                while chunk := f.read(CHUNK):
                    yield chunk

        return chunks()

    def delete(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def names(self) -> t.Iterator[str]:
        return (p.name for p in self.root.iterdir() if not p.name.startswith("."))

    def ping(self) -> None:
        if not self.root.is_dir() or not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageUnavailable(f"{self.root} is not a writable directory")


def _sync_dir(path: Path) -> None:
    """fsync a directory: a file's own fsync covers its bytes, not the entry a rename made for it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: a file system that cannot sync a directory (some network ones)
            raise
    finally:
        os.close(fd)
