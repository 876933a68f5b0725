"""Selectors and pages from the SDK and the CLI, without a server.

The transport is an httpx MockTransport whose list answers come from the control plane's own
paging function (`control.listing.page_of`) over thousands of runs in memory, so the client side
is checked against the real paging and token rules: what is sent, how many requests, that every
run comes back once, and that a bad selector is refused before anything is sent.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import nodus
from nodus.cli import main as cli
from nodus.cli import root as cli_root
from nodus.client import Client
from nodus.config import Settings
from nodus.errors import BadRequest, Invalid, NodusError
from nodus_ray.control.list_query import ListKind, ListQuery
from nodus_ray.control.listing import page_of

START = datetime(2026, 12, 3, 11, 0, tzinfo=UTC)
PHASES = ("Succeeded", "Failed", "Running")


def _run(index: int) -> dict[str, Any]:
    created = (START + timedelta(seconds=index)).isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {
            "name": f"r-{index:04d}",
            "creationTimestamp": created,
            "labels": {"team": "a" if index % 2 else "b", "env": "prod" if index % 3 == 0 else "dev"},
        },
        "spec": {"agent": "helper", "group": "g1" if index % 4 == 0 else None},
        "status": {"phase": PHASES[index % 3]},
    }


class PagingAPI:
    """``GET .../agentruns`` answered by `page_of`, as the control plane would; every request kept."""

    def __init__(self, count: int) -> None:
        self.runs = [_run(index) for index in range(count)]
        self.requests: list[dict[str, str]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        self.requests.append(params)
        assert request.url.path == "/v1/projects/default/agentruns", request.url.path
        try:
            limit = int(params["limit"]) if "limit" in params else None
            query = ListQuery(
                ListKind.AGENT_RUNS,
                "default",
                label_selector=params.get("labelSelector", ""),
                field_selector=params.get("fieldSelector", ""),
                limit=limit,
                continue_token=params.get("continue", ""),
            )
            page = page_of(query, self.runs)
        except NodusError as error:
            return httpx.Response(error.status, json=error.to_dict())
        body = {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRunList",
            "metadata": page.metadata(),
            "items": page.items,
        }
        return httpx.Response(200, json=body)

    def client(self) -> Client:
        return Client(
            settings=Settings(api_url="http://nodus.test"), transport=httpx.MockTransport(self.handle)
        )

    def names(self, keep: Any) -> list[str]:
        return [run["metadata"]["name"] for run in self.runs if keep(run)]


# -- SDK ---------------------------------------------------------------------------------------


def test_iter_runs_pages_through_thousands_and_returns_each_match_once() -> None:
    api = PagingAPI(1234)
    client = api.client()
    names = [run["metadata"]["name"] for run in client.iter_runs(labels={"team": "a"}, page_size=100)]
    assert names == api.names(lambda run: run["metadata"]["labels"]["team"] == "a")
    assert len(api.requests) == 7  # 617 matches, 100 a page
    assert all(request["limit"] == "100" and request["labelSelector"] == "team=a" for request in api.requests)
    assert "continue" not in api.requests[0] and all("continue" in request for request in api.requests[1:])


def test_iter_runs_turns_its_keywords_into_one_field_selector() -> None:
    api = PagingAPI(300)
    client = api.client()
    after = START + timedelta(seconds=99)
    found = list(
        client.iter_runs(
            labels="env in (prod),team!=a",
            phase="Succeeded",
            group="g1",
            created_after=after,
            created_before="2026-12-03T11:04:00Z",
        )
    )
    sent = api.requests[0]
    assert sent["fieldSelector"] == (
        "status.phase=Succeeded,spec.group=g1,metadata.creationTimestamp>2026-12-03T11:01:39Z,"
        "metadata.creationTimestamp<2026-12-03T11:04:00Z"
    )
    assert sent["labelSelector"] == "env in (prod),team!=a" and sent["limit"] == "500"
    expected = api.names(
        lambda run: (
            run["status"]["phase"] == "Succeeded"
            and run["spec"]["group"] == "g1"
            and run["metadata"]["labels"] == {"env": "prod", "team": "b"}
            and 99 < int(run["metadata"]["name"][2:]) < 240
        )
    )
    assert [run["metadata"]["name"] for run in found] == expected and expected


def test_list_page_returns_the_token_and_list_takes_the_selectors() -> None:
    api = PagingAPI(30)
    client = api.client()
    page = client.list_page("agentruns", label_selector="team=a", limit=7)
    assert len(page.items) == 7 and page.remaining_item_count == 8 and page.continue_
    following = client.list_page("agentruns", label_selector="team=a", limit=7, continue_=page.continue_)
    assert following.items[0]["metadata"]["name"] == "r-0015"
    items = client.list("agentruns", field_selector="status.phase=Running", limit=3)
    assert [item["metadata"]["name"] for item in items] == ["r-0002", "r-0005", "r-0008"]
    with pytest.raises(BadRequest, match="belongs to another query") as raised:
        client.list_page("agentruns", label_selector="team=b", limit=7, continue_=page.continue_)
    assert raised.value.details == {"field": "continue"}  # the server's refusal, rebuilt


def test_a_bad_selector_or_limit_is_refused_before_anything_is_sent() -> None:
    api = PagingAPI(10)
    client = api.client()
    for call, field in (
        (lambda: client.list("agentruns", label_selector="a=b=c"), "labelSelector"),
        (lambda: client.list("agentruns", field_selector="status.phase=Runing"), "fieldSelector"),
        (lambda: client.list("agentruns", field_selector="spec.model=x"), "fieldSelector"),
        (lambda: client.list("agentruns", limit=0), "limit"),
        (lambda: client.list("agentruns", limit=1001), "limit"),
        (lambda: client.iter_runs(labels="team in (a"), "labelSelector"),
        (lambda: client.iter_runs(page_size=5000), "page_size"),
    ):
        with pytest.raises(BadRequest) as raised:
            call()
        assert raised.value.details == {"field": field}
    with pytest.raises(Invalid, match="take no selectors"):
        client.list("secrets", label_selector="a=b")
    with pytest.raises(Invalid, match="time zone"):
        client.iter_runs(created_after=datetime(2026, 1, 1))
    assert api.requests == []


def test_nodus_list_runs_gives_handles_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    api = PagingAPI(50)
    runs = nodus.list_runs(phase="Succeeded", labels={"team": "b"}, limit=4, client=api.client())
    assert [run.name for run in runs] == ["r-0000", "r-0006", "r-0012", "r-0018"]
    assert api.requests[0]["limit"] == "4" and len(api.requests) == 1  # no more asked for than wanted
    assert all(isinstance(run, nodus.AgentRun) for run in runs)
    assert [run.name for run in nodus.iter_runs(reason="x", client=api.client())] == []
    with pytest.raises(Invalid, match="limit"):
        nodus.list_runs(limit=0, client=api.client())


# -- CLI ---------------------------------------------------------------------------------------


@pytest.fixture()
def paging(monkeypatch: pytest.MonkeyPatch) -> PagingAPI:
    api = PagingAPI(1234)
    monkeypatch.setattr(cli_root, "client", lambda project=None: api.client())
    return api


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli.app, list(args))


def test_get_without_limit_pages_in_chunks_of_500_and_prints_every_match(paging: PagingAPI) -> None:
    result = invoke(
        "get", "agentruns", "-l", "team=a,env!=prod", "--field-selector", "status.phase=Failed", "-o", "name"
    )
    assert result.exit_code == 0, result.output
    expected = paging.names(
        lambda run: (
            run["metadata"]["labels"] == {"team": "a", "env": "dev"} and run["status"]["phase"] == "Failed"
        )
    )
    assert result.stdout.splitlines() == [f"agentrun/{name}" for name in expected]
    assert [request["limit"] for request in paging.requests] == ["500"]  # 137 matches: one page
    everything = invoke("get", "ar", "-o", "name")
    assert len(everything.stdout.splitlines()) == 1234
    assert [request["limit"] for request in paging.requests[1:]] == ["500", "500", "500"]


def test_get_with_limit_prints_one_page_and_the_token_on_stderr(paging: PagingAPI) -> None:
    first = invoke("get", "ar", "-l", "team=b", "--limit", "50")
    assert first.exit_code == 0, first.output
    rows = first.stdout.splitlines()
    assert rows[0].split()[:3] == ["NAME", "AGENT", "PHASE"] and len(rows) == 51
    (line,) = first.stderr.splitlines()
    assert line.startswith("567 more; next page: --continue ")
    token = line.rsplit(" ", 1)[1]
    second = invoke("get", "ar", "-l", "team=b", "--limit", "50", "--continue", token, "-o", "json")
    document = json.loads(second.stdout)
    assert document["kind"] == "AgentRunList" and document["metadata"]["remainingItemCount"] == 517
    assert document["items"][0]["metadata"]["name"] == "r-0100" and document["metadata"]["continue"]
    assert paging.requests[-1] == {"labelSelector": "team=b", "limit": "50", "continue": token}


def test_other_paths_are_still_checked_by_the_cli(paging: PagingAPI) -> None:
    result = invoke("get", "ar", "--field-selector", "metadata.labels.team=a,spec.group=g1", "-o", "name")
    assert result.exit_code == 0, result.output
    assert paging.requests[0] == {"fieldSelector": "spec.group=g1", "limit": "500"}  # the server's part
    assert result.stdout.splitlines() == []  # g1's runs are every fourth: even, so team b
    result = invoke("get", "ar", "--field-selector", "metadata.labels.team=b,spec.group=g1", "-o", "name")
    assert len(result.stdout.splitlines()) == 309


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-l", "a=b=c"], "error: Invalid: --selector: 'a=b=c' does not parse"),
        (
            ["--field-selector", "status.phase=Runing"],
            "error: Invalid: --field-selector: 'status.phase=Runing'",
        ),
        (
            ["--field-selector", "spec.agent>x"],
            "error: Invalid: --field-selector: 'spec.agent>x': spec.agent takes =",
        ),
        (
            ["--field-selector", "spec.model.name>x"],
            "error: UsageError: --field-selector 'spec.model.name>x': only",
        ),
        (["--limit", "0"], "error: Invalid: --limit: 0 is out of range; a page holds 1 to 1000 items"),
    ],
)
def test_a_bad_selector_is_one_error_line_and_a_nonzero_exit_with_nothing_sent(
    paging: PagingAPI, args: list[str], says: str
) -> None:
    result = invoke("get", "ar", *args)
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), result.stderr
    assert paging.requests == []


def test_a_forged_token_is_the_servers_one_error_line(paging: PagingAPI) -> None:
    result = invoke("get", "ar", "--limit", "5", "--continue", "forged")
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("error: Invalid: continue: the token is damaged")
    assert len(result.stderr.strip().splitlines()) == 1
