"""What every test session needs to be honest: a sandbox that really runs.

The containment, escape and egress tests skip themselves where bubblewrap cannot run, which
on a machine that should have it would turn a broken sandbox into a green suite. So a session
fails at once when bubblewrap cannot run here, unless ``NODUS_TEST_NO_BWRAP=1`` says this
machine lacks it on purpose (then those tests skip, and say why).
"""

from __future__ import annotations

import os

import pytest

NO_BWRAP_ENV = "NODUS_TEST_NO_BWRAP"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get(NO_BWRAP_ENV) == "1":
        return
    from nodus_ray.sandbox import bwrap_available

    if not bwrap_available():
        pytest.exit(
            "bubblewrap cannot run here, so the sandbox tests would only skip: install it "
            f"(`apt-get install bubblewrap`) or set {NO_BWRAP_ENV}=1 on a machine that lacks it on purpose",
            returncode=1,
        )
