"""Where the CLI and SDK keep API tokens on this machine: ``~/.nodus/credentials.json`` (0600).

One entry per API URL, like a kubeconfig: `nodus up` writes the local user's operator token for
the server it started, `nodus login --token` writes one for any server, `nodus logout` removes
it. ``NODUS_TOKEN`` and an explicit ``token=`` always win over the file. A project token's entry
also records its project, which then becomes the default project for that server.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["credentials_file", "lookup", "remember", "forget"]


def credentials_file() -> Path:
    return Path(os.environ.get("NODUS_CREDENTIALS_FILE") or Path.home() / ".nodus" / "credentials.json")


def _key(api_url: str) -> str:
    """One spelling per server: scheme, host (localhost is 127.0.0.1) and port, no trailing slash."""
    try:
        parts = urlsplit(api_url.strip())
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return api_url.strip().rstrip("/")
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}:{port}{parts.path.rstrip('/')}"


def _read(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"servers": {}}
    if not isinstance(data, dict) or not isinstance(data.get("servers"), dict):
        return {"servers": {}}
    return data


def lookup(api_url: str) -> dict[str, str] | None:
    """``{"token": ..., "project"?: ...}`` stored for this server, or None."""
    entry = _read(credentials_file())["servers"].get(_key(api_url))
    if isinstance(entry, dict) and isinstance(entry.get("token"), str) and entry["token"]:
        return {k: v for k, v in entry.items() if isinstance(v, str)}
    return None


def remember(api_url: str, token: str, *, project: str | None = None) -> Path:
    """Store the token for this server; the file is written 0600 and replaced atomically."""
    file = credentials_file()
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = _read(file)
    entry: dict[str, str] = {"token": token}
    if project:
        entry["project"] = project
    data["servers"][_key(api_url)] = entry
    _write(file, data)
    return file


def forget(api_url: str) -> bool:
    """Remove this server's token; whether there was one."""
    file = credentials_file()
    data = _read(file)
    if data["servers"].pop(_key(api_url), None) is None:
        return False
    _write(file, data)
    return True


def _write(file: Path, data: dict[str, Any]) -> None:
    staging = file.with_name(f".{file.name}.{os.getpid()}")
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
    os.chmod(staging, 0o600)
    os.replace(staging, file)
