"""A run actor in miniature for the program side's tests: the protocol over a Unix socket, with an
in-memory journal that replays, numbers steps as the real actor does (``{name}-{n}``) and parks
on timers and missing messages. `start` runs ``python -m nodus._runtime.bootstrap`` against it.

Also the tests of the fake itself that the other test files rely on (ids, replay, park).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodus._runtime.protocol import (
    ErrorInfo,
    Gather,
    Hello,
    Log,
    ModelCall,
    Outcome,
    Raise,
    Reply,
    Return,
    Sleep,
    Spawn,
    StepBegin,
    StepEnd,
    StepFail,
    WaitForMessage,
    encode,
    parse_request,
)

SDK_DIR = Path(__file__).resolve().parents[2] / "sdk"
PLACEHOLDER_KEY = "nodus-run-test-placeholder"


@dataclass
class Entry:
    id: str
    value: Any = None
    error: ErrorInfo | None = None


@dataclass
class Start:
    """What one process of the program said: its log lines, its end, its exit code."""

    logs: list[tuple[str, str]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    returned: Any = None
    raised: ErrorInfo | None = None
    ended: bool = False
    fatal: str = ""  # why the actor ended the run (it answered ``fatal``)
    exit_code: int | None = None
    stderr: str = ""
    handling_seconds: float = 0.0  # the actor's own time answering (not the program's)

    @property
    def output(self) -> str:
        return "".join(text for text, _ in self.logs)


class FakeActor:
    """Serves one program connection at a time; the journal outlives the connections."""

    def __init__(self, input: Any = None, model: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nrt-"))  # short: a socket path has 108 bytes
        self.socket_path = str(self.dir / "runtime.sock")
        self.input = input
        self.model = model
        self.journal: list[Entry] = []
        self.messages: dict[str, list[Any]] = {}
        self.model_bodies: list[dict[str, Any]] = []
        self.starts: list[Start] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.socket_path)
        self._server.listen(4)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._serve(conn, self.starts[-1])

    # -- one start of the program ------------------------------------------------------------------

    def _serve(self, conn: socket.socket, start: Start) -> None:
        cursor = 0
        counts: Counter[str] = Counter()
        pending: str | None = None
        reader = conn.makefile("rb")

        def ident(name: str) -> str:
            counts[name] += 1
            return f"{name}-{counts[name]}"

        def replay_or(step_id: str) -> Entry | None:
            nonlocal cursor
            if cursor < len(self.journal):
                entry = self.journal[cursor]
                if entry.id != step_id:  # the real actor fails the run NonDeterministic
                    start.fatal = f"NonDeterministic: {step_id} where the journal has {entry.id}"
                    return Entry(step_id)
                cursor += 1
                return entry
            return None

        def record(step_id: str, value: Any = None, error: ErrorInfo | None = None) -> None:
            nonlocal cursor
            self.journal.append(Entry(step_id, value, error))
            cursor = len(self.journal)

        def recorded(entry: Entry) -> Reply:
            return Reply(Outcome.RECORDED, entry.value, entry.error, replaying=cursor < len(self.journal))

        pending_effect = "pure"
        with conn:
            for line in reader:
                began = time.perf_counter()
                request = parse_request(line)
                start.requests.append(str(request.op))
                reply: Reply | None
                match request:
                    case Hello():
                        facts = {"input": self.input, "run": "r1", "project": "p", "idempotencyKey": "ik-1"}
                        reply = Reply(
                            Outcome.OK, {**facts, "attempt": len(self.starts)}, replaying=bool(self.journal)
                        )
                    case StepBegin(name=name, effect=effect):
                        step_id = ident(name)
                        entry = replay_or(step_id)
                        if entry is not None:
                            reply = recorded(entry)
                        else:
                            pending, pending_effect, reply = step_id, effect, Reply(Outcome.EXECUTE)
                    case StepEnd(value=value):
                        record(pending or "?", value)
                        # As the real actor: only an external step's end is answered.
                        reply = Reply(Outcome.OK) if pending_effect == "external" else None
                    case StepFail(error=error):
                        record(pending or "?", None, error)
                        reply = Reply(Outcome.OK)
                    case Sleep():
                        entry = replay_or(ident("sleep"))
                        if entry is not None:
                            reply = recorded(entry)
                        else:
                            record(f"sleep-{counts['sleep']}", None)  # the timer is journaled, then due
                            reply = Reply(Outcome.PARK, message="Sleeping")
                    case WaitForMessage(name=name):
                        step_id = ident(f"message/{name}")
                        entry = replay_or(step_id)
                        if entry is not None:
                            reply = recorded(entry)
                        elif self.messages.get(name):
                            record(step_id, self.messages[name].pop(0))
                            reply = recorded(self.journal[-1])
                        else:
                            counts[f"message/{name}"] -= 1
                            reply = Reply(Outcome.PARK, message="AwaitingMessage")
                    case ModelCall(body=body):
                        step_id = ident("model")
                        entry = replay_or(step_id)
                        if entry is None:
                            self.model_bodies.append(body)
                            assert self.model is not None, "the program made a model call"
                            answer = self.model(body)
                            record(step_id, answer.value, answer.error)
                            entry = self.journal[-1]
                        reply = recorded(entry)
                    case Spawn(key=key):
                        reply = Reply(Outcome.RECORDED, {"name": f"r1-{key}"})
                    case Gather(children=children):
                        reply = Reply(Outcome.RECORDED, [{"ok": True, "value": c} for c in children])
                    case Log(text=text, stream=stream):
                        start.logs.append((text, stream))
                        reply = None
                    case Return(value=value):
                        start.returned, start.ended = value, True
                        reply = Reply(Outcome.OK)
                    case Raise(error=error):
                        start.raised, start.ended = error, True
                        reply = Reply(Outcome.OK)
                    case _:
                        reply = Reply(Outcome.RECORDED)
                if start.fatal:
                    reply = Reply(Outcome.FATAL, message=start.fatal)
                if reply is not None:
                    conn.sendall(encode(reply))
                start.handling_seconds += time.perf_counter() - began

    # -- a process of the program ------------------------------------------------------------------

    def start(self, source: Path, entrypoint: str = "main:main", timeout: float = 60) -> Start:
        """Run the bootstrap once against this actor, to its end (or its park)."""
        start = Start()
        self.starts.append(start)
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(
                ("ANTHROPIC_", "NODUS_", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
            )
        }
        env.update(
            NODUS_RUNTIME_SOCKET=self.socket_path,
            NODUS_ENTRYPOINT=entrypoint,
            PYTHONPATH=os.pathsep.join([str(source), str(SDK_DIR)]),
            ANTHROPIC_API_KEY=PLACEHOLDER_KEY,
        )
        done = subprocess.run(
            [sys.executable, "-m", "nodus._runtime.bootstrap"],
            env=env,
            cwd=source,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        start.exit_code, start.stderr = done.returncode, done.stderr + done.stdout
        return start


def write_program(root: Path, text: str, name: str = "main.py") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
    return root


@pytest.fixture
def actor() -> Iterator[FakeActor]:
    fake = FakeActor()
    yield fake
    fake.close()


def test_the_fake_numbers_steps_and_replays_them(actor: FakeActor, tmp_path: Path) -> None:
    source = write_program(
        tmp_path / "src",
        """
from nodus._runtime.definition import ProgramDefinition
agent = ProgramDefinition()

@agent.step
def add(a, b):
    return a + b

@agent.entrypoint
def main(ctx, input):
    first = add(1, 2)
    ctx.sleep("1s")
    return [first, add(3, 4), ctx.step("add", lambda: 10)]
""",
    )
    parked = actor.start(source)
    assert parked.exit_code == 0, parked.stderr
    assert not parked.ended and [e.id for e in actor.journal] == ["add-1", "sleep-1"]
    done = actor.start(source)
    assert done.returned == [3, 7, 10], done.stderr
    assert [e.id for e in actor.journal] == ["add-1", "sleep-1", "add-2", "add-3"]
    assert asdict(actor.journal[0]) == {"id": "add-1", "value": 3, "error": None}
    assert json.loads(json.dumps(done.returned)) == [3, 7, 10]


def test_a_fatal_answer_ends_the_program_where_it_is(actor: FakeActor, tmp_path: Path) -> None:
    actor.journal.append(Entry("other-1", 1))
    source = write_program(
        tmp_path / "src",
        """
from pathlib import Path
def main(ctx, input):
    try:
        ctx.step("fetch", lambda: 1)
    finally:
        Path("went-on").write_text("yes")
""",
    )
    start = actor.start(source)
    assert start.fatal == "NonDeterministic: fetch-1 where the journal has other-1"
    assert start.exit_code == 3 and not start.ended
    assert "nodus: the run ended: NonDeterministic" in start.stderr
    assert not (tmp_path / "src" / "went-on").exists()
