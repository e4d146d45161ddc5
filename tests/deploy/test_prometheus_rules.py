"""deploy/prometheus with the real promtool (Debian's): the rules parse and pass their unit tests, every
alert has a test in which it fires, links an existing runbook section of docs/operations.md, and every
expression names only metrics the project (or etcd) exports or a recording rule defines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import PROMETHEUS_DIR, ROOT, run, tool, unknown_names

RULES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
UNIT_TESTS = PROMETHEUS_DIR / "tests" / "alerts_test.yml"


def rules() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def github_anchors(markdown: str) -> set[str]:
    """Heading anchors as GitHub renders them: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced  # a `# comment` in a code block is no heading
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_promtool_checks_the_rules() -> None:
    assert RULES, "no rule files"
    run(tool("promtool"), "check", "rules", *map(str, RULES))


def test_promtool_unit_tests_pass() -> None:
    run(tool("promtool"), "test", "rules", str(UNIT_TESTS))


def test_every_alert_fires_in_a_unit_test() -> None:
    alerts = {r["alert"] for r in rules() if "alert" in r}
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", ()) if t.get("exp_alerts")}
    quiet = {t["alertname"] for case in tests for t in case.get("alert_rule_test", ()) if not t.get("exp_alerts")}
    assert alerts - fired == set(), "alerts that no unit test shows firing"
    assert alerts - quiet == set(), "alerts that no unit test shows staying quiet"
    assert fired <= alerts, "tests of alerts that do not exist"


def test_every_alert_has_a_severity_and_a_runbook_in_operations_md() -> None:
    anchors = github_anchors((ROOT / "docs" / "operations.md").read_text())
    for r in rules():
        if "alert" not in r:
            continue
        assert r["labels"]["severity"] in ("page", "ticket"), r["alert"]
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), r["alert"]
        doc, _, anchor = r["annotations"]["runbook_url"].partition("#")
        assert doc == "docs/operations.md" and anchor in anchors, f"{r['alert']}: no section #{anchor}"


def test_rules_name_only_exported_metrics() -> None:
    recorded = frozenset(r["record"] for r in rules() if "record" in r)
    assert unknown_names([r["expr"] for r in rules()], recorded) == {}


def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    """The shipped prometheus.yml with its rules, as compose mounts it (its target files beside it)."""
    config = tmp_path / "prometheus.yml"
    config.write_text((PROMETHEUS_DIR / "prometheus.yml").read_text())
    (tmp_path / "rules").symlink_to(PROMETHEUS_DIR / "rules")
    (tmp_path / "targets").symlink_to(ROOT / "deploy" / "compose" / "prometheus-targets")
    run(tool("promtool"), "check", "config", str(config))
