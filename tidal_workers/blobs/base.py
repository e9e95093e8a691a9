"""The :class:`Blobs` interface and what every store behind it shares: errors, chunking, names, line counts."""

from __future__ import annotations

import abc
import io
import secrets
import typing as t

CHUNK = 1 << 20
PART_MAX_AGE_SECONDS = 3600.0  # a write in progress shows life at least this often; one idle longer was abandoned


class TooLarge(Exception):
    """The stream passed its byte limit; nothing was kept."""


class BlobNotFound(FileNotFoundError):
    """No blob of that name (never written, deleted, or this process looks at other storage)."""


class StorageUnavailable(Exception):
    """The storage did not answer as it should; the message says how."""


class Written(t.NamedTuple):
    name: str
    bytes: int
    lines: int  # newline-terminated lines, plus a last line without one


class LineCounter:
    """Counts bytes and lines of a stream as it passes, and enforces its byte limit."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.bytes = self.newlines = 0
        self.last = b"\n"

    def add(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.bytes += len(chunk)
        if self.limit is not None and self.bytes > self.limit:
            raise TooLarge(self.bytes)
        self.newlines += chunk.count(b"\n")
        self.last = chunk[-1:]

    def written(self, name: str) -> Written:
        return Written(name, self.bytes, self.newlines + (self.last != b"\n"))


class Blobs(abc.ABC):
    """What Tidal does with file bytes; each store implements the abstract methods."""

    location: str  # where the bytes live, for logs and error messages: a path or s3://bucket/prefix

    @abc.abstractmethod
    def write_stream(self, stream: t.IO[bytes], limit: int | None = None, name: str | None = None) -> Written:
        """Copy ``stream`` to a new blob (a fresh random name unless ``name`` is given).

        The blob becomes visible only when complete: a process killed mid-write leaves nothing under the name.
        Past ``limit`` bytes it raises TooLarge and keeps nothing.
        """

    @abc.abstractmethod
    def iter_chunks(self, name: str) -> t.Iterator[bytes]:
        """The blob's bytes in chunks; raises BlobNotFound at once (before the first chunk) if it is missing."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove the blob; a missing one is not an error."""

    @abc.abstractmethod
    def names(self) -> t.Iterator[str]:
        """Every complete blob's name (not the dot-named bookkeeping)."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise StorageUnavailable unless the storage answers (readiness)."""

    @abc.abstractmethod
    def sweep_parts(self, max_age: float = PART_MAX_AGE_SECONDS) -> int:
        """Discard writes abandoned ``max_age`` seconds ago (their writer died); returns how many."""

    def write_lines(self, lines: t.Iterable[bytes]) -> Written:
        """Write a blob line by line (finalize's output files)."""
        return self.write_stream(buffered(IterReader(lines)))

    def open(self, name: str) -> t.BinaryIO:
        """The blob as a buffered binary stream (iterating it yields lines); close it when done."""
        return buffered(IterReader(self.iter_chunks(name)))

    def read_bytes(self, name: str) -> bytes:
        """The whole blob: only for small ones (the sentinel, tests)."""
        return b"".join(self.iter_chunks(name))


def new_name() -> str:
    return secrets.token_hex(16)


class IterReader(io.RawIOBase):
    """A readable raw stream over an iterator of byte chunks (no copy of the whole)."""

    def __init__(self, chunks: t.Iterable[bytes]):
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: t.Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()  # a generator's finally (an S3 body's close) runs now, not at garbage collection
        super().close()


def buffered(raw: IterReader) -> t.BinaryIO:
    """A readable binary stream over ``raw``, read CHUNK bytes at a time."""
    return t.cast(t.BinaryIO, io.BufferedReader(raw, CHUNK))
