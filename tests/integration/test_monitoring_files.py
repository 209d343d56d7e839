"""The Grafana dashboard and the Prometheus rules under ops/deploy/monitoring name only metrics that
a running deployment serves, and the rules (with their unit tests) and the scrape config validate
with promtool (Debian's `prometheus` package; ops/setup.sh tries to install it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from harness.deployment import get_text
from prometheus_client.parser import text_string_to_metric_families

MONITORING = Path(__file__).resolve().parents[2] / "ops" / "deploy" / "monitoring"
METRIC = re.compile(r"\bpagedserve_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (apt-get install -y prometheus; ops/setup.sh tries it as root)",
)


def served_names(metrics_text: str) -> set[str]:
    """Every name a query may use: families (even those with no sample yet, like a labelled counter
    nothing has incremented) and their sample names."""
    names = set()
    for family in text_string_to_metric_families(metrics_text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
        names.update(s.name for s in family.samples)
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def test_dashboard_and_rules_name_only_metrics_a_deployment_serves(api_deployment):
    sup = api_deployment.sup
    served = set()
    for url in (
        sup.scheduler_ops_url,
        sup.block_manager_ops_url,
        api_deployment.api.base_url.removesuffix("/v1"),
    ):
        served |= served_names(get_text(f"{url}/metrics"))
    named = {m for expr in dashboard_exprs() for m in METRIC.findall(expr)}
    named_by_rules = set(METRIC.findall((MONITORING / "alerts.yml").read_text()))
    assert len(named) >= 20 and len(named_by_rules) >= 6  # the files were read, not an empty match
    assert sorted((named | named_by_rules) - served) == []


@needs_promtool
def test_alert_rules_validate_and_fire_on_what_they_are_for():
    check = subprocess.run(
        [PROMTOOL, "check", "rules", "alerts.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_prometheus_scrape_config_validates():
    check = subprocess.run(
        [PROMTOOL, "check", "config", "prometheus.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
