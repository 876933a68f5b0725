"""The cluster's durable storage: a pyarrow filesystem under one URI (``NODUS_STORAGE``).

Everything that must survive ``ray stop --force`` lives here and nowhere else: resources,
journals and answers. Ray's own memory is a cache. The URI is whatever
``pyarrow.fs.FileSystem.from_uri`` takes: a local directory (``/var/lib/nodus`` or
``file:///...``) on one machine, ``s3://bucket/prefix`` on a cluster.

Writes are whole-object and atomic: on a local disk through a temporary name and a rename,
on S3 because a PUT is. Nothing appends in place, because S3 cannot, except a run journal's
log on a local disk (`Storage.create_log`), which the journal reads by its own rule. What must
never be replaced once written (journal segments and logs, fencing epochs) is created with
`Storage.create_bytes` or `create_log`, which refuse when the object exists (`store.create_only`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pyarrow.fs as pafs

from nodus_ray.store.create_only import (
    AlreadyExists,
    CreateOnlyUnsupported,
    LocalLog,
    S3CreateOnly,
    create_local,
    write_local,
)

__all__ = [
    "Storage",
    "AlreadyExists",
    "CreateOnlyUnsupported",
    "LocalLog",
    "default_storage_uri",
    "redact_uri",
]

_SECRET_QUERY_KEYS = ("secret", "key", "token", "password", "credential", "session")


def redact_uri(uri: str) -> str:
    """The URI without credentials (``s3://KEY:SECRET@bucket`` or ``?secret_key=...``), for display."""
    parts = urlsplit(uri)
    if not parts.scheme or parts.scheme == "file":
        return uri
    netloc = parts.netloc.rsplit("@", 1)[-1] if "@" in parts.netloc else parts.netloc
    if "@" in parts.netloc:
        netloc = f"***@{netloc}"
    query = [
        (k, "***" if any(word in k.lower() for word in _SECRET_QUERY_KEYS) else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="*"), parts.fragment))


def default_storage_uri() -> str:
    """Where storage is when ``NODUS_STORAGE`` (read by `settings.ServerSettings`) is unset."""
    return str(Path.home() / ".nodus" / "storage")


class Storage:
    """Paths are relative, '/'-separated keys under the root of the URI."""

    def __init__(self, uri: str):
        self.uri = uri
        if "://" not in uri:
            path = Path(uri).expanduser().resolve()
            path.mkdir(parents=True, exist_ok=True)
            self._fs: pafs.FileSystem = pafs.LocalFileSystem()
            self._root = str(path)
        else:
            self._fs, root = pafs.FileSystem.from_uri(uri)
            self._root = root.rstrip("/")
            if isinstance(self._fs, pafs.LocalFileSystem):
                Path(self._root).mkdir(parents=True, exist_ok=True)
        self._local = isinstance(self._fs, pafs.LocalFileSystem)
        self._s3_create = S3CreateOnly(uri) if isinstance(self._fs, pafs.S3FileSystem) else None

    def __repr__(self) -> str:
        return f"Storage({redact_uri(self.uri)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Filesystem handles do not travel between processes; the URI does.
        return (Storage, (self.uri,))

    @property
    def is_local(self) -> bool:
        return self._local

    @property
    def local_root(self) -> str:
        """The root directory on this machine (only meaningful when `is_local`)."""
        return self._root

    def _full(self, key: str) -> str:
        key = key.strip("/")
        if ".." in key.split("/"):
            raise ValueError(f"storage key {key!r} may not contain '..'")
        return f"{self._root}/{key}" if key else self._root

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write the whole object, atomically: a reader sees the old object or the new one."""
        full = self._full(key)
        if self._local:
            write_local(full, data, replace=True)
            return
        # compression=None: pyarrow would otherwise (de)compress by extension, e.g. ``.tar.gz``.
        with self._fs.open_output_stream(full, compression=None) as stream:
            stream.write(data)

    def create_bytes(self, key: str, data: bytes) -> None:
        """Write a new object, durably; raise `AlreadyExists` (and change nothing) if it exists.

        Two writers of one key: exactly one succeeds, on local disk and on S3 alike.
        """
        full = self._full(key)
        if self._local:
            create_local(full, data)
        elif self._s3_create is not None:
            self._s3_create.create(full, data)
        else:
            raise CreateOnlyUnsupported(
                f"storage {redact_uri(self.uri)} cannot refuse to replace an object: use a local "
                "directory or s3:// (NODUS_STORAGE)"
            )

    def create_log(self, key: str, first: bytes) -> LocalLog:
        """A new append-only log at ``key`` holding ``first`` (`create_only.LocalLog`); raise
        `AlreadyExists` if the key exists. Only a local disk appends: elsewhere
        `CreateOnlyUnsupported` (the journal writes one object per append there)."""
        if not self._local:
            raise CreateOnlyUnsupported(f"storage {redact_uri(self.uri)} cannot append")
        return LocalLog(self._full(key), first)

    def read_bytes(self, key: str) -> bytes:
        """Raises FileNotFoundError when the object does not exist."""
        full = self._full(key)
        try:
            with self._fs.open_input_stream(full, compression=None) as stream:
                data: bytes = stream.read()
                return data
        except (FileNotFoundError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) or not self.exists(key):
                raise FileNotFoundError(key) from None
            raise

    def write_json(self, key: str, value: Any) -> None:
        self.write_bytes(key, json.dumps(value, separators=(",", ":"), sort_keys=True).encode())

    def read_json(self, key: str) -> Any:
        return json.loads(self.read_bytes(key))

    def exists(self, key: str) -> bool:
        return bool(self._fs.get_file_info(self._full(key)).type != pafs.FileType.NotFound)

    def list_dir(self, key: str) -> list[str]:
        """Names directly under ``key`` (files and directories), sorted; [] if it is missing."""
        selector = pafs.FileSelector(self._full(key), allow_not_found=True, recursive=False)
        names = [info.base_name for info in self._fs.get_file_info(selector)]
        return sorted(name for name in names if not name.startswith("."))

    def delete(self, key: str) -> None:
        full = self._full(key)
        info = self._fs.get_file_info(full)
        if info.type == pafs.FileType.File:
            self._fs.delete_file(full)

    def delete_tree(self, key: str) -> None:
        full = self._full(key)
        info = self._fs.get_file_info(full)
        if info.type == pafs.FileType.Directory:
            self._fs.delete_dir(full)
        elif info.type == pafs.FileType.File:
            self._fs.delete_file(full)
