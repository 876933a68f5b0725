"""Headless Chromium driven over the DevTools protocol, for the console's tests.

`--dump-dom` shows a page once; the console's tests also click (unfold a command's output, turn
a page of runs), wait for a live page to change and take screenshots of what they see. Chromium
speaks its DevTools protocol over a pipe (``--remote-debugging-pipe``: fds 3 and 4, one JSON
message per NUL), so this needs no port, no websocket library and nothing beyond the browser
`make test` installs. Waits are on a condition the page evaluates, with a deadline.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from .conftest import wait_for

__all__ = ["Browser", "chromium_binary"]


def chromium_binary() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed: `make test` installs it with apt (browser-deps)")
    return browser


class Browser:
    """One headless Chromium with one page; ``with Browser(1280, 1000) as b: b.open(url)``."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self._profile = tempfile.TemporaryDirectory(prefix="nodus-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def pipes() -> None:  # in the child: the protocol's fds 3 (commands in) and 4 (answers out)
            reader, writer = os.dup(to_browser_r), os.dup(from_browser_w)  # neither is 3 or 4 now
            os.dup2(reader, 3)
            os.dup2(writer, 4)
            os.set_inheritable(3, True)  # both survive the exec
            os.set_inheritable(4, True)

        self._process = subprocess.Popen(
            [
                chromium_binary(),
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={self._profile.name}",
                "--remote-debugging-pipe",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=pipes,
            close_fds=False,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.console_errors: list[str] = []

    # -- the protocol --------------------------------------------------------------------------

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        decoded: dict[str, Any] = json.loads(message)
        return decoded

    def _call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        sent = self._send(method, params or {}, session)
        deadline = time.monotonic() + 60
        while True:
            message = self._receive(deadline)
            if message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.console_errors.append(str(details.get("exception", {}).get("description") or details))
            if message.get("id") == sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """A DevTools command on the page."""
        return self._call(method, params, self._session)

    # -- what a test does ----------------------------------------------------------------------

    def open(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", what=f"{url} to load")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression on the page (awaited when it is a promise)."""
        answer = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in answer:
            raise AssertionError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, *, what: str, timeout: float = 60) -> Any:
        """The expression's first truthy value, asked again until ``timeout`` seconds have passed."""
        try:
            return wait_for(lambda: self.evaluate(expression), timeout=timeout, interval=0.1, message=what)
        except AssertionError as stuck:  # say what the page threw, if anything
            raise AssertionError(f"{stuck}; the page's errors: {self.console_errors}") from None

    def click(self, selector: str) -> None:
        """A real click (mouse down and up) at the middle of the first element ``selector`` names."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        assert box, f"nothing on the page matches {selector}"
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = self.evaluate("document.documentElement.scrollHeight")
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1},
            )
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", params)["data"]))
        return path

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self._process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
