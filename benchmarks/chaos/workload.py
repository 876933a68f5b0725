"""The campaign's mixed workload, and what the service acknowledged of it.

Seeded: the same ``--seed`` makes the same sequence of operations (the timing, and so what a
fault lands on, still varies). Scaled to a small machine, a few dozen runs a minute:

* AgentGroups of 3-5 counted runs with dependencies between them, ``maxActive`` 1-3 and a
  ``maxCostUSD``, sealed once their runs are in;
* single runs: counted commands and arithmetic;
* keep-alive runs, each sent counted messages (``messageKey``s) while the campaign lasts;
* runs of an Agent with ``allowedHosts`` (a command that could reach outside: a person
  resolves it if it is cut), and BYOK runs on the fake Claude (`fake_claude`);
* one evaluation (``nodus/arithmetic-v2``), one ``nodus batch run`` (the CLI), one SDK
  ``agent.map`` (a subprocess, `map_job`).

A counted command is ``echo tick >> counter.txt; sleep N``: the line is its effect and the
sleep is where faults land. Only what the service acknowledged (a 2xx answer, or for the CLI
and the map a zero exit) is recorded; requests are sent again with the same idempotency key
(or name) while the service is down, as a client would.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .service import Service

__all__ = ["AckGroup", "AckRun", "Workload", "counted"]

V1 = "nodus.dev/v1"
RUNS = "/v1/projects/default/agentruns"
GROUPS = "/v1/projects/default/agentgroups"
AGENTS = "/v1/projects/default/agents"
PLAIN, EGRESS, BYOK, EVAL = "chaos-plain", "chaos-egress", "chaos-byok", "chaos-eval"
CAP = {PLAIN: "0.10", EGRESS: "0.10", BYOK: "0.10", EVAL: "0.10"}
MAP_INPUTS = ["What is 1 + 1?", "What is 2 + 3?", "What is 4 * 5?"]
MAP_EXPECTED = ["2", "5", "20"]


def counted(seconds: int) -> str:
    return f"Use the shell to run `echo tick >> counter.txt; sleep {seconds}`"


@dataclass
class AckRun:
    name: str
    uid: str
    agent: str
    kind: str  # single, keepalive, member, egress, byok, batch, evaluation
    group: str | None = None
    deps: list[str] = field(default_factory=list)  # run names it depends on
    messages: list[str] = field(default_factory=list)  # acknowledged messageKeys


@dataclass
class AckGroup:
    name: str
    kind: str  # group, evaluation, batch
    agent: str
    max_active: int
    max_cost: str | None
    members: list[str] = field(default_factory=list)
    tasks: int = 0
    sealed: bool = False


class Workload:
    """Sends the operations; keeps what was acknowledged (`runs`, `groups`, `ops`)."""

    def __init__(self, service: Service, rng: random.Random, log: Any) -> None:
        self.service = service
        self.rng = rng
        self.log = log
        self.runs: dict[str, AckRun] = {}
        self.groups: dict[str, AckGroup] = {}
        self.ops: Counter[str] = Counter()
        self.unanswered: Counter[str] = Counter()
        self.maps: list[list[str]] = []  # each acknowledged map's answers
        self.batch_out: Path | None = None
        self.batch_keys: list[str] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._n = 0
        self.retry_until = 0.0  # the batch and the map are sent again until then

    # -- setup -------------------------------------------------------------------------------

    def setup(self) -> None:
        for name in (PLAIN, EVAL):
            self._agent(name, {})
        self._agent(EGRESS, {"network": {"allowedHosts": ["example.com"]}})
        secret = self.service.cli(
            "create", "secret", "chaos-key", "--from-literal", f"ANTHROPIC_API_KEY=sk-ant-{uuid.uuid4().hex}"
        )
        if secret.returncode != 0:
            raise RuntimeError(f"nodus create secret: {secret.stdout}{secret.stderr}")
        self._agent(
            BYOK, {"model": {"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": "chaos-key"}}
        )

    def _agent(self, name: str, extra: dict[str, Any]) -> None:
        spec = {
            "system": "Answer in one sentence.",
            "perRunMaxCostUSD": CAP[name],
            "model": {"access": "Nodus", "families": ["haiku"]},
            **extra,
        }
        body = {"apiVersion": V1, "kind": "Agent", "metadata": {"name": name}, "spec": spec}
        response = self.service.request("PUT", f"{AGENTS}/{name}", body=body)
        if response is None or response.status_code not in (200, 201):
            raise RuntimeError(f"PUT agent {name}: {response.text if response else 'no answer'}")
        self.ops["agent"] += 1

    # -- the loop ----------------------------------------------------------------------------

    def run(self, until: float, stop: threading.Event) -> None:
        """Operations until the monotonic time ``until``; the one-off ones at seeded moments."""
        start = time.monotonic()
        span = until - start
        self.retry_until = until + 120
        once = {
            "evaluation": start + span * self.rng.uniform(0.05, 0.2),
            "batch": start + span * self.rng.uniform(0.1, 0.4),
            "map": start + span * self.rng.uniform(0.3, 0.6),
        }
        self.keepalive()  # from the start, so messages flow all through the campaign
        while time.monotonic() < until and not stop.is_set():
            for what, at in list(once.items()):
                if time.monotonic() >= at:
                    del once[what]
                    {"evaluation": self.evaluation, "batch": self.start_batch, "map": self.start_map}[what]()
            action = self.rng.choices(
                ["group", "single", "keepalive", "message", "egress", "byok"],
                weights=[30, 20, 8, 25, 7, 6],
            )[0]
            keepalives = [r for r in self.runs.values() if r.kind == "keepalive"]
            if action == "keepalive" and len(keepalives) >= 4:
                action = "message"
            if action == "message" and not keepalives:
                action = "keepalive"
            if action == "byok" and sum(r.kind == "byok" for r in self.runs.values()) >= 3:
                action = "single"
            getattr(self, action)()
            stop.wait(self.rng.uniform(3.0, 6.0))
        for what in once:  # a short campaign still runs each of them once
            {"evaluation": self.evaluation, "batch": self.start_batch, "map": self.start_map}[what]()

    def finish(self, timeout: float) -> None:
        """Wait for the batch and the map (each sends again until it succeeds or time is up)."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(1.0, deadline - time.monotonic()))

    def _next(self, prefix: str) -> str:
        self._n += 1
        return f"chaos-{prefix}{self._n:03d}"

    # -- operations ----------------------------------------------------------------------------

    def _post_run(self, name: str, agent: str, kind: str, text: str, **spec: Any) -> None:
        body = {
            "apiVersion": V1,
            "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {"agent": agent, "input": text, **spec},
        }
        response = self.service.request("POST", RUNS, body=body)
        uid = (
            response.json()["metadata"]["uid"]
            if response is not None and response.status_code == 201
            else None
        )
        if (
            response is not None
            and response.status_code == 409
            and response.json().get("code") == "AlreadyExists"
        ):
            # Sent again after an answer that was lost (a replica or the cluster died): a single run
            # is known by its name, so the run that exists is the one this workload created.
            stored = self.service.request("GET", f"{RUNS}/{name}")
            if stored is not None and stored.status_code == 200 and stored.json()["spec"]["input"] == text:
                uid = stored.json()["metadata"]["uid"]
                self.ops["run created by an unanswered send"] += 1
        if uid is None:
            self.unanswered["run"] += 1
            self.log(f"run {name} not acknowledged: {response.text[:300] if response else 'no answer'}")
            return
        with self._lock:
            self.runs[name] = AckRun(name, uid, agent, kind)
            self.ops["run"] += 1

    def single(self) -> None:
        text = counted(self.rng.randint(1, 2)) if self.rng.random() < 0.7 else "What is 6 * 7?"
        self._post_run(self._next("r"), PLAIN, "single", text)

    def egress(self) -> None:
        self._post_run(self._next("e"), EGRESS, "egress", counted(2))

    def byok(self) -> None:
        self._post_run(self._next("b"), BYOK, "byok", "What is 2 + 2?")

    def keepalive(self) -> None:
        self._post_run(self._next("k"), PLAIN, "keepalive", counted(1), keepAlive=True)

    def message(self) -> None:
        run = self.rng.choice([r for r in self.runs.values() if r.kind == "keepalive"])
        key = f"m{self._n:03d}-{uuid.uuid4().hex[:6]}"
        self._n += 1
        body = {"payload": counted(1), "messageKey": key}
        response = self.service.request("POST", f"{RUNS}/{run.name}/messages", body=body)
        if response is None or response.status_code != 202:
            self.unanswered["message"] += 1
            self.log(f"message to {run.name} not acknowledged: {response.text if response else 'no answer'}")
            return
        with self._lock:
            run.messages.append(key)
            self.ops["message"] += 1

    def group(self) -> None:
        name = self._next("g")
        members = self.rng.randint(3, 5)
        max_active = self.rng.randint(1, 3)
        max_cost = self.rng.choice(["0.20", "0.50", "1.00"])
        body = {
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": name},
            "spec": {"agent": PLAIN, "limits": {"maxActive": max_active}, "maxCostUSD": max_cost},
        }
        response = self.service.request("POST", GROUPS, body=body)
        # 409 after a send that got no answer: the first one was stored (the name is ours).
        if response is None or response.status_code not in (201, 409):
            self.unanswered["group"] += 1
            return
        acked = AckGroup(name, "group", PLAIN, max_active, max_cost)
        with self._lock:
            self.groups[name] = acked
            self.ops["group"] += 1
        items, deps = [], {}
        for i in range(members):
            spec: dict[str, Any] = {
                "agent": PLAIN,
                "group": name,
                "taskKey": f"t{i}",
                "input": counted(self.rng.randint(1, 2)),
            }
            if i and self.rng.random() < 0.4:
                spec["dependsOn"] = sorted({f"t{self.rng.randrange(i)}"})
                deps[f"{name}-t{i}"] = [f"{name}-{key}" for key in spec["dependsOn"]]
            items.append({"apiVersion": V1, "kind": "AgentRun", "spec": spec})
        listed = {"apiVersion": V1, "kind": "AgentRunList", "items": items}
        response = self.service.request("POST", RUNS, body=listed, key=uuid.uuid4().hex)
        # 200: the first answer, replayed for the key sent again after an answer was lost.
        if response is None or response.status_code not in (200, 201):
            self.unanswered["runs of a group"] += 1
            return
        with self._lock:
            for item in response.json()["items"]:
                run_name = item["metadata"]["name"]
                self.runs[run_name] = AckRun(
                    run_name, item["metadata"]["uid"], PLAIN, "member", name, deps.get(run_name, [])
                )
                acked.members.append(run_name)
                self.ops["run"] += 1
        sealed = self.service.request("PATCH", f"{GROUPS}/{name}", body={"spec": {"sealed": True}})
        if sealed is not None and sealed.status_code == 200:
            acked.sealed = True
            self.ops["seal"] += 1
        else:
            self.unanswered["seal"] += 1

    def evaluation(self) -> None:
        name = self._next("eval")
        body = {
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": name},
            "spec": {
                "agent": EVAL,
                "limits": {"maxActive": 2},
                "evaluation": {"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 3, "seed": 5},
            },
        }
        response = self.service.request("POST", GROUPS, body=body)
        if response is None or response.status_code not in (201, 409):
            self.unanswered["evaluation"] += 1
            return
        with self._lock:
            self.groups[name] = AckGroup(name, "evaluation", EVAL, 2, None, tasks=3, sealed=True)
            self.ops["evaluation"] += 1

    def start_batch(self) -> None:
        self._background("batch", self._batch)

    def start_map(self) -> None:
        self._background("map", self._map)

    def _background(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=f"chaos-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _batch(self) -> None:
        """`nodus batch run`, run again (it resumes, nothing twice) until it exits 0."""
        work = self.service.base / "work"
        keys = [f"k{i}" for i in range(4)]
        tasks: list[dict[str, Any]] = [{"key": key, "input": counted(1)} for key in keys]
        tasks[-1]["depends_on"] = keys[:2]
        (work / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
        out = work / "answers.parquet"
        attempt = 0
        while attempt == 0 or time.monotonic() < self.retry_until:
            attempt += 1
            done = self.service.cli(
                "batch", "run", str(work / "tasks.jsonl"), "--agent", PLAIN, "--out", str(out),
                "--max-active", "2", "--max-cost", "0.50", timeout=400,
            )  # fmt: skip
            if done.returncode == 0 and f"{len(keys)} of {len(keys)} tasks succeeded" in done.stdout:
                with self._lock:
                    self.batch_out, self.batch_keys = out, keys
                    self.ops["batch"] += 1
                return
            self.log(f"batch run attempt {attempt} exited {done.returncode}: {done.stderr[-300:]}")
            time.sleep(3)
        self.unanswered["batch"] += 1

    def _map(self) -> None:
        """An SDK `agent.map` in a script of its own, again until it yields every answer."""
        env = {
            **self.service.env,
            "NODUS_API_URL": self.service.api_url,
            "NODUS_TOKEN": self.service.token(),
            "NODUS_PROJECT": "default",
        }
        script = str(Path(__file__).with_name("map_job.py"))
        attempt = 0
        while attempt == 0 or time.monotonic() < self.retry_until:
            attempt += 1
            done = subprocess.run(
                [sys.executable, script, "chaos-mapper", json.dumps(MAP_INPUTS)],
                env=env, capture_output=True, text=True, timeout=400, check=False,
            )  # fmt: skip
            if done.returncode == 0:
                with self._lock:
                    self.maps.append(json.loads(done.stdout.strip().splitlines()[-1]))
                    self.ops["map"] += 1
                return
            self.log(f"map attempt {attempt} exited {done.returncode}: {done.stderr[-1500:]}")
            time.sleep(3)
        self.unanswered["map"] += 1
