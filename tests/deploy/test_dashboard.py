"""deploy/grafana: the dashboard's queries name only exported metrics or recording rules, every panel has
a query and a unique id, and the provisioning files point at the dashboard and the data source it uses."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.deploy.test_prometheus_rules import rules
from tests.deploy.tools import DASHBOARD, DEPLOY, unknown_names


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def panel_exprs() -> dict[str, list[str]]:
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in panels()}


def test_every_panel_has_a_query_an_id_and_a_description() -> None:
    ps = panels()
    assert len({p["id"] for p in ps}) == len(ps)
    for p in ps:
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["description"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_the_dashboard_names_only_exported_metrics() -> None:
    recorded = frozenset(r["record"] for r in rules() if "record" in r)
    exprs = [e for es in panel_exprs().values() for e in es]
    assert unknown_names(exprs, recorded) == {}


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_provisioning_finds_the_dashboard_and_its_data_source() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert [d["type"] for d in ds] == ["prometheus"]
    providers = yaml.safe_load((prov / "dashboards" / "sched.yml").read_text())["providers"]
    assert providers[0]["options"]["path"] == "/var/lib/grafana/dashboards/sched"
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert "../grafana/dashboards:/var/lib/grafana/dashboards/sched:ro" in mounts
