"""The Grafana dashboard and the Prometheus alert rules under deploy/ stay true to the server:
every metric they query is one the server exports, every alert has its runbook section in
docs/operations.md, and (where promtool is installed) the rules parse and pass their unit tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from asr_server.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "asr-server.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
METRIC = re.compile(r"\b(asr_[a-z0-9_]+)")


def exported_series() -> set[str]:
    """Every sample name a server's /metrics can carry."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}[family.type]
        names.update(family.name + suffix for suffix in suffixes)
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_the_dashboard_and_the_alerts_query_only_metrics_the_server_exports():
    exported = exported_series()
    exprs = dashboard_exprs() + [rule["expr"] for rule in alert_rules()]
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert used, "no metric found in deploy/"
    assert used <= exported, f"not exported by the server: {sorted(used - exported)}"
    # The golden signals are all on the dashboard.
    for signal in ("asr_active_sessions", "asr_final_latency_seconds_bucket", "asr_queue_wait_seconds_bucket", "asr_load_level",
                   "asr_errors_total", "asr_access_refusals_total", "asr_decode_seconds_sum", "asr_memory_budget_bytes"):
        assert any(signal in expr for expr in dashboard_exprs()), signal


def test_every_alert_has_a_severity_and_a_runbook_section_in_the_operations_guide():
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in OPERATIONS.read_text().splitlines() if line.startswith("#")
    }
    alerts = [rule for rule in alert_rules() if "alert" in rule]
    assert len(alerts) >= 6
    for rule in alerts:
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/operations.md#{rule['alert'].lower()}", runbook
        assert rule["alert"].lower() in headings, f"docs/operations.md has no section for {rule['alert']}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) is not installed")
def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    for args in (["check", "rules", str(ALERTS)], ["test", "rules", str(ALERTS.with_name("alerts_test.yml"))]):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
