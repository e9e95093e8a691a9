"""Helpers of the storage tests: settings on S3, and what a store holds besides its blobs."""

from __future__ import annotations

from config import Settings
from tidal_workers.blobs import Blobs
from tidal_workers.blobs.local import LocalBlobs
from tidal_workers.blobs.s3 import S3Blobs

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
PART_BYTES = 5 * 1024 * 1024  # S3's smallest part, so a multipart upload needs only a few MiB


def with_s3(settings: Settings, endpoint: str, bucket: str, prefix: str = "tidal/") -> Settings:
    """``settings`` with TIDAL_STORAGE=s3 on ``bucket`` of the S3 server at ``endpoint``."""
    return settings.replace(
        storage="s3",
        s3_bucket=bucket,
        s3_prefix=prefix,
        s3_endpoint_url=endpoint,
        s3_access_key_id=CREDENTIALS["aws_access_key_id"],
        s3_secret_access_key=CREDENTIALS["aws_secret_access_key"],
        s3_part_bytes=PART_BYTES,
    )


def everything(blobs: Blobs) -> list[str]:
    """Every entry the store holds, bookkeeping included: files (and ``.part`` files), or objects and
    multipart uploads still in progress."""
    if isinstance(blobs, LocalBlobs):
        return sorted(p.name for p in blobs.root.iterdir())
    assert isinstance(blobs, S3Blobs)
    objects = blobs.client.list_objects_v2(Bucket=blobs.bucket).get("Contents", [])
    uploads = blobs.client.list_multipart_uploads(Bucket=blobs.bucket).get("Uploads", [])
    return sorted([o["Key"] for o in objects] + [f"upload:{u['Key']}" for u in uploads])
