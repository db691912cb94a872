"""A moto S3 server in a process of its own on 127.0.0.1, for the benchmarks that read or write a bucket.

Its own process, not a thread of the benchmark's: the loader's GIL is not the server's, as with any
real store. It still shares this machine's cores, so compare ratios measured side by side only.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import boto3


@contextlib.contextmanager
def moto_process(bucket: str) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """Start the server with ``bucket`` created; yield (endpoint URL, boto3 client, storage_options for it)."""
    with socket.socket() as probe:  # a free port for the server's own process
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                              region_name="us-east-1")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:  # not listening yet
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        options = {"endpoint": endpoint, "access_key_id": "bench", "secret_access_key": "bench",
                   "region": "us-east-1", "allow_http": True}
        yield endpoint, client, options
    finally:
        server.terminate()
        server.wait(timeout=30)
