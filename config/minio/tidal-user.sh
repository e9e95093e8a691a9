#!/bin/sh
# Tidal's own MinIO user, allowed its bucket (TIDAL_S3_BUCKET) and nothing else: compose's `minio-user` service runs
# this once MinIO is healthy, and again at each `up` (every step is idempotent). The root user stays an operator's.
# The root credentials reach `mc` in its environment (MC_HOST_minio), not on its command line.
set -eu
: "${MINIO_ROOT_USER:?set MINIO_ROOT_USER in tidal.env}"
: "${MINIO_ROOT_PASSWORD:?set MINIO_ROOT_PASSWORD in tidal.env}"
: "${TIDAL_S3_ACCESS_KEY_ID:?set TIDAL_S3_ACCESS_KEY_ID in tidal.env: Tidal's own MinIO user, not the root user}"
: "${TIDAL_S3_SECRET_ACCESS_KEY:?set TIDAL_S3_SECRET_ACCESS_KEY in tidal.env}"
bucket="${TIDAL_S3_BUCKET:-tidal}"
if [ "$TIDAL_S3_ACCESS_KEY_ID" = "$MINIO_ROOT_USER" ]; then
  echo "TIDAL_S3_ACCESS_KEY_ID is MINIO_ROOT_USER: give Tidal a user of its own (it gets bucket $bucket only)" >&2
  exit 1
fi
for secret in MINIO_ROOT_PASSWORD TIDAL_S3_SECRET_ACCESS_KEY; do
  eval "value=\$$secret"
  if [ "${#value}" -lt 32 ]; then
    echo "$secret: at least 32 characters, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'" >&2
    exit 1
  fi
done
export MC_HOST_minio="http://${MINIO_ROOT_USER}:${MINIO_ROOT_PASSWORD}@${MINIO_URL#http://}"
policy=$(mktemp)
cat >"$policy" <<JSON
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow", "Action": ["s3:GetBucketLocation", "s3:ListBucket"], "Resource": ["arn:aws:s3:::$bucket"]},
    {
      "Effect": "Allow",
      "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
      "Resource": ["arn:aws:s3:::$bucket/*"]
    }
  ]
}
JSON
mc admin policy create minio tidal-bucket "$policy"
mc admin user add minio "$TIDAL_S3_ACCESS_KEY_ID" "$TIDAL_S3_SECRET_ACCESS_KEY"
mc admin policy attach minio tidal-bucket --user "$TIDAL_S3_ACCESS_KEY_ID" ||
  mc admin user info minio "$TIDAL_S3_ACCESS_KEY_ID" | grep -q tidal-bucket  # attached at an earlier start
rm -f "$policy"
echo "MinIO user $TIDAL_S3_ACCESS_KEY_ID: bucket $bucket only"
