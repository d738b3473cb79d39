"""S3 fallback (any endpoint: AWS, R2, MinIO): mirror blobs and manifests, ranged chunk reads.

Layout under ``<prefix><network>/``::

    blobs/<sha256>         the blob, as stored locally
    manifests/<version>    the signed manifest envelope (bytes as gossiped), version zero-padded to 12
    ready/<version>        empty marker, written last: a version is visible only once all is stored

boto3 is imported lazily; its clients are thread-safe, and every call here is blocking (the
transport runs them on worker threads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class S3Config:
    bucket: str
    endpoint_url: str | None = None  # None = AWS; set for R2, MinIO, a local test server
    prefix: str = ""
    region: str = "us-east-1"
    # None: requests go unsigned (public reads). Never taken from the environment here: a genesis
    # names the endpoint, and a volunteer's credentials must not sign requests to wherever it says
    access_key_id: str | None = None
    secret_access_key: str | None = None
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 20.0
    retries: int = 2


def public_read_policy(bucket: str) -> str:
    """A bucket policy that lets anyone read and list (nodes read unsigned; only the trainer writes)."""
    import json

    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": "*",
                    "Action": ["s3:GetObject", "s3:ListBucket"],
                    "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                }
            ],
        }
    )


class S3Error(Exception):
    """An S3 object is missing or the endpoint failed."""


def _version_key(version: int) -> str:
    return f"{version:012d}"


class S3Mirror:
    def __init__(self, config: S3Config, network_id: str) -> None:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        self.config = config
        self.network_id = network_id
        self._base = f"{config.prefix}{network_id}/"
        signed = bool(config.access_key_id and config.secret_access_key)
        # a session of its own: boto3's default one would still look up env and profile credentials
        session = boto3.session.Session(
            aws_access_key_id=config.access_key_id if signed else None,
            aws_secret_access_key=config.secret_access_key if signed else None,
        )
        self._client: Any = session.client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region,
            config=Config(
                connect_timeout=config.connect_timeout_s,
                read_timeout=config.read_timeout_s,
                retries={"max_attempts": config.retries, "mode": "standard"},
                **({} if signed else {"signature_version": UNSIGNED}),
            ),
        )

    def blob_key(self, blob_id: str) -> str:
        return f"{self._base}blobs/{blob_id}"

    def manifest_key(self, version: int) -> str:
        return f"{self._base}manifests/{_version_key(version)}"

    def ready_key(self, version: int) -> str:
        return f"{self._base}ready/{_version_key(version)}"

    def _call(self, name: str, **kw: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, name)(Bucket=self.config.bucket, **kw)
        except (BotoCoreError, ClientError) as e:
            raise S3Error(f"s3 {name} {kw.get('Key', '')}: {e}") from e

    def has_blob(self, blob_id: str) -> bool:
        try:
            self._call("head_object", Key=self.blob_key(blob_id))
            return True
        except S3Error:
            return False

    def put_blob(self, blob_id: str, src: bytes | str | Path) -> None:
        """Upload a blob under its id (skipped if already there: ids are content hashes)."""
        if self.has_blob(blob_id):
            return
        if isinstance(src, bytes):
            self._call("put_object", Key=self.blob_key(blob_id), Body=src)
        else:
            with open(src, "rb") as f:
                self._call("put_object", Key=self.blob_key(blob_id), Body=f)

    def put_manifest(self, version: int, envelope: bytes) -> None:
        self._call("put_object", Key=self.manifest_key(version), Body=envelope)

    def mark_ready(self, version: int) -> None:
        self._call("put_object", Key=self.ready_key(version), Body=b"")

    def publish_version(self, version: int, envelope: bytes, blobs: dict[str, bytes | str | Path]) -> None:
        """Mirror one version: blobs, then the manifest, then the ready marker (last)."""
        for blob_id, src in blobs.items():
            self.put_blob(blob_id, src)
        self.put_manifest(version, envelope)
        self.mark_ready(version)

    def ready_versions(self) -> list[int]:
        prefix = f"{self._base}ready/"
        out: list[int] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            resp = self._call("list_objects_v2", **kw)
            for obj in resp.get("Contents", []):
                tail = obj["Key"][len(prefix) :]
                if tail.isdigit():
                    out.append(int(tail))
            if not resp.get("IsTruncated"):
                return sorted(out)
            token = resp.get("NextContinuationToken")

    def get_manifest(self, version: int, max_bytes: int = 512 * 1024) -> bytes:
        """The manifest envelope bytes (unverified: decode_message them like gossip)."""
        resp = self._call("get_object", Key=self.manifest_key(version), Range=f"bytes=0-{max_bytes}")
        data = resp["Body"].read(max_bytes + 1)
        if len(data) > max_bytes:
            raise S3Error(f"manifest {version} larger than {max_bytes} bytes")
        return data

    def get_range(self, blob_id: str, offset: int, length: int) -> bytes:
        """``length`` bytes of a blob from ``offset`` (one ranged GET); verify before use."""
        if length == 0:
            return b""
        resp = self._call(
            "get_object", Key=self.blob_key(blob_id), Range=f"bytes={offset}-{offset + length - 1}"
        )
        data = resp["Body"].read(length + 1)
        if len(data) != length:
            raise S3Error(f"ranged read of {blob_id[:16]} returned {len(data)} of {length} bytes")
        return data
