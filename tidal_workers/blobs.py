"""File bytes on disk, streamed in and out in chunks; never held whole in memory."""

from __future__ import annotations

import os
import secrets
import time
import typing as t
from pathlib import Path

CHUNK = 1 << 20
PART_MAX_AGE_SECONDS = 3600.0  # a live write touches its .part every chunk; one idle this long was abandoned


class TooLarge(Exception):
    """The stream passed its byte limit; nothing was kept."""


class BlobStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.sweep_parts()

    def sweep_parts(self, max_age: float = PART_MAX_AGE_SECONDS) -> int:
        """Delete ``.part`` files untouched for ``max_age`` seconds: what a writer killed mid-copy left behind.

        Runs whenever a process opens the store; younger parts may be another process's write in progress.
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

    def write_stream(self, stream: t.IO[bytes], limit: int | None = None) -> tuple[str, int, int]:
        """Copy ``stream`` to a new blob; return (name, bytes, newline count).

        The bytes go to a temporary name and are renamed into place only when
        complete, so a process killed mid-upload leaves no visible blob.
        """
        name = secrets.token_hex(16)
        tmp = self.root / f".{name}.part"
        size = lines = 0
        try:
            with open(tmp, "wb") as out:
                while chunk := stream.read(CHUNK):
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise TooLarge(size)
                    lines += chunk.count(b"\n")
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path(name))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return name, size, lines

    def write_lines(self, lines: t.Iterable[bytes]) -> tuple[str, int]:
        """Write an output file line by line (finalize); returns (name, bytes)."""
        name = secrets.token_hex(16)
        tmp = self.root / f".{name}.part"
        size = 0
        with open(tmp, "wb") as out:
            for line in lines:
                out.write(line)
                size += len(line)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path(name))
        return name, size

    def iter_chunks(self, name: str) -> t.Iterator[bytes]:
        with open(self.path(name), "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def delete(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)
