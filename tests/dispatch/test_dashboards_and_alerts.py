"""The Grafana dashboard (deploy/grafana/) and the Prometheus alert rules (deploy/prometheus/)
that ship: both load, every series they query is one a live /metrics serves, and every label they
match on is one of those series' labels; and Prometheus' own `promtool` (Debian's `prometheus`
package, which `python -m tests` installs when missing) accepts the rules and the dashboard's
queries."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "scheduler.json"
RULES = ROOT / "deploy" / "prometheus" / "scheduler-alerts.yml"
# The sample names each kind of family is exposed under.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
            "gaugehistogram": ("_bucket", "_gcount", "_gsum"), "gauge": ("",)}
METRIC = re.compile(r"\b(scheduler_[a-z0-9_]+)\b")
# A selector's label matchers, e.g. {state="ready"} or on (tenant).
MATCHERS = re.compile(r"(scheduler_[a-z0-9_]+)\{([^}]*)\}")
POSTGRESQL_ONLY = {"scheduler_database_standbys", "scheduler_database_synchronous_standbys",
                   "scheduler_database_replication_visible", "scheduler_database_replication_degraded"}
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def rule_queries() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def served(client) -> dict[str, set]:
    """Each sample name /metrics serves, with its labels (le for histogram buckets)."""
    resp = client.get("/metrics")
    assert resp.status_code == 200
    out = {}
    for fam in text_string_to_metric_families(resp.content.decode()):
        labels = {label for s in fam.samples for label in s.labels}
        for suffix in SUFFIXES.get(fam.type, ("",)):
            out[fam.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def test_both_load_and_are_not_empty():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["panels"]
    assert all(p["targets"] for p in board["panels"])
    assert len(rule_queries()) >= 8
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            assert r["alert"] and r["labels"]["severity"] and r["annotations"]["summary"], r


def test_every_series_they_use_is_served_with_the_labels_they_match(client, tenant, target):
    # Some work, so the labelled families have samples (tenants, states) and not just their HELP.
    make_due(make_schedule(tenant, target.url + "/m"))
    from dispatch.loops import drain, scan_step

    drain(scan_step)
    names = served(client)
    queries = dashboard_queries() + rule_queries()
    used = {m for q in queries for m in METRIC.findall(q)}
    assert used, "no scheduler_ series found in the queries"
    if connection.vendor != "postgresql":
        # The database's replication exists only on PostgreSQL (test_replication_shown.py).
        used -= POSTGRESQL_ONLY
    missing = sorted(used - set(names))
    assert not missing, f"not served by /metrics: {missing}"
    for q in queries:
        for metric, matchers in MATCHERS.findall(q):
            for label in re.findall(r"([a-zA-Z_]+)\s*[=!~]", matchers):
                assert label in names[metric], (q, metric, label)
        for group in GROUPING.findall(q):
            for label in filter(None, (x.strip() for x in group.split(","))):
                assert any(label in names[m] for m in METRIC.findall(q)), (q, label)
    # The themes the dashboard is for, each with a panel.
    titles = " ".join(p["title"].lower() for p in json.loads(DASHBOARD.read_text())["panels"])
    for theme in ("start lag", "oldest overdue", "due ahead", "throughput", "lease churn", "starvation",
                  "dead-letter", "relay backlog"):
        assert theme in titles, theme


def promtool() -> str | None:
    return shutil.which("promtool")


def test_promtool_accepts_the_rules_and_the_dashboard_queries(tmp_path):
    tool = promtool()
    assert tool, "promtool is not installed: `apt-get install prometheus` (python -m tests installs it)"
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The dashboard's queries, as recording rules, so promtool parses each one.
    as_rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": q} for i, q in enumerate(dashboard_queries())]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(as_rules))
    checked = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
