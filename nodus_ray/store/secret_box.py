"""Encryption of Secret values at rest, with a key the operator holds outside storage.

Values are sealed with AES-256-GCM; the key lives in a file beside the server's state (mode
0600, created on first use) or in ``NODUS_SECRET_KEY``, never in storage, so a copy of the
storage (an S3 bucket, a backup) holds no usable secret. Each value set is sealed as one JSON
document with its own random nonce; the key id lets a later key rotation find old envelopes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["SecretBox", "install_configured_key", "load_or_create_key"]

_NONCE_BYTES = 12


def _configured_key() -> bytes | None:
    configured = os.environ.get("NODUS_SECRET_KEY")
    if not configured:
        return None
    try:
        key = base64.b64decode(configured, validate=True)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError("NODUS_SECRET_KEY must be the base64 of 32 random bytes")
    return key


def install_configured_key(path: str) -> bool:
    """Put ``NODUS_SECRET_KEY`` (of ``nodus up``) into the key file the control plane reads.

    The key is kept out of every Ray worker's environment, so the control plane, pinned to the
    node of ``nodus up``, reads it from this file (0600), after a restart too. A file holding
    another key is never overwritten: secrets sealed with one cannot be opened with the other.
    Returns whether a key was configured.
    """
    key = _configured_key()
    if key is None:
        return False
    file = Path(path).expanduser()
    if file.exists():
        if base64.b64decode(file.read_bytes().strip()) != key:
            raise ValueError(
                f"NODUS_SECRET_KEY differs from the key in {file}; secrets sealed with one cannot "
                "be opened with the other: unset NODUS_SECRET_KEY or move the file away"
            )
        return True
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(base64.b64encode(key) + b"\n")
    return True


def load_or_create_key(path: str) -> bytes:
    """``NODUS_SECRET_KEY`` (base64 of 32 bytes) if set, else the key file, created if missing."""
    configured = _configured_key()
    if configured is not None:
        return configured
    file = Path(path).expanduser()
    if file.exists():
        key = base64.b64decode(file.read_bytes().strip())
        if len(key) != 32:
            raise ValueError(f"{file} does not hold a 32-byte key")
        return key
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = AESGCM.generate_key(bit_length=256)
    descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(base64.b64encode(key) + b"\n")
    return key


class SecretBox:
    """Seal and open a mapping of secret values; the plaintext never touches storage."""

    def __init__(self, key: bytes):
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(key).hexdigest()[:12]

    def __repr__(self) -> str:
        return f"SecretBox(key_id={self.key_id})"

    def seal(self, values: dict[str, str], *, context: str) -> dict[str, str]:
        """An envelope for storage; ``context`` (project/name) is bound in, so envelopes cannot be swapped."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, json.dumps(values).encode(), context.encode())
        return {"keyId": self.key_id, "ciphertext": base64.b64encode(nonce + sealed).decode()}

    def open(self, envelope: dict[str, str], *, context: str) -> dict[str, str]:
        raw = base64.b64decode(envelope["ciphertext"])
        plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], context.encode())
        return dict(json.loads(plain))
