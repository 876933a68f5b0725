"""What the `Client` mixins (`client_*.py`) may call on the client they are mixed into.

Each mixin holds one feature's HTTP calls and uses the client's one request path (retries,
errors rebuilt from the server's JSON, no token in a message), declared here once for the type
checker. At run time this class is empty: `client.Client` defines the methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

__all__ = ["ClientCore"]


class ClientCore:
    """The client methods a mixin uses; `client.Client` implements them."""

    if TYPE_CHECKING:
        _http: httpx.Client

        def _request(
            self,
            method: str,
            path: str,
            *,
            json: Any = None,
            params: Mapping[str, str] | None = None,
            headers: Mapping[str, str] | None = None,
        ) -> httpx.Response: ...

        def _json(self, response: httpx.Response) -> Any: ...

        def _object(self, response: httpx.Response) -> dict[str, Any]: ...

        def _path(self, collection: str, project: str | None, name: str | None = None, *sub: str) -> str: ...
