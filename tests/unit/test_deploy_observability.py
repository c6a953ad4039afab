"""deploy/'s dashboard and Prometheus files: current, valid, and (alerts) evaluated.

The alert rules are tested with Prometheus' own ``promtool`` (``make tools`` installs
Debian's prometheus package for it): the rules parse, the scrape config is valid, and
``alerts_test.yml`` shows each alert firing on its failure and quiet on a healthy fleet.
That every metric the dashboard names is exported is checked against a running sim
cluster in ``tests/sim/test_observability.py``.
"""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).parents[2] / "deploy"
PROMETHEUS = DEPLOY / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: `make tools` installs it (Debian package prometheus)")
    return subprocess.run(["promtool", *args], cwd=PROMETHEUS, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_dashboard_json_is_valid_and_current():
    built = runpy.run_path(str(DEPLOY / "grafana" / "build_dashboard.py"))["render"]()
    shipped = (DEPLOY / "grafana" / "pdserve-dashboard.json").read_text()
    assert shipped == built, "regenerate it: python deploy/grafana/build_dashboard.py"
    dashboard = json.loads(shipped)
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in (
        "ttft",
        "itl",
        "tokens per second",
        "queue depth",
        "kv cache usage",
        "prefix hit rate",
        "kv transfers",
        "per 1m",
        "p:d",
        "admission rejections",
    ):
        assert topic in titles, f"no panel on {topic}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_alert_rules_parse_and_the_scrape_config_is_valid():
    rules = promtool("check", "rules", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_alerts_fire_on_their_failures_and_stay_quiet_on_a_healthy_fleet():
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = (PROMETHEUS / "alerts_test.yml").read_text()
    for rule in [line.split(":", 1)[1].strip() for line in
                 (PROMETHEUS / "alerts.yml").read_text().splitlines()
                 if line.strip().startswith("- alert:")]:  # fmt: skip
        assert f"alertname: {rule}" in tested, f"{rule} has no promtool test"
