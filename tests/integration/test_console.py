"""The web console in a real browser (headless Chromium): groups, runs and a run's detail, read
from the API by the page's own JavaScript."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from .browser import Browser
from .conftest import Server, unique, wait_for
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
    # Filtered by the agent: the session's other tests make more runs than one page holds.
    page = _chromium("--dump-dom", url=_link(server, agent=finished_work["agent"]))
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


# -- the pages people look at: timeline, transcript, cost, histograms, pages of runs (decision 63)


def _ms(stamp: str) -> int:
    """An API timestamp in whole milliseconds, as the page's Date.parse reads it."""
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return int(moment.timestamp() * 1000)


def _api(server: Server, path: str, **params: str) -> Any:
    with server.http() as http:
        response = http.get(f"/v1/projects/default/{path}", params=params)
        assert response.status_code == 200, response.text
        return response.json()


def _page(server: Server, browser: Browser, **params: str) -> None:
    browser.open(_link(server, **params))


def _shot(browser: Browser, path: Path) -> set[tuple[int, int, int]]:
    """A screenshot of the whole page, kept beside the test's other files; its colours."""
    from PIL import Image

    browser.screenshot(path, full_page=True)
    image = Image.open(path).convert("RGB")
    colors = image.getcolors(maxcolors=image.size[0] * image.size[1])
    assert colors is not None and len(colors) > 50, f"{path.name}: the page rendered, not a blank screen"
    return {color for _, color in colors}


BARS = """[...document.querySelectorAll('#timeline rect.bar')].map((r) => ({
  step: r.dataset.step, x: +r.getAttribute('x'), width: +r.getAttribute('width'),
  running: r.classList.contains('running')}))"""


def test_a_runs_timeline_draws_one_bar_per_step_as_long_as_the_step_took(
    server: Server, finished_work: Any, tmp_path: Path
) -> None:
    steps = [s for s in _api(server, f"agentruns/{finished_work['run']}/steps")["items"] if s["startedAt"]]
    with Browser(WIDTH, HEIGHT) as browser:
        _page(server, browser, run=finished_work["run"])
        bars = browser.wait_for(
            f"(() => {{ const b = {BARS}; return b.length === {len(steps)} && b; }})()",
            what="a bar for each of the run's steps",
        )
        axis = browser.evaluate(
            "(() => { const a = document.querySelector('#timeline line.time-axis');"
            " return [+a.getAttribute('x1'), +a.getAttribute('x2')]; })()"
        )
        pixels = _shot(browser, tmp_path / "run-timeline.png")
        assert not browser.console_errors, browser.console_errors
    assert [bar["step"] for bar in bars] == [step["id"] for step in steps]  # in the order they began
    start = min(_ms(s["startedAt"]) for s in steps)
    end = max(_ms(s["finishedAt"] or s["startedAt"]) for s in steps)
    per_ms = (axis[1] - axis[0]) / (end - start)  # the axis spans the first start to the last end
    for bar, step in zip(bars, steps, strict=True):
        began, ended = _ms(step["startedAt"]), _ms(step["finishedAt"] or step["startedAt"])
        assert not bar["running"]
        assert abs(bar["x"] - (axis[0] + (began - start) * per_ms)) <= 1.0, (bar, step)
        assert abs(bar["width"] - (ended - began) * per_ms) <= 1.0, (bar, step)
    longest = max(steps, key=lambda s: _ms(s["finishedAt"]) - _ms(s["startedAt"]))
    assert max(bars, key=lambda b: b["width"])["step"] == longest["id"]
    # Model calls in the console's purple (#7f56d9), commands in its teal (#0e9384).
    assert (127, 86, 217) in pixels and (14, 147, 132) in pixels, (
        "the steps' kinds are drawn in their colours"
    )


def test_a_runs_transcript_shows_the_prompt_replies_and_commands_with_their_output_folded(
    server: Server, finished_work: Any, tmp_path: Path
) -> None:
    run = _api(server, f"agentruns/{finished_work['run']}")
    steps = _api(server, f"agentruns/{finished_work['run']}/steps")["items"]
    command = next(s for s in steps if s["kind"] == "command")
    replies = [
        block["text"]
        for s in steps
        if s["kind"] == "model"
        for block in s["detail"]["result"]["content"]
        if block["type"] == "text"
    ]
    assert command["detail"]["command"] == "echo shown" and replies
    with Browser(WIDTH, HEIGHT) as browser:
        _page(server, browser, run=finished_work["run"])
        shown = browser.wait_for(
            "(() => { const t = document.getElementById('transcript');"
            " return t.children.length > 3 && [...t.children].map((li) => [li.className, li.innerText]); })()",
            what="the transcript",
        )
        fold = f"#transcript details[data-step='{command['id']}']"
        assert browser.evaluate(f'document.querySelector("{fold}").open') is False, "the output starts folded"
        assert browser.evaluate(f'document.querySelector("{fold} pre").checkVisibility()') is False
        browser.click(f"{fold} > summary")
        output = browser.wait_for(
            f'(() => {{ const d = document.querySelector("{fold}");'
            f" return d.open && d.querySelector('pre').checkVisibility() && d.querySelector('pre').textContent; }})()",
            what="the command's output to unfold",
        )
        _shot(browser, tmp_path / "run-transcript.png")
        assert not browser.console_errors, browser.console_errors
    kinds = [kind for kind, _ in shown]
    prompt = next(text for kind, text in shown if kind == "prompt")
    assert prompt.endswith(run["spec"]["input"])
    said = "\n".join(text for kind, text in shown if kind == "reply")
    assert all(reply in said for reply in replies), (replies, said)
    assert kinds.index("prompt") < kinds.index("reply") < kinds.index("command")
    assert output == command["detail"]["result"]["output"] == "shown\n"


def test_a_runs_cost_over_time_climbs_to_its_cost_under_the_cap_line(
    server: Server, finished_work: Any, tmp_path: Path
) -> None:
    run = _api(server, f"agentruns/{finished_work['run']}")
    steps = _api(server, f"agentruns/{finished_work['run']}/steps")["items"]
    costly = sorted((s for s in steps if Decimal(s["costUSD"]) > 0), key=lambda s: _ms(s["finishedAt"]))
    cost = run["status"]["cost"]
    with Browser(WIDTH, HEIGHT) as browser:
        _page(server, browser, run=finished_work["run"])
        chart = browser.wait_for(
            "(() => { const c = document.querySelector('#cost-chart svg'); const cap = c && c.querySelector('line.cap');"
            " if (!cap) return null; const base = c.querySelector('line.baseline');"
            " return {cap: cap.dataset.usd, capY: +cap.getAttribute('y1'), baseY: +base.getAttribute('y1'),"
            " points: [...c.querySelectorAll('circle.point')].map((p) => [p.dataset.step, p.dataset.usd, +p.getAttribute('cy')])}; })()",
            what="the cost chart with its cap",
        )
        pixels = _shot(browser, tmp_path / "run-cost.png")
    assert chart["cap"] == cost["limitUSD"]
    assert Decimal(cost["limitUSD"]) == Decimal("0.10")  # the agent's perRunMaxCostUSD (kit.agent)
    assert [step for step, _, _ in chart["points"]] == [s["id"] for s in costly]
    running = Decimal(0)
    for (_, usd, y), step in zip(chart["points"], costly, strict=True):
        running += Decimal(step["costUSD"])
        assert Decimal(usd) == running
        height = (chart["baseY"] - chart["capY"]) * float(running / Decimal(cost["limitUSD"]))
        assert abs((chart["baseY"] - y) - height) <= 1.0, "a point's height is its spend on the cap's scale"
    assert running == Decimal(cost["totalUSD"]), "the chart ends at the run's model spend"
    assert any(r > 150 and g < 80 and b < 80 for r, g, b in pixels), "the cap line is drawn in red"


def test_a_running_steps_bar_grows_until_it_ends(server: Server, finished_work: Any, tmp_path: Path) -> None:
    name = unique("console-live")
    with server.http() as http:
        created = http.post(
            RUNS,
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": finished_work["agent"], "input": "Use the shell to run `sleep 60`"},
            },
        )
        assert created.status_code == 201, created.text
    running = "(() => { const r = document.querySelector('#timeline rect.bar.running'); return r && +r.getAttribute('width'); })()"
    with Browser(WIDTH, HEIGHT) as browser:
        _page(server, browser, run=name)
        first = browser.wait_for(
            f"(() => {{ const w = {running}; return w > 0 && w; }})()", what="a running bar", timeout=120
        )
        browser.wait_for(f"{running} > {first} + 20", what="the running bar to grow", timeout=60)
        _shot(browser, tmp_path / "run-live.png")
        with server.http() as http:
            assert http.post(f"{RUNS}/{name}/cancel").status_code == 200
        browser.wait_for(
            "document.getElementById('detail-phase').textContent.startsWith('Cancelled')"
            " && !document.querySelector('#timeline rect.bar.running')",
            what="the cancelled run's bar to stop",
            timeout=120,
        )


def _histogram(browser: Browser, figure: str) -> list[int]:
    return list(
        browser.evaluate(f"[...document.querySelectorAll('#{figure} rect.bin')].map((r) => +r.dataset.count)")
    )


def test_a_groups_page_shows_histograms_of_its_runs_and_the_pass_rate_with_its_interval(
    server: Server, finished_work: Any, tmp_path: Path
) -> None:
    name = unique("ch")
    group(
        server,
        name,
        finished_work["agent"],
        evaluation={"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 4, "seed": 7},
    )
    evaluation = finished(server, name)["status"]["evaluation"]
    runs = _api(server, "agentruns", fieldSelector=f"spec.group={name}")["items"]
    assert len(runs) == 4
    stats = (evaluation.get("statistics") or {}).get("passRate")
    assert stats and stats.get("ci95"), f"issue 20 item 5's statistics are missing: {evaluation}"
    with Browser(WIDTH, HEIGHT) as browser:
        _page(server, browser, group=name)
        browser.wait_for(
            "document.querySelectorAll('#duration-histogram rect.bin').length > 0"
            " && document.querySelectorAll('#cost-histogram rect.bin').length > 0"
            " && document.getElementById('pass-rate-interval') !== null",
            what="the group's histograms and pass rate",
        )
        durations, costs = _histogram(browser, "duration-histogram"), _histogram(browser, "cost-histogram")
        heights = browser.evaluate(
            "[...document.querySelectorAll('#cost-histogram rect.bin')].map((r) => +r.getAttribute('height'))"
        )
        interval = browser.evaluate(
            "(() => { const l = document.querySelector('#pass-rate-figure line.interval');"
            " const e = document.querySelector('#pass-rate-figure circle.estimate');"
            " return [+l.dataset.lo, +l.dataset.hi, +e.dataset.value,"
            " document.getElementById('pass-rate-interval').textContent]; })()"
        )
        dom = browser.evaluate("document.body.innerText")
        _shot(browser, tmp_path / "group.png")
        assert not browser.console_errors, browser.console_errors
    ran = [run for run in runs if run["status"].get("startedAt") and run["status"].get("finishedAt")]
    assert sum(durations) == len(ran) == 4
    assert sum(costs) == 4
    tallest = max(heights)
    for count, height in zip(costs, heights, strict=True):
        assert abs(height - tallest * count / max(costs)) <= 0.05, "a bar's height is its count"
    low, high = stats["ci95"]
    assert interval[:3] == [low, high, stats["value"]]
    assert f"95% interval {low * 100:.1f}% to {high * 100:.1f}%" in interval[3]
    assert f"pass rate {stats['value'] * 100:.1f}%" in interval[3]
    assert f"{evaluation['passed']}/4 pass" in dom


def _rows(browser: Browser) -> list[str]:
    return list(browser.evaluate("[...document.querySelectorAll('#runs tr')].map((r) => r.dataset.name)"))


def test_the_project_page_filters_runs_by_phase_and_labels_and_pages_through_them(
    server: Server, finished_work: Any, tmp_path: Path
) -> None:
    honoured = _api(server, "agentruns", labelSelector="console-nothing=here")
    assert honoured["items"] == [], "needs the list API's selectors (issue 20 item 6)"
    agent_name = unique("console-pages")
    agent(server, agent_name)
    names = [f"{agent_name}-{i}" for i in range(3)]
    with server.http() as http:
        for i, run_name in enumerate(names):
            spec = {
                "agent": agent_name,
                "input": "Use the shell to run `sleep 60`" if i == 2 else f"What is {i} + 1?",
            }
            body = {
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": run_name, "labels": {"tier": f"t{i % 2}"}},
                "spec": spec,
            }
            assert http.post(RUNS, json=body).status_code == 201
        assert http.post(f"{RUNS}/{names[2]}/cancel").status_code == 200
    for run_name, phase in zip(names, ["Succeeded", "Succeeded", "Cancelled"], strict=True):
        wait_for(
            lambda n=run_name, p=phase: _api(server, f"agentruns/{n}")["status"]["phase"] == p,
            timeout=120,
            message=f"{run_name} {phase}",
        )
    with server.http() as http:
        refused = http.get(RUNS, params={"labelSelector": "tier in (t0"})
    assert refused.status_code == 400

    with Browser(WIDTH, HEIGHT) as browser:
        _page(server, browser, agent=agent_name, limit="2")
        first = browser.wait_for(
            "(() => { const r = [...document.querySelectorAll('#runs tr')].map((r) => r.dataset.name);"
            " return r.length === 2 && !document.getElementById('page-next').disabled && r; })()",
            what="page 1 of 2",
        )
        assert browser.evaluate("document.getElementById('page-prev').disabled") is True
        browser.click("#page-next")
        second = browser.wait_for(
            "(() => { const r = [...document.querySelectorAll('#runs tr')].map((r) => r.dataset.name);"
            " return r.length === 1 && document.getElementById('page-next').disabled && r; })()",
            what="page 2, the last",
        )
        assert "continue=" in browser.evaluate("location.search")
        assert sorted(first + second) == sorted(names)
        browser.click("#page-prev")
        again = browser.wait_for(
            "(() => { const r = [...document.querySelectorAll('#runs tr')].map((r) => r.dataset.name);"
            " return r.length === 2 && !location.search.includes('continue=') && r; })()",
            what="page 1 again",
        )
        assert again == first
        browser.evaluate(
            "(() => { const s = document.getElementById('f-phase'); s.value = 'Cancelled';"
            " s.dispatchEvent(new Event('change')); })()"
        )
        cancelled = browser.wait_for(
            "(() => { const r = [...document.querySelectorAll('#runs tr')].map((r) => r.dataset.name);"
            " return r.length === 1 && location.search.includes('phase=Cancelled') && r; })()",
            what="the Cancelled run alone",
        )
        assert cancelled == [names[2]]
        _shot(browser, tmp_path / "project-filtered.png")
        # Typed and submitted in one go: the page's refresh sets the form from the address
        # while nothing in the form has the focus.
        browser.evaluate(
            "document.getElementById('f-phase').value = ''; document.getElementById('f-labels').value = 'tier=t0';"
            " document.querySelector('#filters button[type=submit]').click()"
        )
        labelled = browser.wait_for(
            "(() => { const r = [...document.querySelectorAll('#runs tr')].map((r) => r.dataset.name);"
            " return location.search.includes('labels=tier') && r.length === 2 && r; })()",
            what="the runs labelled tier=t0",
        )
        assert sorted(labelled) == [names[0], names[2]]
        browser.evaluate(
            "document.getElementById('f-labels').value = 'tier in (t0';"
            " document.querySelector('#filters button[type=submit]').click()"
        )
        shown = browser.wait_for(
            "(() => { const e = document.getElementById('runs-error'); return !e.hidden && e.textContent; })()",
            what="the server's refusal of the selector",
        )
        assert shown == refused.json()["message"]
        assert _rows(browser) == []
        _shot(browser, tmp_path / "project-refused.png")
        assert not browser.console_errors, browser.console_errors
