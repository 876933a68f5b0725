"""Create-only writes: an object that exists is never replaced, on local disk and on S3.

A run's journal is the one record of what its steps did, and a journal segment is named by its
sequence number. Two actors of one run alive at once (a zombie on a partitioned node, a
replacement started while the old one was frozen) would both write segment N; with a plain
write the later one silently replaces the earlier, and a Completed step can vanish. A
create-only write makes the second writer fail instead (`AlreadyExists`), which is what lets
fencing (`durable.fencing`) stop the older actor.

* Local disk: the bytes go to a temporary file, are fsync'd, then *linked* to the final name.
  ``link(2)`` fails with ``EEXIST`` when the name exists, atomically, which ``rename(2)`` (it
  replaces) does not.
* S3: a conditional ``PutObject`` with ``If-None-Match: *`` (AWS since 2024, MinIO, Ceph,
  moto), answered ``412 Precondition Failed`` when the key exists. pyarrow's S3 filesystem
  cannot send that header, so this one request goes through boto3, configured from the same
  URI (``endpoint_override``, ``scheme``, ``region``, ``access_key``/``secret_key`` in the
  query, else the standard AWS environment and files).
* Any other filesystem: refused (`CreateOnlyUnsupported`): nodus cannot keep its promise there.

On a local disk a journal also keeps an append-only log per writer (`LocalLog`): the file is
created create-only, like any object, holding its first bytes; later records are appended to it,
each with one ``fdatasync`` and no new name (so no directory fsync): a third of a new object's
cost. Which records of a log count when another writer's log begins later is the journal's rule
(`durable.journal`), not the file system's.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "AlreadyExists",
    "CreateOnlyUnsupported",
    "LocalLog",
    "create_local",
    "write_local",
    "S3CreateOnly",
]

# A concurrent conditional write to the same key may be answered 409 (AWS asks to retry).
_CONFLICT_RETRIES = 5
_CONFLICT_BACKOFF_SECONDS = 0.05


class AlreadyExists(FileExistsError):
    """The key exists: a create-only write never replaces an object."""


class CreateOnlyUnsupported(RuntimeError):
    """The storage's filesystem cannot refuse to replace an object (only local disk and S3 can)."""


def write_local(full: str, data: bytes, *, replace: bool) -> None:
    """Write ``full`` durably and atomically: the bytes to a temporary name, fsync'd, then
    renamed over it (``replace``) or linked to it, which raises `AlreadyExists` if it exists."""
    parent = os.path.dirname(full)
    temporary = f"{parent}/.{os.path.basename(full)}.{uuid.uuid4().hex}.tmp"
    try:
        handle = open(temporary, "xb")
    except FileNotFoundError:  # the folder's first object (the journal's hot path skips the stats)
        os.makedirs(parent, exist_ok=True)
        handle = open(temporary, "xb")
    with handle:
        handle.write(data)
        handle.flush()
        os.fdatasync(handle.fileno())  # the data and its size; the times are not worth a write
    if replace:
        os.replace(temporary, full)
    else:
        try:
            os.link(temporary, full)
        except FileExistsError:
            raise AlreadyExists(full) from None
        finally:
            os.unlink(temporary)
    # The new name is durable only once its directory entry is: a power cut must not take back
    # a journal record the caller has already acted on.
    directory = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def create_local(full: str, data: bytes) -> None:
    """Create ``full`` with ``data``, durably, or raise `AlreadyExists` and leave it unchanged."""
    write_local(full, data, replace=False)


class LocalLog:
    """An append-only local file with one writer: created create-only (`create_local`, so it exists
    whole with its first bytes, or not at all), then each `append` is one ``write`` and one
    ``fdatasync`` (the data and the file's new size) before it returns."""

    def __init__(self, full: str, first: bytes) -> None:
        self.path = full
        self._fd: int | None = None
        create_local(full, first)  # raises AlreadyExists: the name is another writer's
        self._fd = os.open(full, os.O_WRONLY | os.O_APPEND)

    def append(self, data: bytes) -> None:
        """Write ``data`` at the end and make it durable; raises OSError (the log is then closed)."""
        if self._fd is None:
            raise ValueError(f"log {self.path} is closed")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fdatasync(self._fd)
        except BaseException:
            self.close()  # what reached the file is unknown: the writer starts a new log
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # a writer that wrote once and was dropped (a resolution)
        self.close()


@dataclass(frozen=True)
class _S3Target:
    endpoint_url: str | None
    region: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None


def _s3_target(uri: str) -> _S3Target:
    query = {key: values[-1] for key, values in parse_qs(urlsplit(uri).query).items()}
    endpoint = query.get("endpoint_override")
    if endpoint and "://" not in endpoint:
        endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
    netloc = urlsplit(uri).netloc
    access, secret = query.get("access_key"), query.get("secret_key")
    if "@" in netloc and ":" in netloc.split("@", 1)[0]:  # s3://KEY:SECRET@bucket/...
        access, secret = netloc.split("@", 1)[0].split(":", 1)
    return _S3Target(endpoint, query.get("region"), access, secret, query.get("session_token"))


class S3CreateOnly:
    """Conditional puts to the bucket of one ``s3://`` storage URI (boto3, made on first use)."""

    def __init__(self, uri: str) -> None:
        self._target = _s3_target(uri)
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3  # only a storage on S3 needs it

                target = self._target
                self._client = boto3.client(
                    "s3",
                    endpoint_url=target.endpoint_url,
                    region_name=target.region,
                    aws_access_key_id=target.access_key,
                    aws_secret_access_key=target.secret_key,
                    aws_session_token=target.session_token,
                )
            return self._client

    def create(self, full: str, data: bytes) -> None:
        """``full`` is ``bucket/key`` as pyarrow names it; raise `AlreadyExists` if the key exists."""
        from botocore.exceptions import ClientError

        bucket, _, key = full.partition("/")
        for attempt in range(_CONFLICT_RETRIES):
            try:
                self._s3().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
                return
            except ClientError as error:
                status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 412:
                    raise AlreadyExists(full) from None
                if status != 409 or attempt == _CONFLICT_RETRIES - 1:
                    raise
                time.sleep(_CONFLICT_BACKOFF_SECONDS * (attempt + 1))  # another create in flight
