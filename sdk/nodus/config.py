"""Client settings: where the API is, which project, and the optional bearer token.

Settings come from the environment so a laptop, a CI job and a notebook can point the same code
at different servers without editing it; explicit arguments (``--api-url``, ``Client(...)``)
override the environment. The object is frozen because a client built from it must not change
servers halfway through a session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .credentials import lookup

__all__ = [
    "DEFAULT_API_URL",
    "DEFAULT_PROJECT",
    "ENV_API_URL",
    "ENV_PROJECT",
    "ENV_TOKEN",
    "Settings",
    "load_settings",
]

ENV_API_URL = "NODUS_API_URL"
ENV_PROJECT = "NODUS_PROJECT"
ENV_TOKEN = "NODUS_TOKEN"

DEFAULT_API_URL = "http://127.0.0.1:8000"
DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class Settings:
    """What a `Client` needs to reach the API."""

    api_url: str = DEFAULT_API_URL
    project: str = DEFAULT_PROJECT
    # Kept out of repr so that logging a Settings object never leaks the token.
    token: str | None = field(default=None, repr=False)


def load_settings(
    *,
    api_url: str | None = None,
    project: str | None = None,
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build `Settings` from explicit values, then ``NODUS_*`` variables, then the token stored
    for that API URL (`credentials`), then defaults.

    Empty strings count as unset, because ``NODUS_PROJECT=`` in a shell usually means "clear it".
    """
    env = os.environ if environ is None else environ

    def pick(explicit: str | None, name: str, default: str | None) -> str | None:
        for value in (explicit, env.get(name)):
            if value is not None and value.strip():
                return value.strip()
        return default

    url = (pick(api_url, ENV_API_URL, DEFAULT_API_URL) or DEFAULT_API_URL).rstrip("/")
    chosen_token = pick(token, ENV_TOKEN, None)
    stored = lookup(url) if chosen_token is None else None  # `nodus up` / `nodus login` stored it
    return Settings(
        api_url=url,
        project=pick(project, ENV_PROJECT, None) or (stored or {}).get("project") or DEFAULT_PROJECT,
        token=chosen_token or (stored or {}).get("token"),
    )
