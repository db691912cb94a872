"""moto's S3 server on 127.0.0.1 for the tests: one way to start it, with a bucket, a client and storage options.

The server runs in a thread of the test process (``ThreadedMotoServer``) on a free port. Importing
this module imports neither moto nor boto3: ``start_moto`` skips the calling test (or fixture) when
they are not installed, so a test file can keep tests that need no server in the quick tier.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest


def start_moto(bucket: str, key_id: str = "tester", secret: str = "s") -> tuple[Any, str, Any]:
    """Start a server holding an empty ``bucket``; return (server, endpoint URL, boto3 client). The caller stops it."""
    moto_server = pytest.importorskip("moto.server", reason="the S3 test server (moto[server]) is not installed")
    boto3 = pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
                          region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    return server, endpoint, client


def s3_options(endpoint: str, key_id: str = "tester", secret: str = "s", **changes: Any) -> dict[str, Any]:
    """Return storage_options for the server at ``endpoint`` (plain http, one retry within 5 s), with ``changes``."""
    return {"endpoint": endpoint, "access_key_id": key_id, "secret_access_key": secret, "region": "us-east-1",
            "allow_http": True, "max_retries": 1, "retry_timeout_s": 5, **changes}


@contextlib.contextmanager
def moto_s3(bucket: str, key_id: str = "tester", secret: str = "s") -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """A server holding ``bucket`` while in the block: (endpoint URL, boto3 client, storage_options for it)."""
    server, endpoint, client = start_moto(bucket, key_id, secret)
    try:
        yield endpoint, client, s3_options(endpoint, key_id, secret)
    finally:
        server.stop()
