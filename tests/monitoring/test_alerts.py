"""deploy/monitoring's alerts and dashboard, tested with promtool (built by
the kit) on series scraped from a real powerdev in each state
(scrapes.py): each state fires exactly the alerts it should, and no other;
a node without SAN devices fires nothing; every dashboard query has data.

A state's series: the scrape before it for ten minutes, then its own for
thirty, with the labels Prometheus adds to a PodMonitor's target; a dead
pod is `up` 0 and nothing else; a missing one nothing at all."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import trio
import yaml

from powerdev.devtools.kit import PROMTOOL, ROOT
from tests import conftest
from tests.monitoring.scrapes import Sample, Scrapes, take

MONITORING = ROOT / "deploy" / "monitoring"
JOB = "power-device-plugin/power-device-plugin"
TARGET = {
    "job": JOB,
    "namespace": "power-device-plugin",
    "pod": "power-device-plugin-x7k2p",
    "container": "plugin",
    "instance": "10.128.0.7:8080",
}
BEFORE, AFTER = 10, 30  # minutes of the state before, and of the state
SOON, LATE = 12, 39  # minutes: counters' alerts are seen soon, the others late

# state: (the state before it, the alerts it fires, with the labels beside
# the target's that each carries)
POD = ("namespace", "pod")
EXPECTED: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {
    "fine": ("fine", {}),
    "degraded": ("fine", {"PowerdevDeviceDegraded": (*POD, "resource")}),
    "failed": (
        "degraded",
        {
            "PowerdevDeviceFailed": (*POD, "resource"),
            "PowerdevNoHealthyDevice": (*POD, "resource"),
            "PowerdevDevicesUnhealthy": (*POD, "resource"),
        },
    ),
    "recovered": ("failed", {}),
    "refused": ("recovered", {"PowerdevAllocateRefused": (*POD, "resource")}),
    "rejected": ("refused", {"PowerdevConfigRejected": POD}),
    "unregistered": ("rejected", {"PowerdevNotRegistered": (*POD, "resource")}),
    "empty": ("empty", {}),  # a node with no SAN disk
    "dead": ("fine", {"PowerdevDown": POD}),
    "absent": ("fine", {"PowerdevAbsent": ("job",)}),
}
COUNTER_ALERTS = {"PowerdevAllocateRefused", "PowerdevConfigRejected"}
RESOURCE = "power-dev-plugin/dev"


@pytest.fixture(scope="module")
def scraped(tmp_path_factory) -> Scrapes:
    if not conftest.IS_ROOT:
        conftest.require(None, "needs root: the daemon's device nodes are made with mknod")
    return trio.run(take, tmp_path_factory.mktemp("monitoring"))


@pytest.fixture(scope="module")
def promtool() -> Path:
    return conftest.require_tool(PROMTOOL)


def rules() -> dict:
    (rule,) = [d for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text())]
    return rule


def alert_names() -> list[str]:
    return [r["alert"] for g in rules()["spec"]["groups"] for r in g["rules"] if "alert" in r]


def series_text(name: str, labels: dict[str, str]) -> str:
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    inside = ",".join(f'{k}="{quoted(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inside}}}"


def input_series(
    before: dict[Sample, float] | None, now: dict[Sample, float] | None, up_now: int | None
):
    """promtool's input series: `before` for BEFORE minutes, then `now`
    (None: not scraped) for AFTER; `up` as Prometheus writes it."""
    series = []
    for key in sorted(set(before or {}) | set(now or {})):
        name, labels = key

        values = _values(before, key, BEFORE) + _values(now, key, AFTER)
        series.append(
            {"series": series_text(name, {**dict(labels), **TARGET}), "values": " ".join(values)}
        )
    up = ["1"] * BEFORE + (["_" if up_now is None else str(up_now)] * AFTER)
    series.append({"series": series_text("up", TARGET), "values": " ".join(up)})
    return series


def _values(scrape: dict[Sample, float] | None, key: Sample, minutes: int) -> list[str]:
    value = scrape.get(key) if scrape is not None else None
    return ["_" if value is None else repr(float(value))] * minutes


def state_series(scraped: Scrapes, state: str) -> list[dict]:
    before = scraped.states[EXPECTED[state][0]]
    if state == "dead":
        return input_series(before, None, 0)
    if state == "absent":
        return input_series(before, None, None)
    return input_series(before, scraped.states[state], 1)


def firing(state: str, alert: str, resource: str = RESOURCE) -> dict:
    names = EXPECTED[state][1][alert]
    labels = {k: TARGET[k] for k in names if k in TARGET}
    if "resource" in names:
        labels["resource"] = resource
    severity = next(
        r["labels"]["severity"]
        for g in rules()["spec"]["groups"]
        for r in g["rules"]
        if r.get("alert") == alert
    )
    return {"exp_labels": {**labels, "severity": severity}}


def run_promtool(promtool: Path, work: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    """promtool test rules on the shipped rules (their annotations left
    out: promtool would compare them too; `check rules` checks them)."""
    groups = rules()["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (work / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    unit = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (work / "tests.yaml").write_text(yaml.safe_dump(unit, width=10**9))
    return subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"], cwd=work, capture_output=True, text=True
    )


def test_the_rules_are_valid_with_their_annotations(promtool, tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules()["spec"]["groups"]}))
    done = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_daemon_has_every_counter_and_state_series_from_the_start(scraped):
    fine = scraped.states["fine"]
    names = {(name, dict(labels).get("reason")) for name, labels in fine}
    for reason in ("unknown_id", "unhealthy_id", "other"):
        assert ("powerdev_allocate_refusals_total", reason) in names
    for level in ("fine", "degraded", "failed"):
        key = ("powerdev_device_condition", (("condition", level), ("resource", RESOURCE)))
        assert key in fine, level
    rejected = ("powerdev_config_reloads_total", (("result", "rejected"),))
    assert fine[rejected] == 0.0


@pytest.mark.parametrize("state", list(EXPECTED))
def test_each_state_fires_its_alerts_and_no_other(scraped, promtool, tmp_path, state):
    expected = EXPECTED[state][1]
    checks = []
    for alert in alert_names():
        at = [SOON, LATE]
        if alert in expected:
            at = [SOON if alert in COUNTER_ALERTS else LATE]
        for minute in at:
            exp = [firing(state, alert)] if alert in expected else []
            checks.append({"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": exp})
    test = {
        "interval": "1m",
        "input_series": state_series(scraped, state),
        "alert_rule_test": checks,
    }
    done = run_promtool(promtool, tmp_path, [test])
    assert done.returncode == 0, f"{state}:\n{done.stdout}{done.stderr}"


def test_a_missing_pod_fires_with_kube_state_metrics(promtool, tmp_path, scraped):
    """The one series not powerdev's: kube-state-metrics' count of nodes
    the DaemonSet should run on and does not."""
    series = state_series(scraped, "fine")
    unavailable = {"namespace": "power-device-plugin", "daemonset": "power-device-plugin"}
    ksm = series_text("kube_daemonset_status_number_unavailable", {**unavailable, "job": "ksm"})
    series.append({"series": ksm, "values": " ".join(["0"] * BEFORE + ["1"] * AFTER)})
    check = {
        "eval_time": f"{LATE}m",
        "alertname": "PowerdevPodsUnavailable",
        "exp_alerts": [{"exp_labels": {**unavailable, "severity": "warning"}}],
    }
    done = run_promtool(
        promtool, tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": [check]}]
    )
    assert done.returncode == 0, done.stdout + done.stderr


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    return found


def concrete(expr: str) -> str:
    """A dashboard query as Grafana sends it: its variables filled in."""
    expr = expr.replace("$__rate_interval", "5m").replace("${__rate_interval}", "5m")
    return re.sub(r"\$\{?(namespace|pod|resource)\}?", ".*", expr)


@pytest.mark.parametrize("state", ["fine", "failed"])
def test_every_dashboard_query_has_data(scraped, promtool, tmp_path, state):
    queries = dashboard_queries()
    assert queries
    checks = [
        {
            "expr": f"count({concrete(expr)}) > bool 0",
            "eval_time": f"{LATE}m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        }
        for _, expr in queries
    ]
    test = {
        "interval": "1m",
        "input_series": state_series(scraped, state),
        "promql_expr_test": checks,
    }
    done = run_promtool(promtool, tmp_path, [test])
    assert done.returncode == 0, done.stdout + done.stderr
