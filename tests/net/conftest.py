"""Fixtures: a real S3 endpoint (moto's threaded HTTP server on 127.0.0.1) and a thread-leak check."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from p2prl.net.s3 import S3Config


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_config(s3_endpoint: str) -> S3Config:
    import boto3

    from p2prl.net.s3 import public_read_policy

    bucket = f"b-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=bucket)
    client.put_bucket_policy(Bucket=bucket, Policy=public_read_policy(bucket))
    return S3Config(
        bucket=bucket, endpoint_url=s3_endpoint, access_key_id="testing", secret_access_key="testing"
    )


def _our_threads() -> set[int]:
    # trio keeps idle worker threads ("Trio thread N") cached for a few seconds; they are not ours
    return {t.ident for t in threading.enumerate() if not t.name.startswith("Trio thread")}


@pytest.fixture
def assert_no_thread_leak() -> Callable[[], None]:
    """Call once every node the test started is stopped: fails if a thread started since the test
    began is still alive 10 s later."""
    before = _our_threads()

    def check() -> None:
        deadline = time.monotonic() + 10
        while _our_threads() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _our_threads() - before, [t.name for t in threading.enumerate()]

    return check
