"""Pages and selectors in the control plane (`control.listing`), without Ray.

The paging function over thousands of runs, with runs created and deleted between pages; the
continue token refused for another query or when edited; then the service over a real control
plane's registry (runs created through the runs service), and the API's answers and refusals
through the real app and client over it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodus.errors import BadRequest
from nodus_ray.control.list_query import ListKind, ListPage, ListQuery
from nodus_ray.control.listing import ListingService, page_of, sort_key
from nodus_ray.control.tokens import token_digest
from nodus_serve.app import create_app
from tests.fakes.control_plane import client_over
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc, until

START = datetime(2026, 12, 3, 11, 0, tzinfo=UTC)


def _stamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _run(name: str, created: datetime, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": _stamp(created), "labels": labels},
        "spec": {"agent": "helper"},
        "status": {"phase": "Pending"},
    }


def _pages(query: ListQuery, candidates: list[dict[str, Any]]) -> list[ListPage]:
    pages = [page_of(query, candidates)]
    while pages[-1].continue_token:
        pages.append(
            page_of(ListQuery(**{**query.__dict__, "continue_token": pages[-1].continue_token}), candidates)
        )
    return pages


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


def test_pages_of_thousands_hold_every_match_once_in_creation_order() -> None:
    rng = random.Random(7)
    # 2,500 runs over 1,000 distinct instants: many share a time (ties go by name), and some
    # instants have no fraction, which must still sort as times, not as text.
    runs = [
        _run(f"r-{index:05d}", START + timedelta(seconds=rng.randrange(1000) / 2), team=rng.choice("abc"))
        for index in range(2500)
    ]
    rng.shuffle(runs)
    query = ListQuery(ListKind.AGENT_RUNS, "demo", label_selector="team=a", limit=7)
    pages = _pages(query, runs)
    listed = [item for page in pages for item in page.items]
    wanted = sorted((r for r in runs if r["metadata"]["labels"]["team"] == "a"), key=sort_key)
    assert _names(listed) == _names(wanted)  # every match, once, in (creation time, name) order
    assert all(len(page.items) == 7 for page in pages[:-1]) and 1 <= len(pages[-1].items) <= 7
    # remainingItemCount counts what is after each page; the last page has no token.
    assert [page.remaining_item_count for page in pages] == [
        len(wanted) - 7 * (index + 1) if index < len(pages) - 1 else 0 for index in range(len(pages))
    ]
    assert pages[-1].continue_token is None and pages[-1].metadata() == {"remainingItemCount": 0}


def test_a_page_without_a_fraction_sorts_by_time_not_by_text() -> None:
    whole = _run("b", START)  # "...T11:00:00Z"
    later = _run("a", START + timedelta(microseconds=1))  # "...T11:00:00.000001Z"
    earlier = _run("c", START - timedelta(microseconds=1))
    page = page_of(ListQuery(ListKind.AGENT_RUNS, "demo", limit=10), [later, whole, earlier])
    assert _names(page.items) == ["c", "b", "a"] and page.continue_token is None


def test_runs_created_and_deleted_between_pages_neither_skip_nor_repeat_the_others() -> None:
    runs = [_run(f"r-{index:03d}", START + timedelta(seconds=index)) for index in range(50)]
    query = ListQuery(ListKind.AGENT_RUNS, "demo", limit=7)
    first = page_of(query, runs)
    seen = _names(first.items)
    # Meanwhile: a seen run and an unseen one are deleted, runs are created (newer, and one with
    # the same instant as the last seen run but a name after it).
    runs = [r for r in runs if r["metadata"]["name"] not in ("r-003", "r-020")]
    runs += [_run(f"new-{index}", START + timedelta(seconds=100 + index)) for index in range(5)]
    runs.append(_run("r-006-b", START + timedelta(seconds=6)))
    token = first.continue_token
    while token:
        page = page_of(ListQuery(ListKind.AGENT_RUNS, "demo", limit=7, continue_token=token), runs)
        seen += _names(page.items)
        token = page.continue_token
    assert len(seen) == len(set(seen))  # nothing twice
    survivors = {f"r-{index:03d}" for index in range(50)} - {"r-020"}
    assert survivors <= set(seen)  # nothing that existed throughout is skipped
    assert {f"new-{index}" for index in range(5)} | {"r-006-b"} <= set(seen)  # created after the key


def test_an_unpaged_list_keeps_its_order_and_selectors_still_filter() -> None:
    runs = [_run("z", START, team="a"), _run("a", START + timedelta(seconds=1), team="b"), _run("m", START)]
    page = page_of(ListQuery(ListKind.AGENT_RUNS, "demo"), runs)
    assert _names(page.items) == ["z", "a", "m"] and page.metadata() == {}
    page = page_of(ListQuery(ListKind.AGENT_RUNS, "demo", label_selector="team"), runs)
    assert _names(page.items) == ["z", "a"]
    page = page_of(ListQuery(ListKind.AGENT_RUNS, "demo", field_selector="metadata.name!=z"), runs)
    assert _names(page.items) == ["a", "m"]


def _token_payload(token: str) -> dict[str, Any]:
    return dict(json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))))


def _token_of(payload: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


def test_a_continue_token_is_refused_for_another_query_or_when_edited_or_damaged() -> None:
    runs = [_run(f"r-{index}", START + timedelta(seconds=index), team="a") for index in range(10)]
    query = ListQuery(ListKind.AGENT_RUNS, "demo", label_selector="team=a", limit=3)
    token = page_of(query, runs).continue_token
    assert token is not None
    # The same query continues, also spelled differently and with another page size.
    same = ListQuery(ListKind.AGENT_RUNS, "demo", label_selector=" team == a ", limit=5, continue_token=token)
    assert _names(page_of(same, runs).items) == ["r-3", "r-4", "r-5", "r-6", "r-7"]
    payload = _token_payload(token)
    cases = {
        "another selector": ListQuery(ListKind.AGENT_RUNS, "demo", label_selector="team=b", limit=3),
        "another field selector": ListQuery(
            ListKind.AGENT_RUNS, "demo", label_selector="team=a", field_selector="spec.agent=x", limit=3
        ),
        "another project": ListQuery(ListKind.AGENT_RUNS, "other", label_selector="team=a", limit=3),
        "another kind": ListQuery(ListKind.AGENTS, "demo", label_selector="team=a", limit=3),
        "another filter": ListQuery(ListKind.AGENT_RUNS, "demo", label_selector="team=a", limit=3, group="g"),
    }
    for what, other in cases.items():
        with pytest.raises(BadRequest, match="belongs to another query") as raised:
            page_of(ListQuery(**{**other.__dict__, "continue_token": token}), runs)
        assert raised.value.details == {"field": "continue"}, what
    forged = {
        "edited key": _token_of({**payload, "k": [payload["k"][0], "r-0"]}),
        "damaged": token[:-4] + "AAAA",
        "not base64": "%%%not-a-token%%%",
        "not JSON": base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        "no key": _token_of({"v": 1, "q": payload["q"]}),
        "too long": "A" * 5000,
        "another version": _token_of({**payload, "v": 99}),
    }
    for what, bad in forged.items():
        with pytest.raises(BadRequest) as raised:
            page_of(ListQuery(**{**query.__dict__, "continue_token": bad}), runs)
        assert raised.value.status == 400 and raised.value.details == {"field": "continue"}, what
        assert str(raised.value).startswith("continue: "), what


# -- over a control plane ----------------------------------------------------------------------


async def _plane_with_runs(tmp_path: Path, count: int) -> Plane:
    plane = await make_plane(tmp_path)
    await plane.services.agents.apply_agent("demo", agent_doc("helper"))
    await plane.services.agents.apply_agent("demo", agent_doc("other"))
    await plane.services.groups.apply_group("demo", group_doc("g1", maxCostUSD="1.00"), mode="create")
    for index in range(count):
        # Every third run is of agent "other", but a group's runs (every fifth) use its agent.
        doc = run_doc(f"r-{index:02d}", agent="other" if index % 3 == 0 and index % 5 else "helper")
        doc["metadata"]["labels"] = {"team": "a" if index % 2 else "b", "batch": str(index // 10)}
        if index % 5 == 0:
            doc["spec"]["group"], doc["spec"]["taskKey"] = "g1", f"t{index}"
            doc["metadata"]["name"] = f"g1-t{index}"
        await plane.services.runs.create_run("demo", doc)
    return plane


def _service(plane: Plane) -> ListingService:
    services = plane.services
    return ListingService(services.agents, services.runs, services.groups)


def test_the_service_pages_and_filters_a_projects_runs(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane_with_runs(tmp_path, 30)
        service = _service(plane)
        registry = plane.services.registry
        await until(lambda: plane.run_actors.of("r-07"), what="r-07's actor")  # nothing moves it after
        registry.runs[("demo", "r-07")]["status"]["phase"] = "Failed"  # as a report would
        all_runs = [run for (project, _), run in registry.runs.items() if project == "demo"]
        seen: list[str] = []
        token = ""
        while True:
            page = await service.page(ListQuery(ListKind.AGENT_RUNS, "demo", limit=7, continue_token=token))
            seen += _names(page.items)
            if not page.continue_token:
                break
            token = page.continue_token
        assert sorted(seen) == sorted(_names(all_runs)) and len(seen) == 30

        async def names(**query: Any) -> set[str]:
            page = await service.page(ListQuery(ListKind.AGENT_RUNS, "demo", **query))
            return set(_names(page.items))

        team_a = {run["metadata"]["name"] for run in all_runs if run["metadata"]["labels"]["team"] == "a"}
        assert await names(label_selector="team=a") == team_a
        assert await names(label_selector="team=a,batch in (0)") == {"r-01", "r-03", "g1-t5", "r-07", "r-09"}
        assert await names(field_selector="status.phase=Failed") == {"r-07"}
        assert await names(field_selector="spec.group=g1") == {f"g1-t{i}" for i in range(0, 30, 5)}
        assert await names(group="g1", label_selector="team=b") == {"g1-t0", "g1-t10", "g1-t20"}
        assert await names(
            field_selector="spec.agent=other,status.phase!=Failed", label_selector="batch=2"
        ) == {
            "r-21",
            "r-24",
            "r-27",
        }
        created = sorted(run["metadata"]["creationTimestamp"] for run in all_runs)
        after = await names(field_selector=f"metadata.creationTimestamp>={created[20]}")
        assert len(after) == 10
        # Agents and groups page and select too.
        agents = await service.page(ListQuery(ListKind.AGENTS, "demo", field_selector="metadata.name!=other"))
        assert _names(agents.items) == ["helper"]
        groups = await service.page(
            ListQuery(ListKind.AGENT_GROUPS, "demo", field_selector="status.phase=Running")
        )
        assert _names(groups.items) == ["g1"]

    asyncio.run(scenario())


def test_a_bad_selector_is_refused_before_any_run_is_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        calls: list[str] = []

        class Runs:
            async def list_runs(self, *args: Any) -> list[dict[str, Any]]:
                calls.append("list_runs")
                return []

        service = ListingService(plane.services.agents, Runs(), plane.services.groups)  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="supported: status.phase"):
            await service.page(ListQuery(ListKind.AGENT_RUNS, "demo", field_selector="status.foo=1"))
        assert calls == []

    asyncio.run(scenario())


# -- through the API ---------------------------------------------------------------------------

TOKEN = "nodus_test_reader"
BASE = "/v1/projects/demo"


def _api(plane: Plane) -> httpx.AsyncClient:
    service = _service(plane)

    async def call(method: str, *args: Any) -> Any:
        if method == "authenticate":
            ok = args[0] == token_digest(TOKEN)
            return {"name": "reader", "project": "demo", "role": "read", "expiresAt": None} if ok else None
        assert method == "list_page", method  # the list routes make this one call
        return await service.page(*args)

    transport = httpx.ASGITransport(app=create_app(client_over(call)))
    return httpx.AsyncClient(
        transport=transport, base_url="http://api", headers={"Authorization": f"Bearer {TOKEN}"}
    )


def test_the_api_answers_pages_as_kubernetes_lists_and_refuses_bad_input_with_400(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await _plane_with_runs(tmp_path, 12)
        async with _api(plane) as http:
            first = (
                await http.get(f"{BASE}/agentruns", params={"limit": "5", "labelSelector": "team=a"})
            ).json()
            assert first["apiVersion"] == "nodus.dev/v1" and first["kind"] == "AgentRunList"
            assert first["metadata"]["remainingItemCount"] == 1 and len(first["items"]) == 5
            rest = await http.get(
                f"{BASE}/agentruns",
                params={"limit": "5", "labelSelector": "team = a", "continue": first["metadata"]["continue"]},
            )
            body = rest.json()
            assert body["metadata"] == {"remainingItemCount": 0} and len(body["items"]) == 1
            whole = (await http.get(f"{BASE}/agentruns")).json()
            assert whole["metadata"] == {} and len(whole["items"]) == 12  # the old answer, unpaged
            legacy = (await http.get(f"{BASE}/agentruns", params={"agent": "other"})).json()
            assert set(_names(legacy["items"])) == {"r-03", "r-06", "r-09"}
            groups = (
                await http.get(f"{BASE}/agentgroups", params={"fieldSelector": "status.phase=Running"})
            ).json()
            assert groups["kind"] == "AgentGroupList" and _names(groups["items"]) == ["g1"]
            agents = (await http.get(f"{BASE}/agents", params={"limit": "1"})).json()
            assert agents["kind"] == "AgentList" and agents["metadata"]["remainingItemCount"] == 1

            refusals = {
                "labelSelector": {"labelSelector": "a=b=c"},
                "fieldSelector": {"fieldSelector": "status.foo=x"},
                "limit": {"limit": "0"},
                "continue": {"limit": "5", "continue": "forged"},
            }
            for field, params in refusals.items():
                answer = await http.get(f"{BASE}/agentruns", params=params)
                assert answer.status_code == 400, (field, answer.text)
                refusal = answer.json()
                assert set(refusal) == {"code", "message", "details"} and refusal["code"] == "Invalid"
                assert refusal["details"] == {"field": field} and refusal["message"].startswith(f"{field}: ")
            other = await http.get(
                f"{BASE}/agentgroups", params={"limit": "5", "continue": first["metadata"]["continue"]}
            )
            assert other.status_code == 400 and "another query" in other.json()["message"]
            unsupported = (
                await http.get(f"{BASE}/agentgroups", params={"fieldSelector": "spec.group=g"})
            ).json()
            assert "supported: status.phase, status.reason, spec.agent" in unsupported["message"]

    asyncio.run(scenario())
