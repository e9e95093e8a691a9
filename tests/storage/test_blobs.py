"""Both stores behind the Blobs interface, on real storage: a directory, and S3 over HTTP (moto's server)."""

from __future__ import annotations

import io
import os
import stat
import time

import pytest

from config import Settings
from tests.support.storage_helpers import PART_BYTES
from tests.support.storage_helpers import everything
from tests.support.storage_helpers import with_s3
from tidal_workers.blobs import CHUNK
from tidal_workers.blobs import BlobNotFound
from tidal_workers.blobs import Blobs
from tidal_workers.blobs import StorageUnavailable
from tidal_workers.blobs import TooLarge
from tidal_workers.blobs import open_blobs
from tidal_workers.blobs.local import LocalBlobs
from tidal_workers.blobs.s3 import S3Blobs


@pytest.fixture(params=["local", "s3"])
def blobs(request, tmp_path) -> Blobs:
    if request.param == "local":
        return open_blobs(Settings(blob_dir=str(tmp_path / "blobs")))
    endpoint, bucket = request.getfixturevalue("s3_endpoint"), request.getfixturevalue("bucket")
    return open_blobs(with_s3(Settings(home=str(tmp_path)), endpoint, bucket))


@pytest.mark.parametrize(
    ("data", "lines"),
    [(b"", 0), (b"a", 1), (b"a\n", 1), (b"a\nb", 2), (b"\n\n", 2), (b'{"x": 1}\n' * 1000, 1000)],
)
def test_written_blob_reads_back_with_its_size_and_lines(blobs, data, lines):
    written = blobs.write_stream(io.BytesIO(data))
    assert (written.bytes, written.lines) == (len(data), lines)
    assert blobs.read_bytes(written.name) == data
    with blobs.open(written.name) as f:
        assert list(f) == io.BytesIO(data).readlines()  # line iteration, as validation reads a file
    assert list(blobs.names()) == [written.name]


def test_delete_and_missing_blobs(blobs):
    name = blobs.write_stream(io.BytesIO(b"x\n")).name
    blobs.delete(name)
    blobs.delete(name)  # twice is fine
    assert list(blobs.names()) == []
    with pytest.raises(BlobNotFound):
        blobs.iter_chunks(name)  # raises at once, not at the first chunk: /content answers 404-able errors
    with pytest.raises(BlobNotFound):
        blobs.open(name)
    assert everything(blobs) == []


def test_a_named_write_and_dot_names_are_not_listed(blobs):
    blobs.write_stream(io.BytesIO(b"token"), name=".sentinel-abc")
    assert blobs.read_bytes(".sentinel-abc") == b"token"
    assert list(blobs.names()) == []


def test_write_lines(blobs):
    written = blobs.write_lines(f'{{"n": {i}}}\n'.encode() for i in range(5000))
    expected = b"".join(f'{{"n": {i}}}\n'.encode() for i in range(5000))
    assert (written.bytes, written.lines) == (len(expected), 5000)
    assert blobs.read_bytes(written.name) == expected


def test_too_large_keeps_nothing(blobs):
    """Past the limit nothing stays: no blob, no partial file, no multipart upload left open (S3's parts sent
    before the limit was reached are aborted)."""
    data = os.urandom(PART_BYTES + PART_BYTES // 2)
    with pytest.raises(TooLarge):
        blobs.write_stream(io.BytesIO(data), limit=PART_BYTES + 1024)
    assert everything(blobs) == []
    written = blobs.write_stream(io.BytesIO(data), limit=len(data))  # exactly at the limit is fine
    assert written.bytes == len(data)


def test_a_failed_stream_keeps_nothing(blobs):
    class Broken(io.RawIOBase):
        """A client that disconnects after a part's worth of bytes."""

        sent = 0

        def readable(self):
            return True

        def readinto(self, buffer):
            if self.sent >= PART_BYTES + 10:
                raise ConnectionResetError("client went away")
            n = min(len(buffer), CHUNK)
            buffer[:n] = b"x" * n
            self.sent += n
            return n

    with pytest.raises(ConnectionResetError):
        blobs.write_stream(Broken())
    assert everything(blobs) == []


def test_a_local_write_syncs_its_bytes_then_the_directory_its_name_is_in(tmp_path, monkeypatch):
    """A rename is durable only once its directory is synced: without that, a power loss can lose a blob whose row
    SQL committed. The real fsync runs; the test only records what it was called on."""
    blobs = LocalBlobs(tmp_path / "blobs")
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    blobs.write_stream(io.BytesIO(b"{}\n"))
    assert synced == ["file", "dir"]


def test_s3_upload_is_multipart_and_reads_stream_in_chunks(s3_endpoint, bucket, tmp_path):
    blobs = open_blobs(with_s3(Settings(home=str(tmp_path)), s3_endpoint, bucket))
    assert isinstance(blobs, S3Blobs)
    data = os.urandom(2 * PART_BYTES + 12345)
    written = blobs.write_stream(io.BytesIO(data))
    head = blobs.client.head_object(Bucket=bucket, Key="tidal/" + written.name)
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # S3's ETag of a 3-part multipart upload
    chunks = list(blobs.iter_chunks(written.name))
    assert len(chunks) > 1 and max(map(len, chunks)) <= CHUNK  # streamed, never one whole-object read
    assert b"".join(chunks) == data
    small = blobs.write_stream(io.BytesIO(b"one line\n"))  # below one part: a single PutObject
    assert not blobs.client.head_object(Bucket=bucket, Key="tidal/" + small.name)["ETag"].strip('"').count("-")


def test_sweep_parts_discards_only_abandoned_writes(blobs):
    if isinstance(blobs, LocalBlobs):
        old, young = blobs.root / ".dead.part", blobs.root / ".live.part"
        for part in (old, young):
            part.write_bytes(b"partial")
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        assert blobs.sweep_parts() == 1
        assert not old.exists() and young.exists()
        return
    assert isinstance(blobs, S3Blobs)
    # moto stamps every multipart upload "Initiated 2010-11-10T20:48:33Z", so the cutoff is tried on both
    # sides of that date: uploads begun within max_age may be another process's, in progress.
    blobs.client.create_multipart_upload(Bucket=blobs.bucket, Key=blobs.key("abandoned"))
    blobs.client.create_multipart_upload(Bucket=blobs.bucket, Key="not-tidals/upload")  # outside the prefix
    assert blobs.sweep_parts(max_age=30 * 365 * 86400.0) == 0
    assert blobs.sweep_parts() == 1
    assert everything(blobs) == ["upload:not-tidals/upload"]


def test_ping(blobs, tmp_path, s3_endpoint):
    blobs.ping()
    missing = (
        LocalBlobs(tmp_path / "gone")
        if isinstance(blobs, LocalBlobs)
        else open_blobs(with_s3(Settings(home=str(tmp_path)), s3_endpoint, "no-such-bucket"))
    )
    if isinstance(missing, LocalBlobs):
        missing.root.rmdir()
    with pytest.raises(StorageUnavailable):
        missing.ping()


def test_unknown_storage_is_refused(tmp_path):
    with pytest.raises(ValueError, match="TIDAL_STORAGE"):
        open_blobs(Settings(home=str(tmp_path), storage="nfs"))
    with pytest.raises(ValueError, match="TIDAL_S3_BUCKET"):
        open_blobs(Settings(home=str(tmp_path), storage="s3"))
