"""Scenario files and seeded plans (chaos/scenario.py, chaos/plan.py): every shipped scenario loads,
bad input names its field, and a plan is a pure function of (scenario, seed)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from chaos.plan import make_plan
from chaos.scenario import SCENARIO_DIR, ScenarioError, find, list_scenarios, load, loads

MINIMAL = """
[scenario]
name = "t"
duration_s = 120
[[load.schedules]]
name = "sec"
count = 3
spec = "* * * * * *"
"""


def with_(extra: str) -> str:
    return MINIMAL + extra


def test_every_shipped_scenario_loads_and_plans() -> None:
    names = {s.name for s in list_scenarios()}
    assert {"smoke", "game-day", "regress-pause-wedge", "regress-catchup-overlap", "regress-undelivered-dispatch",
            "regress-frozen-result", "regress-silent-gaps"} <= names
    for s in list_scenarios():
        plan = make_plan(s)
        assert plan.schedules, s.name
        if s.tier == "regression":
            assert s.regression.startswith(("issue ", "session ")), s.name


def test_smoke_covers_what_ci_must_prove_within_8_minutes() -> None:
    s = load(find("smoke"))
    plan = make_plan(s)
    assert set(plan.faults_per_type()) == {"F1", "F2", "F3", "F5", "F6", "F7"}
    f2 = next(f for f in plan.faults if f.type == "F2")
    assert f2.duration_s > s.cluster.lease_ttl_s  # a pause beyond the lease: a takeover must happen
    f5 = next(f for f in plan.faults if f.type == "F5")
    assert f5.params["variant"] == "single-region"
    assert s.duration_s + 120 <= 8 * 60  # start-up and the final checks fit in the CI budget
    executors = {g.executor for g in s.load}
    assert executors == {"http", "shell"}
    assert any(g.tz != "UTC" for g in s.load) and any(g.spec.startswith("@every") for g in s.load)


def test_game_day_is_a_kitchen_sink_of_at_least_200_faults() -> None:
    s = load(find("game-day"))
    plan = make_plan(s)
    assert s.duration_s == 1800
    assert len(plan.faults) >= 200
    # Every type of the catalogue, and the membership change once.
    assert set(plan.faults_per_type()) == {f"F{i}" for i in range(1, 13)}
    assert plan.faults_per_type()["F12"] == 1
    f9 = [f for f in plan.faults if f.type == "F9"]
    assert {f.params["probability"] for f in f9} <= {0.05, 0.1, 0.2} and all(f.role == "planner" for f in f9)


@pytest.mark.parametrize("name", ["smoke", "game-day", "regress-silent-gaps"])
def test_same_seed_same_plan_other_seed_other_plan(name: str) -> None:
    s = load(find(name))
    a, b = make_plan(s, seed=7), make_plan(load(find(name)), seed=7)
    assert a == b and a.fingerprint == b.fingerprint and a.to_json() == b.to_json()
    if s.faults.random is not None or s.ops_mix is not None:
        assert make_plan(s, seed=8).fingerprint != a.fingerprint


def test_faults_never_overlap_and_keep_the_gap_unless_allowed() -> None:
    for s in list_scenarios():
        for seed in range(5):
            plan = make_plan(s, seed=seed)
            for x, y in itertools.pairwise(plan.faults):
                assert y.start_s >= x.end_s + s.faults.min_gap_s - 1e-9, (s.name, seed, x, y)
            for f in plan.faults:
                assert s.faults.warmup_s <= f.start_s and f.end_s <= s.duration_s - s.faults.cooldown_s + 1e-9


def test_concerns_are_seeded_apart() -> None:
    """Adding operations does not move the faults (each concern has its own random stream)."""
    s = load(find("game-day"))
    busier = replace(s, ops_mix=replace(s.ops_mix, rate_per_min=30)) if s.ops_mix else s
    assert make_plan(s).faults == make_plan(busier).faults
    assert make_plan(s).operations != make_plan(busier).operations


def test_random_pauses_are_resumed() -> None:
    plan = make_plan(load(find("regress-silent-gaps")), seed=3)
    pauses = [o for o in plan.operations if o.op == "pause" and o.origin == "random"]
    assert pauses
    for p in pauses:
        assert any(o.op == "resume" and o.schedule_id == p.schedule_id and o.at_s > p.at_s for o in plan.operations)


def test_the_game_days_mix_cancels_and_replays_naming_what() -> None:
    plan = make_plan(load(find("game-day")), seed=1)
    got = {o.op: o.params for o in plan.operations if o.op in ("cancel", "replay")}
    assert got == {"cancel": {"which": "latest_in_flight"}, "replay": {"which": "latest_dead_letter"}}


@pytest.mark.parametrize(("extra", "field", "words"), [
    ("[cluster]\nlease_ttl = 2\n", "cluster.lease_ttl", "unknown key"),
    ("[cluster]\nlease_ttl_s = \"2\"\n", "cluster.lease_ttl_s", "must be a number"),
    ("[cluster]\nlease_ttl_s = 1\nrenew_interval_s = 1\n", "cluster.renew_interval_s", "below lease_ttl_s"),
    ("[[faults.fixed]]\ntype = \"F14\"\nat_s = 30\n", "faults.fixed[0].type", "unknown fault type"),
    ("[[faults.fixed]]\ntype = \"F2\"\nat_s = 30\nparams = { offset = \"+1h\" }\n", "faults.fixed[0].params.offset",
     "takes no parameter"),
    ("[[faults.fixed]]\ntype = \"F6\"\nat_s = 30\nparams = { offset = \"+2h\" }\n", "faults.fixed[0].params.offset",
     "is not one of"),
    ("[[faults.fixed]]\ntype = \"F1\"\nat_s = 30\ntarget = \"r9-p1\"\n", "faults.fixed[0].target", "r1-p1"),
    ("[[faults.fixed]]\ntype = \"F1\"\nat_s = 115\n", "faults.fixed[0].at_s", "outside the fault window"),
    ("[[operations]]\nat_s = 5\nop = \"explode\"\ntarget = \"sec\"\n", "operations[0].op", "is not one of"),
    ("[[operations]]\nat_s = 5\nop = \"pause\"\ntarget = \"nope\"\n", "operations[0].target", "neither"),
    ("[[operations]]\nat_s = 5\nop = \"backfill\"\ntarget = \"sec\"\n", "operations[0].params.from_s", "required"),
    ("[faults.random]\nweights = { F99 = 1 }\n", "faults.random.weights.F99", "unknown fault type"),
    ("[faults.random]\nweights = { F1 = 1 }\ninterval_s = [5]\n", "faults.random.interval_s", "[low, high]"),
    ("[checks]\nallowed_errors = [\"(\"]\n", "checks.allowed_errors[0]", "regular expression"),
    ("[lag]\nsteady_p99_s = 3\nsteady_max_s = 2\n", "lag.steady_max_s", "below steady_p99_s"),
    ("[cluster]\nprimary = \"r9\"\n", "cluster.primary", "is not one of the regions (r1)"),
    ("[cluster]\nfailover_grace_s = 5\n", "cluster.failover_grace_s", "needs `primary`"),
    ("[cluster]\nregions = [\"r1\", \"r2\"]\nprimary = \"r1\"\nfailover_grace_s = 0\n", "cluster.failover_grace_s",
     "must be > 0"),
    ("[[operations]]\nat_s = 5\nop = \"switchover\"\ntarget = \"sec\"\n", "operations[0].target", "names a region"),
    ("[[operations]]\nat_s = 5\nop = \"update\"\ntarget = \"sec\"\nparams = { fail = \"no\" }\n",
     "operations[0].params.fail", "true or false"),
    ("[[operations]]\nat_s = 5\nop = \"replay\"\ntarget = \"sec\"\nparams = { with_current_schedule = 1 }\n",
     "operations[0].params.with_current_schedule", "true or false"),
])
def test_bad_input_names_the_field(extra: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        loads(with_(extra), "x.toml")
    assert err.value.field == field, str(err.value)
    assert words in str(err.value)
    assert str(err.value).startswith(f"x.toml: {field}: ")


@pytest.mark.parametrize(("text", "field"), [
    (MINIMAL.replace('spec = "* * * * * *"', 'spec = "61 * * * * *"'), "load.schedules[0].spec"),
    (MINIMAL + 'tz = "Mars/Base"\n', "load.schedules[0].tz"),
    (MINIMAL + 'overlap = ["skip", "sometimes"]\n', "load.schedules[0].overlap[1]"),
    (MINIMAL.replace("count = 3", "count = 0"), "load.schedules[0].count"),
    (MINIMAL + 'fail = "yes"\n', "load.schedules[0].fail"),
    (MINIMAL.replace('name = "t"\n', ""), "scenario.name"),
    ("[scenario]\nname = 't'\n", "load.schedules"),
    ("[scenario\n", ""),
])
def test_bad_load_names_the_field(text: str, field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        loads(text, "x.toml")
    assert err.value.field == field, str(err.value)


def test_plan_errors_name_the_field() -> None:
    overlapping = with_("[[faults.fixed]]\ntype = \"F1\"\nat_s = 30\nduration_s = 5\n"
                        "[[faults.fixed]]\ntype = \"F7\"\nat_s = 33\n")
    with pytest.raises(ScenarioError) as err:
        make_plan(loads(overlapping, "x.toml"))
    assert err.value.field == "faults.fixed[1].at_s" and "overlaps" in str(err.value)
    allowed = overlapping.replace("[[faults.fixed]]", "[faults]\nallow_overlap = true\n[[faults.fixed]]", 1)
    assert len(make_plan(loads(allowed)).faults) == 2
    too_many = with_("[faults.random]\nweights = { F1 = 1 }\ninterval_s = [20, 30]\nmin_count = 50\n")
    with pytest.raises(ScenarioError) as err:
        make_plan(loads(too_many))
    assert err.value.field == "faults.random.min_count"
    quorum = with_("[[faults.fixed]]\ntype = \"F4\"\nat_s = 30\nparams = { members = 2 }\n")
    with pytest.raises(ScenarioError) as err:
        make_plan(loads(quorum))
    assert err.value.field == "faults.fixed[0].params.members"


def test_a_region_policy_and_a_switchover_plan() -> None:
    s = loads(with_("[cluster]\nregions = [\"r1\", \"r2\", \"r3\"]\nprimary = \"r2\"\n"
                    "[[operations]]\nat_s = 5\nop = \"switchover\"\ntarget = \"r3\"\n"), "x.toml")
    assert (s.cluster.primary, s.cluster.standby(), s.cluster.failover_grace_ms()) == ("r2", ("r1", "r3"), 6000)
    assert [(o.op, o.schedule_id) for o in make_plan(s).operations] == [("switchover", "r3")]


def test_a_region_cut_only_when_asked_for_and_only_across_regions() -> None:
    three = "[cluster]\nregions = [\"r1\", \"r2\", \"r3\"]\nprimary = \"r1\"\n"
    cut = "[[faults.fixed]]\ntype = \"F5\"\nat_s = 30\ntarget = \"r1\"\nparams = { variant = \"cut\" }\n"
    f5 = make_plan(loads(with_(three + cut))).faults[0]
    assert f5.params == {"variant": "cut", "mode": "drop"}
    drawn = with_(three + "[faults.random]\nweights = { F5 = 1 }\ninterval_s = [20, 30]\n")
    assert {f.params["variant"] for f in make_plan(loads(drawn)).faults} == {"multi-region"}, "never drawn"
    killed_with_mode = cut.replace('variant = "cut"', 'variant = "multi-region", mode = "reset"')
    for text, field in ((with_(cut), "params.variant"),  # one region: nothing to cut it from
                        (with_(three + killed_with_mode), "params.mode")):
        with pytest.raises(ScenarioError) as err:
            make_plan(loads(text))
        assert err.value.field.endswith(field), str(err.value)


def test_find_by_name_or_path() -> None:
    assert find("smoke") == SCENARIO_DIR / "smoke.toml"
    assert find(str(SCENARIO_DIR / "smoke.toml")) == SCENARIO_DIR / "smoke.toml"
    with pytest.raises(ScenarioError) as err:
        find("nope")
    assert "smoke" in str(err.value)
