"""Blobs in S3-compatible object storage (AWS S3, MinIO, Ceph RGW, ...), for a fleet on several hosts.

Uploads are multipart: ``TIDAL_S3_PART_BYTES`` at a time is held in memory and sent as one part, so a 200 MB
upload never sits whole in memory, and the object appears only when the upload completes (an abandoned one is
invisible and is aborted by ``sweep_parts``). Smaller streams go up in one ``PutObject``. Reads stream the
object's body in chunks. boto3 is the ``s3`` extra; it is imported only when this store is chosen.
"""

from __future__ import annotations

import contextlib
import datetime
import typing as t

from config import Settings
from tidal_workers.blobs.base import CHUNK
from tidal_workers.blobs.base import PART_MAX_AGE_SECONDS
from tidal_workers.blobs.base import BlobNotFound
from tidal_workers.blobs.base import Blobs
from tidal_workers.blobs.base import LineCounter
from tidal_workers.blobs.base import StorageUnavailable
from tidal_workers.blobs.base import Written
from tidal_workers.blobs.base import new_name

MIN_PART_BYTES = 5 * 1024 * 1024  # S3's smallest part but the last


class S3Blobs(Blobs):
    def __init__(self, client: t.Any, bucket: str, prefix: str = "", part_bytes: int = 8 * 1024 * 1024):
        if not bucket:
            raise ValueError("TIDAL_STORAGE=s3 needs TIDAL_S3_BUCKET")
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"TIDAL_S3_PART_BYTES must be at least {MIN_PART_BYTES} (S3's smallest part)")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.part_bytes = part_bytes
        endpoint = getattr(client.meta, "endpoint_url", "")
        self.location = f"s3://{bucket}/{self.prefix} at {endpoint}"

    @classmethod
    def from_settings(cls, settings: Settings) -> S3Blobs:
        import boto3
        from botocore.config import Config

        options: dict[str, t.Any] = {"connect_timeout": 5, "read_timeout": 60, "retries": {"mode": "standard"}}
        if settings.s3_endpoint_url:
            # S3-compatible services want path-style URLs (no bucket subdomain) and may not know the
            # checksums boto3 adds by default since 1.36; send them only where S3 requires them.
            options.update(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
        credentials = {}
        if settings.s3_access_key_id:
            credentials = {
                "aws_access_key_id": settings.s3_access_key_id,
                "aws_secret_access_key": settings.s3_secret_access_key,
            }
        client = boto3.session.Session().client(
            "s3",
            region_name=settings.s3_region or None,
            endpoint_url=settings.s3_endpoint_url or None,
            config=Config(**options),
            **credentials,
        )
        return cls(client, settings.s3_bucket, settings.s3_prefix, settings.s3_part_bytes)

    def key(self, name: str) -> str:
        return self.prefix + name

    def write_stream(self, stream: t.IO[bytes], limit: int | None = None, name: str | None = None) -> Written:
        name = name or new_name()
        key = self.key(name)
        counter = LineCounter(limit)
        pending = bytearray()
        upload_id: str | None = None
        parts: list[dict[str, t.Any]] = []

        def send_part(data: bytes) -> None:
            nonlocal upload_id
            if upload_id is None:
                upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
            number = len(parts) + 1
            done = self.client.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            )
            parts.append({"PartNumber": number, "ETag": done["ETag"]})

        try:
            while chunk := stream.read(CHUNK):
                counter.add(chunk)
                pending += chunk
                while len(pending) >= self.part_bytes:
                    send_part(bytes(pending[: self.part_bytes]))
                    del pending[: self.part_bytes]
            if upload_id is None:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=bytes(pending))
            else:
                if pending:
                    send_part(bytes(pending))
                self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
        except BaseException:
            if upload_id is not None:
                with contextlib.suppress(Exception):  # the original error matters; sweep_parts retries the abort
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise
        return counter.written(name)

    def iter_chunks(self, name: str) -> t.Iterator[bytes]:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise BlobNotFound(name) from None
            raise

        def chunks() -> t.Iterator[bytes]:
            try:
                yield from body.iter_chunks(CHUNK)
            finally:
                body.close()

        return chunks()

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(name))

    def names(self) -> t.Iterator[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", ()):
                name = obj["Key"][len(self.prefix) :]
                if name and not name.startswith(".") and "/" not in name:
                    yield name

    def ping(self) -> None:
        from botocore.exceptions import BotoCoreError
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"{self.location}: {exc}") from exc

    def sweep_parts(self, max_age: float = PART_MAX_AGE_SECONDS) -> int:
        """Abort multipart uploads begun ``max_age`` seconds ago or more: their writer died mid-upload."""
        cutoff = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=max_age)
        swept = 0
        pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for upload in page.get("Uploads", ()):
                if upload["Initiated"] <= cutoff:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    swept += 1
        return swept
