"""After the last fault: let the service come to rest, then check every invariant from storage
(journals, messages, credits, evaluation cases) and the API (runs, groups, steps, credits).

Invariants (each violation names its run or group):

* ``lost``: every acknowledged run exists with the uid it was acknowledged with, every
  acknowledged message is stored, a group holds exactly the runs it was acknowledged with, the
  batch wrote one row per task and the map yielded every answer;
* ``repeated``: a run's counter holds one line per command step that is Completed (or resolved
  Completed) in its journal; a step has one ``Started`` per attempt, one Completed at most, and
  an attempt before the last was declared without effect; a message was stored once per key;
* ``billing``: a run's cost is the sum of its steps' (the API) and of its journal's Completed
  records; a group's is the sum of its runs'; the project's ledger charged what its runs cost
  (plus what deleted runs cost), with nothing left reserved;
* ``cap``: no run over its Agent's ``perRunMaxCostUSD``, no group over its ``maxCostUSD``;
* ``maxActive``: never more admitted-and-unfinished runs of a group at once than its limit;
* ``dependencies``: a run started only after the runs it depends on finished;
* ``ended``: within the bound after the last fault every run ended or waits for what it should
  (a keep-alive run for its next message, having read every one; a run that may have reached
  outside, or called Claude on the user's key, for a person, who then resolves it the way the
  fault tests do: by looking at the counter); a run that reaches nothing outside never waits
  for a person; a run fails only for a reason of its own, never for a fault.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from nodus_ray.durable.journal import Journal, JournalRecord
from nodus_ray.sandbox.run_workspaces import workspace_path
from nodus_ray.store import layout

from .service import Service
from .workload import CAP, GROUPS, MAP_EXPECTED, RUNS, AckRun, Workload

__all__ = ["Checker", "Violation"]

TERMINAL = ("Succeeded", "Failed", "Cancelled")
# What a run of this workload may fail for: its own doing, not the service's.
OWN_FAILURES = ("MaxToolCallsReached",)


@dataclass(frozen=True)
class Violation:
    invariant: str
    subject: str
    detail: str


class Checker:
    def __init__(self, service: Service, workload: Workload, log: Callable[[str], None]) -> None:
        self.service = service
        self.workload = workload
        self.log = log
        self.violations: list[Violation] = []
        self.resolved: list[str] = []  # runs a person resolved (allowed waits)
        self.waiting: dict[str, str] = {}  # runs at rest waiting, and for what
        self.settle_seconds = 0.0

    def fail(self, invariant: str, subject: str, detail: str) -> None:
        self.violations.append(Violation(invariant, subject, detail))

    # -- coming to rest ----------------------------------------------------------------------

    def settle(self, bound: float) -> None:
        """Poll until every acknowledged run and group is at rest, resolving what a person
        would; whatever is not at rest after ``bound`` seconds is an ``ended`` violation."""
        start = time.monotonic()
        deadline = start + bound
        restless: dict[str, str] = {}
        while True:
            restless = {}
            try:
                runs = {r["metadata"]["name"]: r for r in self.service.get(RUNS)["items"]}
                groups = {g["metadata"]["name"]: g for g in self.service.get(GROUPS)["items"]}
            except RuntimeError as down:
                restless["service"] = str(down)
                runs, groups = {}, {}
            for name, acked in self.workload.runs.items():
                run = runs.get(name)
                if run is None:
                    continue  # `lost`, checked below
                why = self._restless(acked, run)
                if why:
                    restless[name] = why
            for name, group in self.workload.groups.items():
                status = (groups.get(name) or {}).get("status") or {}
                if group.sealed and status.get("phase") not in TERMINAL:
                    restless[name] = f"group {status.get('phase')}"
            if runs and not restless:
                break
            if time.monotonic() > deadline:
                for name, why in restless.items():
                    self.fail("ended", name, f"not at rest {bound:.0f}s after the last fault: {why}")
                break
            time.sleep(1.0)
        self.settle_seconds = time.monotonic() - start

    def _restless(self, acked: AckRun, run: dict[str, Any]) -> str | None:
        status = run["status"]
        phase, reason = status["phase"], status.get("reason")
        if phase in TERMINAL:
            return None
        if phase == "Waiting" and reason == "AwaitingMessage" and acked.kind == "keepalive":
            received = (status.get("messages") or {}).get("received", 0)
            read = (status.get("messages") or {}).get("read", 0)
            if read == received:
                self.waiting[acked.name] = "AwaitingMessage"
                return None
            return f"AwaitingMessage with {read} of {received} messages read"
        if phase == "Waiting" and reason == "MaxCostReached":
            self.waiting[acked.name] = "MaxCostReached"
            return None
        if phase == "Waiting" and reason == "NeedsResolution":
            if acked.kind in ("egress", "byok"):
                self._resolve(acked, run)
                return "resolved by a person, resuming"
            if acked.name not in self.waiting:
                self.waiting[acked.name] = "NeedsResolution"
                self.fail(
                    "ended",
                    acked.name,
                    f"reaches nothing outside, yet waits for a person at {status.get('step')}: "
                    f"{status.get('message')} (history: {self.history(acked.name)})",
                )
            return None
        return f"{phase} {reason or ''}".strip()

    def _resolve(self, acked: AckRun, run: dict[str, Any]) -> None:
        """What the fault tests' operator does: look at the counter, record what happened."""
        step = run["status"]["step"]
        records = self.journal(acked.name)
        completed = len(_completed_commands(records))
        happened = step and "/command" in step and self._ticks(acked) > completed
        decision: dict[str, Any] = {
            "step": step,
            "revision": run["metadata"]["resourceVersion"],
            "evidence": "counter.txt inspected by the campaign",
        }
        if happened:
            decision |= {"decision": "Completed", "result": {"exitCode": 0, "output": ""}}
        else:
            decision |= {"decision": "NoEffect"}
        response = self.service.request("POST", f"{RUNS}/{acked.name}/resolve", body=decision, patience=10)
        if response is not None and response.status_code == 200:
            self.resolved.append(f"{acked.name} {step} {decision['decision']}")
            self.log(f"resolved {acked.name} {step}: {decision['decision']}")

    # -- reading -----------------------------------------------------------------------------

    def journal(self, name: str) -> list[JournalRecord]:
        records: list[JournalRecord] = Journal(
            self.service.store(), layout.journal_folder("default", name)
        ).load()
        return records

    def history(self, name: str) -> str:
        try:
            records = self.journal(name)
        except Exception as unreadable:  # noqa: BLE001 - the history is for the message only
            return f"unreadable: {unreadable}"
        return ", ".join(f"{r.step_id}:{r.state}@{r.attempt}" for r in records if r.kind != "message")

    def _ticks(self, acked: AckRun) -> int:
        path = workspace_path(self.service.sandbox_root, "default", acked.name, acked.uid) / "counter.txt"
        return path.read_text().count("tick") if path.exists() else -1

    # -- the invariants ----------------------------------------------------------------------

    def check(self) -> None:
        runs = {r["metadata"]["name"]: r for r in self.service.get(RUNS)["items"]}
        for name, acked in sorted(self.workload.runs.items()):
            run = runs.get(name)
            if run is None:
                self.fail("lost", name, "acknowledged, not listed")
                continue
            if run["metadata"]["uid"] != acked.uid:
                self.fail("lost", name, f"uid {run['metadata']['uid']} is not the acknowledged {acked.uid}")
            self._check_run(acked, run)
        for name in sorted(self.workload.groups):
            self._check_group(name, runs)
        self._check_ledger(list(runs.values()))
        self._check_batch_and_map(runs)

    def _check_run(self, acked: AckRun, run: dict[str, Any]) -> None:
        name, status = acked.name, run["status"]
        if status["phase"] == "Failed" and status.get("reason") not in OWN_FAILURES:
            self.fail("ended", name, f"Failed {status.get('reason')}: {status.get('message')}")
        records = self.journal(name)
        history = self.history(name)
        self._check_attempts(name, records, history, acked.kind == "byok")
        completed = _completed_commands(records)
        ticks = self._ticks(acked)
        left_started = _unfinished_command(records)
        if ticks < 0:
            if completed and status["phase"] != "Failed":
                self.fail("lost", name, f"{len(completed)} commands completed, no workspace counter")
        elif not (len(completed) <= ticks <= len(completed) + (status["phase"] == "Failed" and left_started)):
            self.fail(
                "repeated",
                name,
                f"counter reads {ticks} ticks for {len(completed)} completed command steps ({history})",
            )
        total = Decimal(status["cost"]["totalUSD"])
        steps = self.service.get(f"{RUNS}/{name}/steps")["items"]
        recorded = sum((Decimal(s["costUSD"]) for s in steps), Decimal(0))
        journaled = sum((Decimal(r.cost_usd) for r in records if r.state == "Completed"), Decimal(0))
        if not total == recorded == journaled:
            self.fail("billing", name, f"cost {total}, its steps {recorded}, its journal {journaled}")
        if total > Decimal(CAP[acked.agent]):
            self.fail("cap", name, f"cost {total} over the Agent's cap {CAP[acked.agent]}")
        if acked.kind == "keepalive":
            self._check_messages(acked, run)

    def _check_attempts(self, name: str, records: list[JournalRecord], history: str, byok: bool) -> None:
        by_step: dict[str, list[JournalRecord]] = {}
        for record in records:
            if record.kind != "message":
                by_step.setdefault(record.step_id, []).append(record)
        for step, mine in by_step.items():
            started = [r.attempt for r in mine if r.state == "Started"]
            if len(started) != len(set(started)):
                self.fail("repeated", name, f"{step}: two Started records of one attempt ({history})")
            done = [r for r in mine if r.state in ("Completed", "Resolved")]
            if len(done) > 1:
                self.fail("repeated", name, f"{step}: completed {len(done)} times ({history})")
            # A command (or a call on the user's own key) runs again only once declared without
            # effect; a call on the server's key is safe to repeat (billed once: `billing`).
            effectful = any(r.kind == "command" for r in mine) or (
                byok and any(r.kind == "model" for r in mine)
            )
            for attempt in sorted(set(started))[:-1] if effectful else []:
                if not any(r.attempt == attempt and r.state in ("NoEffect", "Failed") for r in mine):
                    self.fail("repeated", name, f"{step}: attempt {attempt} ran again undeclared ({history})")
        keyed = [r.payload for r in records if r.kind == "message"]
        if len(keyed) != len({r.step_id for r in records if r.kind == "message"}):
            self.fail("repeated", name, "a conversation message was journaled twice")

    def _check_messages(self, acked: AckRun, run: dict[str, Any]) -> None:
        store = self.service.store()
        folder = layout.messages_folder("default", acked.name)
        stored = [store.read_json(f"{folder}/{entry}") for entry in store.list_dir(folder)]
        keys = [m.get("messageKey") for m in stored]
        for key in acked.messages:
            if keys.count(key) != 1:
                self.fail(
                    "lost" if not keys.count(key) else "repeated",
                    acked.name,
                    f"message {key} stored {keys.count(key)} times",
                )
        seqs = [int(m["seq"]) for m in stored]
        if sorted(seqs) != list(range(1, len(seqs) + 1)):
            self.fail("repeated", acked.name, f"message sequence {sorted(seqs)}")
        status = run["status"]
        turns = len(status.get("turns") or [])
        if status["phase"] == "Waiting" and turns != len(stored) + 1:
            self.fail("lost", acked.name, f"{turns} turns for 1 input and {len(stored)} messages")

    def _check_group(self, name: str, runs: dict[str, dict[str, Any]]) -> None:
        acked = self.workload.groups[name]
        group = self.service.get(f"{GROUPS}/{name}")
        status = group.get("status") or {}
        members = [r for r in runs.values() if r["spec"].get("group") == name]
        if acked.kind == "group" and sorted(r["metadata"]["name"] for r in members) != sorted(acked.members):
            self.fail(
                "lost",
                name,
                f"runs {sorted(r['metadata']['name'] for r in members)} != acknowledged {sorted(acked.members)}",
            )
        if acked.kind == "evaluation":
            self._check_evaluation(name, status, members)
        most = _most_at_once(members)
        if most > acked.max_active:
            self.fail("maxActive", name, f"{most} runs at once, limit {acked.max_active}")
        total = sum((Decimal(r["status"]["cost"]["totalUSD"]) for r in members), Decimal(0))
        cost = status.get("cost") or {}
        if Decimal(cost.get("totalUSD", "0")) != total:
            self.fail("billing", name, f"group cost {cost.get('totalUSD')} != its runs' {total}")
        if Decimal(cost.get("reservedUSD", "0")) != 0:
            self.fail("billing", name, f"{cost.get('reservedUSD')} left reserved")
        if cost.get("limitUSD") is not None and total > Decimal(cost["limitUSD"]):
            self.fail("cap", name, f"cost {total} over maxCostUSD {cost['limitUSD']}")
        finished = {r["metadata"]["name"]: r["status"].get("finishedAt") for r in members}
        for run in members:
            admitted = run["status"].get("admittedAt")
            for dep in self.workload.runs.get(run["metadata"]["name"], AckRun("", "", "", "")).deps:
                if admitted and (not finished.get(dep) or admitted < str(finished[dep])):
                    self.fail(
                        "dependencies",
                        run["metadata"]["name"],
                        f"admitted {admitted}, {dep} finished {finished.get(dep)}",
                    )

    def _check_evaluation(self, name: str, status: dict[str, Any], members: list[dict[str, Any]]) -> None:
        tasks = self.workload.groups[name].tasks
        items = self.service.get(f"{GROUPS}/{name}/results")["items"]
        states = [item["state"] for item in items]
        if status.get("phase") != "Succeeded" or len(members) != tasks or states != ["Scored"] * tasks:
            self.fail(
                "lost", name, f"evaluation {status.get('phase')}: {len(members)} runs, results {states}"
            )
        evaluation = status.get("evaluation") or {}
        if (evaluation.get("scored"), evaluation.get("pending"), evaluation.get("unscored")) != (tasks, 0, 0):
            self.fail("lost", name, f"evaluation counts {evaluation}")
        cases = self.service.store().list_dir(layout.evaluation_cases_folder("default", name))
        if len(cases) != tasks:
            self.fail(
                "repeated" if len(cases) > tasks else "lost",
                name,
                f"{len(cases)} case records for {tasks} tasks",
            )

    def _check_ledger(self, runs: list[dict[str, Any]]) -> None:
        credits = self.service.get("/v1/projects/default/credits")
        stored = self.service.store().read_json(layout.credits("default"))
        deleted = Decimal(stored.get("deletedSpendUSD", "0"))
        total = deleted + sum((Decimal(r["status"]["cost"]["totalUSD"]) for r in runs), Decimal(0))
        spent = Decimal(credits["spentUSD"])
        if spent != total:
            self.fail(
                "billing", "project default", f"ledger spent {spent}, runs cost {total} (deleted {deleted})"
            )
        if Decimal(credits["reservedUSD"]) != 0:
            self.fail("billing", "project default", f"{credits['reservedUSD']} left reserved")
        if Decimal(credits["balanceUSD"]) != Decimal(credits["grantedUSD"]) - spent:
            self.fail("billing", "project default", f"balance {credits['balanceUSD']} != granted - spent")

    def _check_batch_and_map(self, runs: dict[str, dict[str, Any]]) -> None:
        import pyarrow.parquet as pq

        from nodus.batch import batch_group_name

        workload = self.workload
        if workload.batch_out is not None:
            rows = pq.read_table(workload.batch_out).to_pylist()
            keys = sorted(str(row.get("key")) for row in rows)
            if keys != sorted(workload.batch_keys):
                self.fail("lost", "batch", f"rows for {keys}, tasks {workload.batch_keys}")
            group = batch_group_name(workload.batch_out)
            members = [r for r in runs.values() if r["spec"].get("group") == group]
            if len(members) != len(workload.batch_keys):
                self.fail("repeated", group, f"{len(members)} runs for {len(workload.batch_keys)} tasks")
            for run in members:
                name = run["metadata"]["name"]
                acked = AckRun(name, run["metadata"]["uid"], run["spec"]["agent"], "batch", group)
                self._check_run(acked, run)
            most = _most_at_once(members)
            if most > 2:
                self.fail("maxActive", group, f"{most} runs at once, limit 2")
        for answers in workload.maps:
            if len(answers) != len(MAP_EXPECTED) or not all(
                e in a for e, a in zip(MAP_EXPECTED, answers, strict=False)
            ):
                self.fail("lost", "map", f"answers {answers}")


def _completed_commands(records: list[JournalRecord]) -> set[str]:
    return {r.step_id for r in records if r.kind == "command" and r.state in ("Completed", "Resolved")}


def _unfinished_command(records: list[JournalRecord]) -> bool:
    last: dict[str, str] = {}
    for record in records:
        if record.kind == "command":
            last[record.step_id] = record.state
    return any(state == "Started" for state in last.values())


def _most_at_once(runs: list[dict[str, Any]]) -> int:
    """The most runs admitted and unfinished at one moment (an end before a start at a tie)."""
    events: list[tuple[str, int]] = []
    for run in runs:
        status = run["status"]
        if status.get("admittedAt"):
            events.append((status["admittedAt"], 1))
            events.append((status.get("finishedAt") or "9999", -1))
    most = current = 0
    for _, change in sorted(events):
        current += change
        most = max(most, current)
    return most
