import os

import pytest

from p2prl.net.s3 import S3Config, S3Error, S3Mirror


def test_mirror_layout_ready_marker_and_ranges(s3_config) -> None:
    m = S3Mirror(s3_config, "net1")
    blob = os.urandom(100_000)
    bid = "cd" * 32
    m.put_blob(bid, blob)
    m.put_manifest(7, b"envelope-7")
    assert m.ready_versions() == []  # not visible before the ready marker
    m.mark_ready(7)
    m.publish_version(12, b"envelope-12", {"ef" * 32: b"x" * 10})
    assert m.ready_versions() == [7, 12]
    assert m.get_manifest(12) == b"envelope-12"
    assert m.get_range(bid, 1000, 5000) == blob[1000:6000]
    assert m.blob_key(bid) == f"net1/blobs/{bid}" and m.ready_key(7) == "net1/ready/000000000007"
    with pytest.raises(S3Error):
        m.get_range("00" * 32, 0, 10)
    with pytest.raises(S3Error):
        m.get_manifest(7, max_bytes=4)


def test_unreachable_endpoint_raises_s3error() -> None:
    m = S3Mirror(
        S3Config(
            bucket="b",
            endpoint_url="http://127.0.0.1:9",
            access_key_id="a",
            secret_access_key="b",
            connect_timeout_s=0.5,
            retries=1,
        ),
        "net1",
    )
    with pytest.raises(S3Error):
        m.get_range("00" * 32, 0, 10)


def test_reads_are_unsigned_without_configured_credentials(s3_config) -> None:
    signed = S3Mirror(s3_config, "net1")
    blob = os.urandom(1000)
    signed.put_blob("ab" * 32, blob)
    public = S3Config(bucket=s3_config.bucket, endpoint_url=s3_config.endpoint_url)
    assert S3Mirror(public, "net1").get_range("ab" * 32, 10, 100) == blob[10:110]
