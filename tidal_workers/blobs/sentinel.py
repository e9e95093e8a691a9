"""At start, every process (API, worker, beat) proves it sees the same file storage as the rest of the fleet.

A worker on another host with a local volume of its own would find no uploads to ingest and write outputs the
API cannot serve, and nothing else would say why. So each process writes a sentinel blob and reads it back (its
storage works), then compares with the fleet's sentinel: the first process to start records its sentinel's
name, contents and origin in Redis (``keys.STORAGE_SENTINEL``, set only if absent); every later process must
read that blob, with those contents, through its own storage, or it refuses to run and names both locations.

The record is rebuilt by whichever process starts first after Redis loses it. After moving the fleet's storage
on purpose, ``tidal storage check --reset`` records a new sentinel.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import secrets
import time

import redis

from tidal_workers import keys
from tidal_workers.blobs import BlobNotFound
from tidal_workers.blobs import Blobs
from tidal_workers.blobs import StorageUnavailable

SENTINEL_PREFIX = ".sentinel-"

log = logging.getLogger(__name__)


class StorageNotShared(Exception):
    """This process cannot see the fleet's sentinel: it does not share the fleet's file storage."""


@dataclasses.dataclass(frozen=True)
class Sentinel:
    name: str  # the blob's name
    token: str  # its contents
    by: str  # the process that wrote it: role, node, pid
    location: str  # its storage as that process described it
    at: float  # when (epoch seconds)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Sentinel:
        return cls(**json.loads(raw))


def _write_probe(blobs: Blobs, by: str) -> Sentinel:
    """Write a fresh sentinel and read it back."""
    token = secrets.token_hex(16)
    mine = Sentinel(SENTINEL_PREFIX + token[:16], token, by, blobs.location, time.time())
    blobs.write_stream(io.BytesIO(token.encode()), name=mine.name)
    try:
        seen = blobs.read_bytes(mine.name)
    except BlobNotFound:
        seen = None
    if seen != token.encode():
        blobs.delete(mine.name)
        raise StorageUnavailable(f"{blobs.location}: a blob just written reads back as {seen!r}")
    return mine


def _visible(blobs: Blobs, sentinel: Sentinel) -> bool:
    try:
        return blobs.read_bytes(sentinel.name) == sentinel.token.encode()
    except BlobNotFound:
        return False


def prepare_storage(blobs: Blobs, client: redis.Redis, role: str, node: str) -> Sentinel:
    """Discard abandoned writes, then check this process (``role`` on ``node``) shares the fleet's storage, whose
    sentinel ``client``'s Redis records; returns the fleet's sentinel.

    Raises StorageNotShared (another storage than the fleet's) or StorageUnavailable (no working storage).
    """
    swept = blobs.sweep_parts()
    if swept:
        log.info("storage %s: discarded %d abandoned writes", blobs.location, swept)
    mine = _write_probe(blobs, f"{role} on {node} (pid {os.getpid()})")
    while not client.set(keys.STORAGE_SENTINEL, mine.to_json(), nx=True):
        raw = client.get(keys.STORAGE_SENTINEL)
        if raw is None:  # deleted between the two calls (a reset): try to be first again
            continue
        fleet = Sentinel.from_json(raw)
        blobs.delete(mine.name)  # it only proved this process can write and read
        if not _visible(blobs, fleet):
            raise StorageNotShared(
                f"{mine.by} cannot see the storage sentinel {fleet.name} that {fleet.by} wrote to "
                f"{fleet.location} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(fleet.at))}; this "
                f"process's storage is {mine.location}. The processes do not share file storage: on several "
                "hosts use TIDAL_STORAGE=s3, or one directory mounted at TIDAL_BLOB_DIR on every host. If the "
                "fleet's storage was moved on purpose, run `tidal storage check --reset` once."
            )
        log.info("storage %s: shared with %s", blobs.location, fleet.by)
        return fleet
    log.info("storage %s: this process recorded the fleet's sentinel %s", blobs.location, mine.name)
    return mine


def reset_sentinel(blobs: Blobs, client: redis.Redis, role: str, node: str) -> Sentinel:
    """Forget the fleet's sentinel and record this process's: after the fleet's storage moved on purpose."""
    client.delete(keys.STORAGE_SENTINEL)
    return prepare_storage(blobs, client, role, node)
