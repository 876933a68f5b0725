"""A local S3-compatible server (moto) with one bucket, for tests that run storage on S3."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["CREDENTIALS", "local_s3"]

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def local_s3(bucket: str) -> Iterator[str]:
    """Start moto with ``bucket`` created; yield the ``host:port`` to point storage URIs at."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        pafs.S3FileSystem(
            endpoint_override=f"{host}:{port}",
            scheme="http",
            region="us-east-1",
            access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            allow_bucket_creation=True,
        ).create_dir(bucket)
        yield f"{host}:{port}"
    finally:
        moto.stop()
