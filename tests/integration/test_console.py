"""The web console in a real browser (headless Chromium): groups, runs and a run's detail, read
from the API by the page's own JavaScript."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import Server, unique
from .kit import RUNS, V1, agent, batch, finished, group, member, seal
from .test_events import _read

WIDTH, HEIGHT = 1280, 1000


def _chromium(*args: str, url: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed: `make test` installs it with apt (browser-deps)")
    return subprocess.run(
        [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={WIDTH},{HEIGHT}",
            "--virtual-time-budget=10000",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _link(server: Server, **params: str) -> str:
    """The console link `nodus console` prints (it carries the CLI's token), with ``params`` added."""
    printed = server.cli("console", "-p", "default")
    assert printed.returncode == 0, printed.stderr
    link, _, token = printed.stdout.strip().partition("#")
    assert token == f"token={server.token}"
    return f"{link}{''.join(f'&{key}={value}' for key, value in params.items())}#{token}"


@pytest.fixture(scope="module")
def finished_work(server: Server) -> dict[str, Any]:
    agent_name, group_name, run_name = unique("console"), unique("gc"), unique("console-run")
    agent(server, agent_name)
    group(server, group_name, agent_name, limits={"maxActive": 2}, maxCostUSD="0.50")
    assert (
        batch(
            server, [member(group_name, agent_name, f"q{i}", f"What is {i} + {i}?") for i in range(2)]
        ).status_code
        == 201
    )
    seal(server, group_name)
    with server.http() as http:
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"name": run_name},
                    "spec": {"agent": agent_name, "input": "Use the shell to run `echo shown`"},
                },
            ).status_code
            == 201
        )
    finished(server, group_name)
    assert _read(server, run_name)[-1]["data"]["phase"] == "Succeeded"
    return {"agent": agent_name, "group": group_name, "run": run_name}


def test_the_console_lists_groups_and_runs_with_phase_model_and_cost(
    server: Server, finished_work: Any
) -> None:
    page = _chromium("--dump-dom", url=_link(server))
    assert page.returncode == 0, page.stderr[-2000:]
    dom = page.stdout
    group_name, run_name = finished_work["group"], finished_work["run"]
    assert f'<td>{group_name}</td><td class="phase-Succeeded">Succeeded</td><td>2/2</td>' in dom
    assert (
        f'<td>{run_name}</td><td>{finished_work["agent"]}</td><td class="phase-Succeeded">Succeeded</td>'
        in dom
    )
    assert "<td>offline-haiku</td>" in dom and f"{group_name}-q1" in dom


def test_a_runs_page_shows_its_turns_answer_and_steps_and_the_screenshot_shows_them(
    server: Server,
    finished_work: Any,
    tmp_path: Path,
) -> None:
    from PIL import Image

    url = _link(server, run=finished_work["run"])
    page = _chromium("--dump-dom", url=url)
    assert page.returncode == 0, page.stderr[-2000:]
    with server.http() as http:
        answer = http.get(f"{RUNS}/{finished_work['run']}/answer").json()["answer"]
    assert f'<pre id="answer" class="">{answer}</pre>' in page.stdout
    assert "<td>turn-1/command-1-1</td><td>command</td>" in page.stdout
    assert '<span id="detail-phase" class="phase-Succeeded">Succeeded (Completed)</span>' in page.stdout

    shot = tmp_path / "console.png"
    taken = _chromium(f"--screenshot={shot}", url=url)
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    colors = image.getcolors(maxcolors=WIDTH * HEIGHT)
    assert colors is not None and len(colors) > 50, "the page rendered text, not a blank screen"
    pixels = {color for _, color in colors}
    assert (16, 24, 40) in pixels, "the header bar is drawn"
    # The phase "Succeeded" is drawn in the console's green (antialiased text near #067647).
    assert any(r < 60 and 90 < g < 140 and 50 < b < 100 for r, g, b in pixels), "a phase is shown in green"


def test_without_a_token_the_console_asks_for_one_and_shows_nothing(
    server: Server, finished_work: Any
) -> None:
    page = _chromium("--dump-dom", url=f"{server.api_url}/console?project=default")
    assert page.returncode == 0, page.stderr[-2000:]
    assert '<form id="login">' in page.stdout  # no longer hidden
    assert finished_work["run"] not in page.stdout and finished_work["group"] not in page.stdout


def test_an_evaluation_groups_results_view_shows_its_cases_and_rates(
    server: Server, finished_work: Any
) -> None:
    name = unique("ce")
    group(
        server,
        name,
        finished_work["agent"],
        evaluation={"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 3, "seed": 42},
    )
    evaluation = finished(server, name)["status"]["evaluation"]
    page = _chromium("--dump-dom", url=_link(server, group=name))
    assert page.returncode == 0, page.stderr[-2000:]
    dom = page.stdout
    assert f"{evaluation['passed']}/3 pass" in dom  # the groups list
    rate = f"{evaluation['passRate'] * 100:.1f}%"
    assert (
        f"pass rate {rate}, mean reward {evaluation['meanReward']:.3f}; 3 scored, 0 pending, 0 unscored"
        in dom
    )
    for index in range(3):
        assert (
            f'<td>test-00{index}</td><td>{name}-test-00{index}</td><td class="state-Scored">Scored</td>'
            in dom
        )
