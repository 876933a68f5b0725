"""`nodus batch run` and the `ray job submit` example: a file of tasks in, one row per task out,
resumable without running a finished task again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from nodus.batch import batch_group_name, read_rows

from .conftest import NODUS, Server, unique, wait_for
from .kit import agent, get_group, runs_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "batch"


def _tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def test_a_batch_runs_from_a_file_into_parquet_and_running_it_again_runs_nothing_twice(
    server: Server,
    tmp_path: Path,
) -> None:
    worker = unique("batch")
    agent(server, worker)
    tasks = _tasks(
        tmp_path / "tasks.jsonl",
        [
            {"key": "add", "input": "What is 19 + 23?"},
            {"key": "mul", "input": "What is 6 * 7?"},
            {"key": "both", "input": "What is 84 / 2?", "depends_on": ["add", "mul"]},
        ],
    )
    out = tmp_path / "answers.parquet"
    done = server.cli(
        "batch",
        "run",
        str(tasks),
        "--agent",
        worker,
        "--out",
        str(out),
        "--max-active",
        "2",
        "--max-cost",
        "0.50",
    )
    assert done.returncode == 0, done.stderr
    assert "3 of 3 tasks succeeded" in done.stdout
    assert "3/3 done (0 failed)" in done.stderr, "progress is logged when stderr is not a terminal"
    table = pq.read_table(out)
    assert table.column_names == [
        "key",
        "run",
        "phase",
        "reason",
        "answer",
        "cost_usd",
        "model",
        "turns",
        "queued_seconds",
        "run_seconds",
        "created_at",
        "finished_at",
    ]
    rows = {row["key"]: row for row in table.to_pylist()}
    assert {key: row["answer"] for key, row in rows.items()} == {
        "add": "19 + 23 = 42.",
        "mul": "6 * 7 = 42.",
        "both": "84 / 2 = 42.",
    }
    assert all(row["phase"] == "Succeeded" and row["turns"] == 1 and row["model"] for row in rows.values())
    group = batch_group_name(out)
    assert rows["both"]["created_at"] < rows["both"]["finished_at"]
    before = {run["metadata"]["name"]: run["metadata"]["uid"] for run in runs_of(server, group)}

    again = server.cli("batch", "run", str(tasks), "--agent", worker, "--out", str(out))
    assert again.returncode == 0, again.stderr
    after = {run["metadata"]["name"]: run["metadata"]["uid"] for run in runs_of(server, group)}
    assert after == before, "the same runs: nothing was submitted again"
    assert all(run["status"]["attempts"] == 1 for run in runs_of(server, group))
    assert pq.read_table(out).to_pylist() == table.to_pylist()


def test_an_interrupted_batch_resumes_and_finished_tasks_are_not_run_again(
    server: Server, tmp_path: Path
) -> None:
    worker = unique("resume")
    agent(server, worker)
    tasks = _tasks(
        tmp_path / "tasks.jsonl",
        [
            {"key": f"t{i}", "input": f"Use the shell to run `echo {i} >> ../ran-{i}.txt; sleep 1`"}
            for i in range(6)
        ],
    )
    out = tmp_path / "answers.jsonl"
    group = batch_group_name(out)
    first = subprocess.Popen(
        [NODUS, "batch", "run", str(tasks), "--agent", worker, "--out", str(out), "--max-active", "1"],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test session started in the background inherits SIGINT ignored (a shell does that to
        # background jobs), and Python then never raises KeyboardInterrupt: Ctrl-C as a user's.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(
        lambda: (get_group(server, group).get("status") or {}).get("counts", {}).get("succeeded", 0) >= 2,
        timeout=120,
        message="two tasks to finish before the interruption (the group exists once submitted)",
    )
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode != 0 and "run the same command to resume" in stderr

    resumed = server.cli(
        "batch", "run", str(tasks), "--agent", worker, "--out", str(out), "--max-active", "3"
    )
    assert resumed.returncode == 0, resumed.stderr
    rows = read_rows(out)
    assert sorted(rows) == [f"t{i}" for i in range(6)]
    assert all(row["phase"] == "Succeeded" for row in rows.values())
    runs = runs_of(server, group)
    assert len(runs) == 6 and all(run["status"]["attempts"] == 1 for run in runs), "each task ran once"
    for run in runs:
        steps = [step for step in _steps(server, run["metadata"]["name"]) if step["kind"] == "command"]
        assert len(steps) == 1 and steps[0]["attempts"] == 1
    assert get_group(server, group)["spec"]["limits"]["maxActive"] == 3, "the resumed batch's limit applies"


def _steps(server: Server, name: str) -> list[dict[str, Any]]:
    with server.http() as http:
        return http.get(f"/v1/projects/default/agentruns/{name}/steps").json()["items"]


def test_csv_in_csv_out_and_bad_files_are_refused_in_one_line(server: Server, tmp_path: Path) -> None:
    worker = unique("csv")
    agent(server, worker)
    tasks = tmp_path / "tasks.csv"
    tasks.write_text("key,input,depends_on\none,What is 1 + 1?,\ntwo,What is 2 + 2?,one\n")
    out = tmp_path / "answers.csv"
    done = server.cli("batch", "run", str(tasks), "--agent", worker, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert {key: row["answer"] for key, row in read_rows(out).items()} == {
        "one": "1 + 1 = 2.",
        "two": "2 + 2 = 4.",
    }

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a", "input": "x"}\n{"key": "b", "inptu": "y"}\n')
    for args, message in [
        ((str(bad), "--out", str(tmp_path / "x.parquet")), "bad.jsonl line 2: unknown column 'inptu'"),
        ((str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x.parquet")), "does not exist"),
        ((str(tasks), "--out", str(tmp_path / "x.xlsx")), "must end in .jsonl, .csv or .parquet"),
    ]:
        refused = server.cli("batch", "run", *args, "--agent", worker)
        assert refused.returncode == 1 and message in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    other = server.cli("batch", "run", str(tasks), "--agent", unique("other"), "--out", str(out))
    assert other.returncode == 1 and "runs agent" in other.stderr


def test_the_batch_example_runs_as_a_ray_job_with_progress_in_its_logs(
    server: Server, tmp_path: Path
) -> None:
    out = tmp_path / "job-answers.parquet"
    worker = unique("job-worker")
    runtime_env = json.dumps({"env_vars": {"NODUS_API_URL": server.api_url, "NODUS_PROJECT": "default"}})
    job = subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "job",
            "submit",
            "--address",
            server.dashboard_url,
            "--working-dir",
            str(EXAMPLE),
            "--runtime-env-json",
            runtime_env,
            "--",
            # The cluster's Python (the one with nodus installed): a user's `python` with the venv active.
            sys.executable,
            "submit.py",
            "tasks.jsonl",
            "--agent",
            worker,
            "--out",
            str(out),
        ],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "6 of 6 tasks succeeded" in job.stdout
    assert "6/6 done (0 failed)" in job.stdout + job.stderr, "the job's logs show progress"
    rows = read_rows(out)
    assert rows["divide"]["answer"] == "84 / 2 = 42." and rows["add"]["answer"] == "19 + 23 = 42."
