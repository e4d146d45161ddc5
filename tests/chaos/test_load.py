"""A plan's load as the product's schedules (chaos/load.py): every shipped scenario's schedules pass the
API's validation, and each executor's payload reports to the sink."""

from __future__ import annotations

import dataclasses
import json

from chaos.load import schedule_of
from chaos.plan import make_plan
from chaos.scenario import find, list_scenarios, load

URL = "http://127.0.0.1:9999"


def test_every_scenario_plans_valid_schedules() -> None:
    for s in list_scenarios():
        for p in make_plan(s).schedules:
            sch = schedule_of(p, URL)  # validate_schedule raised if not
            assert sch.id == p.id and sch.policies.overlap.value == p.overlap
            assert sch.labels == {"drill": p.group}


def test_payloads_report_to_the_sink() -> None:
    plan = make_plan(load(find("smoke")))
    http = schedule_of(next(p for p in plan.schedules if p.executor == "http" and p.hold_ms), URL)
    assert http.task_type == "http"
    assert json.loads(http.payload)["url"].startswith(f"{URL}/effect?phase=once&hold_ms=")
    shell = schedule_of(next(p for p in plan.schedules if p.executor == "shell"), URL, pool="pool")
    cmd = json.loads(shell.payload)["command"]
    assert shell.task_type == "shell" and shell.worker_pool == "pool"
    # A hold is one call the sink holds, so a stopped job's end is seen (chaos/sink.py shell_command).
    assert "phase=once" in cmd and "hold_ms=300" in cmd and "sleep" not in cmd
    ny = schedule_of(next(p for p in plan.schedules if p.group == "ny"), URL)
    assert ny.time_zone == "America/New_York"


def test_a_failing_group_fails_over_both_executors_and_an_update_can_fix_it() -> None:
    plan = make_plan(load(find("smoke")))
    broken = [p for p in plan.schedules if p.fail]
    assert {p.executor for p in broken} == {"http", "shell"}  # the smoke drill's dead letters, both ways
    for p in broken:
        payload = schedule_of(p, URL).payload.decode()
        assert "fail=permanent" in payload
        assert "fail=permanent" not in schedule_of(dataclasses.replace(p, fail=False), URL).payload.decode()
    ops = [(o.op, o.schedule_id, o.params) for o in plan.operations if o.schedule_id.startswith("broken")]
    assert ("update", "broken-001", {"fail": False}) in ops
    assert ("replay", "broken-001", {"which": "latest_dead_letter", "with_current_schedule": True}) in ops
