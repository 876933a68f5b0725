"""The Grafana dashboard and the cluster launcher config: they parse, and they use only what exists.

The dashboard's PromQL may name only the engine's metrics, in the form Ray 2.60's metrics agent
exports them (docs/metrics.md): a ``ray_`` prefix on every name, ``_total`` after a Counter's
name, ``_bucket``/``_sum``/``_count`` after a Histogram's, a Gauge's name unchanged. Label
matchers and ``by (...)`` may use only the metric's own tags (and ``le`` on buckets), so a typo
in a name or a label, or a per-run label, fails here rather than as an empty panel.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "nodus-grafana.json"
CLUSTER = ROOT / "cluster.yaml"

# What the engine records with ray.util.metrics: name -> (kind, tag keys).
ENGINE_METRICS: dict[str, tuple[str, frozenset[str]]] = {
    "nodus_runs": ("gauge", frozenset({"phase", "project"})),
    "nodus_group_runs": ("gauge", frozenset({"project", "group", "state"})),
    "nodus_model_calls": ("counter", frozenset({"model", "family", "access"})),
    "nodus_model_tokens": ("counter", frozenset({"model", "family", "kind"})),
    "nodus_model_cost_usd": ("counter", frozenset({"model", "family"})),
    "nodus_model_call_seconds": ("histogram", frozenset({"model"})),
    "nodus_command_seconds": ("histogram", frozenset({"outcome"})),
    "nodus_journal_write_seconds": ("histogram", frozenset()),
    "nodus_admission_decisions": ("counter", frozenset({"project", "group", "decision"})),
}

# The names Prometheus sees (checked against Ray's own exporter in
# test_rays_exporter_produces_exactly_these_names).
EXPORTED_NAMES = frozenset(
    {
        "ray_nodus_runs",
        "ray_nodus_group_runs",
        "ray_nodus_model_calls_total",
        "ray_nodus_model_tokens_total",
        "ray_nodus_model_cost_usd_total",
        "ray_nodus_model_call_seconds_bucket",
        "ray_nodus_model_call_seconds_sum",
        "ray_nodus_model_call_seconds_count",
        "ray_nodus_command_seconds_bucket",
        "ray_nodus_command_seconds_sum",
        "ray_nodus_command_seconds_count",
        "ray_nodus_journal_write_seconds_bucket",
        "ray_nodus_journal_write_seconds_sum",
        "ray_nodus_journal_write_seconds_count",
        "ray_nodus_admission_decisions_total",
    }
)

# Labels Ray's metrics agent and Prometheus add to every series (bounded: one per node/session).
RAY_LABELS = frozenset({"SessionName", "NodeAddress", "instance"})

_SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def _exported(name: str, kind: str) -> list[str]:
    return [f"ray_{name}{suffix}" for suffix in _SUFFIXES[kind]]


def _labels_of(exported: str) -> frozenset[str]:
    """The labels a query may use on one exported series."""
    for name, (kind, tags) in ENGINE_METRICS.items():
        if exported in _exported(name, kind):
            return tags | RAY_LABELS | ({"le"} if exported.endswith("_bucket") else frozenset())
    return frozenset()


# -- a small PromQL reader: enough for this dashboard's expressions ----------------------------

_PROMQL_WORDS = frozenset(
    {
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "rate",
        "irate",
        "increase",
        "delta",
        "histogram_quantile",
        "clamp_min",
        "clamp_max",
        "vector",
        "topk",
        "bottomk",
        "abs",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "offset",
    }
)
_IDENT = r"[A-Za-z_:][A-Za-z0-9_:]*"


def _read(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The metric names in ``expr``, each with the labels its matcher names, and the grouping labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings ("$project") out of the way
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors ([$__rate_interval])
    grouping = {
        label.strip()
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", text)
        for label in group.split(",")
        if label.strip()
    }
    text = re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", text)
    selectors = []
    for match in re.finditer(rf"({_IDENT})\s*(\{{[^}}]*\}})?", text):
        name, matcher = match.group(1), match.group(2) or ""
        if name in _PROMQL_WORDS:
            continue
        selectors.append((name, set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matcher))))
    return selectors, grouping


def expression_problems(expr: str) -> list[str]:
    """What is wrong with one panel expression; empty when it is fine."""
    selectors, grouping = _read(expr)
    if not selectors:
        return [f"{expr!r} names no metric"]
    problems = []
    allowed: set[str] = set()
    for name, labels in selectors:
        if name not in EXPORTED_NAMES:
            problems.append(f"{expr!r}: {name!r} is not an exported nodus metric")
            continue
        allowed |= _labels_of(name)
        if labels - _labels_of(name):
            problems.append(f"{expr!r}: {name} has no label {sorted(labels - _labels_of(name))}")
        cumulative = name.endswith(("_total", "_bucket", "_sum", "_count"))
        inside_rate = re.search(rf"\b(?:rate|irate|increase)\(\s*{name}\b", expr) is not None
        if cumulative != inside_rate:
            problems.append(f"{expr!r}: {name} must {'' if cumulative else 'not '}be inside rate()")
    if grouping - allowed:
        problems.append(f"{expr!r}: grouping by {sorted(grouping - allowed)}, which no metric here has")
    if "histogram_quantile" in expr:
        if "le" not in grouping or not all(name.endswith("_bucket") for name, _ in selectors):
            problems.append(f"{expr!r}: a quantile needs rate() of _bucket series summed by (le, ...)")
    return problems


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return found


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in _panels(dashboard) for target in panel.get("targets", [])]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


# -- the dashboard ------------------------------------------------------------------------------


def test_the_dashboard_has_a_prometheus_datasource_variable_and_a_project_variable(dashboard) -> None:
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    project = variables["project"]
    assert project["type"] == "query" and project["datasource"]["uid"] == "${datasource}"
    assert project["includeAll"] and project["multi"]
    query = project["query"]["query"] if isinstance(project["query"], dict) else project["query"]
    match = re.fullmatch(rf"label_values\(\s*({_IDENT})\s*,\s*(\w+)\s*\)", query)
    assert match, query
    assert match.group(1) in EXPORTED_NAMES and match.group(2) in _labels_of(match.group(1))
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]


def test_every_panel_has_a_unique_id_and_a_title(dashboard) -> None:
    panels = _panels(dashboard)
    ids = [panel.get("id") for panel in panels]
    assert all(isinstance(panel_id, int) for panel_id in ids), ids
    assert len(ids) == len(set(ids)), ids
    assert all(str(panel.get("title", "")).strip() for panel in panels)
    assert all("gridPos" in panel for panel in panels)


def test_every_query_goes_to_the_datasource_variable(dashboard) -> None:
    graphs = [panel for panel in _panels(dashboard) if panel["type"] != "row"]
    assert graphs
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_expression_names_only_exported_metrics_and_their_own_labels(dashboard) -> None:
    problems = [problem for expr in _expressions(dashboard) for problem in expression_problems(expr)]
    assert problems == []


def test_every_engine_metric_has_a_panel(dashboard) -> None:
    used = {name for expr in _expressions(dashboard) for name, _ in _read(expr)[0]}
    for name, (kind, _tags) in ENGINE_METRICS.items():
        assert used & set(_exported(name, kind)), f"no panel shows {name}"


def test_project_filter_is_applied_wherever_a_metric_has_a_project_tag(dashboard) -> None:
    for expr in _expressions(dashboard):
        for name, labels in _read(expr)[0]:
            if "project" in _labels_of(name):
                assert "project" in labels and '"$project"' in expr, expr


def test_the_checker_catches_a_misspelt_metric_a_made_up_label_and_a_missing_rate(dashboard) -> None:
    good = "sum by (model) (rate(ray_nodus_model_calls_total[$__rate_interval]))"
    assert expression_problems(good) == []
    assert expression_problems(good.replace("model_calls_total", "model_call_total"))
    assert expression_problems(good.replace("ray_nodus_model_calls_total", "nodus_model_calls"))
    assert expression_problems(good.replace("by (model)", "by (run)"))
    assert expression_problems('sum(ray_nodus_model_calls_total{run="r1"})')
    assert expression_problems("sum by (phase) (ray_nodus_runs_total)")
    assert expression_problems(
        "histogram_quantile(0.5, sum by (le) (rate(ray_nodus_command_seconds_sum[5m])))"
    )
    broken = copy.deepcopy(dashboard)
    broken["panels"][1]["targets"][0]["expr"] = broken["panels"][1]["targets"][0]["expr"].replace(
        "ray_nodus_runs", "ray_nodus_run"
    )
    assert [p for expr in _expressions(broken) for p in expression_problems(expr)]


def test_the_exported_names_follow_rays_rule_for_each_kind() -> None:
    derived = {
        exported for name, (kind, _tags) in ENGINE_METRICS.items() for exported in _exported(name, kind)
    }
    assert derived == EXPORTED_NAMES


_EXPORTER_PROBE = """
from prometheus_client import REGISTRY, generate_latest
from ray._private.telemetry.open_telemetry_metric_recorder import OpenTelemetryMetricRecorder
metrics = {metrics!r}
recorder = OpenTelemetryMetricRecorder(gauge_metric_ttl_seconds=600)
for name, (kind, tags) in metrics.items():
    if kind == "gauge":
        recorder.register_gauge_metric(name, name)
    elif kind == "counter":
        recorder.register_counter_metric(name, name)
    else:
        recorder.register_histogram_metric(name, name, [0.1, 1.0])
    recorder.set_metric_value(name, {{tag: "x" for tag in tags}}, 0.5)
print(generate_latest(REGISTRY).decode())
"""


def test_rays_exporter_produces_exactly_these_names() -> None:
    """Ray's own metrics-agent recorder and Prometheus exporter, in a scratch process (no cluster)."""
    metrics = {name: (kind, sorted(tags)) for name, (kind, tags) in ENGINE_METRICS.items()}
    done = subprocess.run(
        [sys.executable, "-c", _EXPORTER_PROBE.format(metrics=metrics)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    samples = {
        line.split("{")[0].split(" ")[0] for line in done.stdout.splitlines() if line.startswith("ray_nodus_")
    }
    assert samples == EXPORTED_NAMES


# -- the cluster launcher config ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER.read_text())


def test_cluster_yaml_has_what_the_launcher_requires(cluster) -> None:
    for key in (
        "cluster_name",
        "provider",
        "available_node_types",
        "head_node_type",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ):
        assert cluster.get(key), key
    assert cluster["provider"]["type"] == "aws" and cluster["provider"]["region"]
    assert cluster["head_node_type"] in cluster["available_node_types"]
    for node_type in cluster["available_node_types"].values():
        assert "resources" in node_type and node_type["node_config"]["InstanceType"]


def test_cluster_yaml_passes_rays_own_schema_and_defaults() -> None:
    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(CLUSTER.read_text())
    validate_config(prepare_config(copy.deepcopy(config)))
    typo = copy.deepcopy(config)
    typo["available_node_types"]["nodus.worker"]["min_worker"] = 1
    with pytest.raises(ValidationError):
        validate_config(prepare_config(typo))


def test_every_node_gets_bubblewrap_and_the_head_runs_nodus_up_on_s3(cluster) -> None:
    setup = "\n".join(cluster["setup_commands"])
    assert "apt-get install" in setup and "bubblewrap" in setup
    assert "pip install" in setup
    head = "\n".join(cluster["head_start_ray_commands"])
    assert "ray start --head" in head and "--autoscaling-config" in head
    assert re.search(r"NODUS_STORAGE=s3://[^\s@?]+ \S*nodus up --address auto", head), head
    assert "nodus up" not in "\n".join(cluster["worker_start_ray_commands"])
    for local in cluster["file_mounts"].values():
        assert (ROOT / local).exists(), f"file_mounts copies {local}, which is not in the repository"
    installs = re.findall(r"pip install -q (~/\S+)", setup)
    assert installs and all(path.startswith("~/nodus-ray") for path in installs)
    assert any(remote.startswith("/home/ubuntu/nodus-ray/pyproject") for remote in cluster["file_mounts"])
    assert "$RAY_HEAD_IP" in "\n".join(cluster["worker_start_ray_commands"])


def test_cluster_yaml_and_docs_hold_no_credentials_and_no_invented_flags_or_variables() -> None:
    from nodus.cli import main as cli

    docs = (ROOT / "docs" / "cluster.md").read_text()
    text = CLUSTER.read_text() + docs
    commands = CLUSTER.read_text() + "\n".join(re.findall(r"```\n(.*?)```", docs, flags=re.S))
    assert not re.search(r"AKIA[0-9A-Z]{12,}|aws_secret_access_key|s3://[^\s/]*@|secret_key=", commands)
    help_text = CliRunner().invoke(cli.app, ["up", "--help"], terminal_width=200).output
    for flag in re.findall(r"nodus up((?: --[a-z-]+(?:[ =][^\s`;]+)?)*)", text):
        for option in re.findall(r"--[a-z-]+", flag):
            assert option in help_text, f"`nodus up {option}` is not an option of nodus up"
    sources = "\n".join(
        path.read_text() for folder in ("sdk", "nodus_ray", "serve") for path in (ROOT / folder).rglob("*.py")
    )
    known = set(re.findall(r"NODUS_[A-Z_]+", sources))
    assert set(re.findall(r"NODUS_[A-Z_]+", text)) <= known
