"""Settings: flags > SCHED_* environment > TOML, converted and validated with the rule named."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.config import CoordinationSettings, EtcdSettings
from scheduler.errors import InvalidArgument
from scheduler.planner.settings import PlannerSettings


def test_precedence_flags_env_toml(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('node_id = "from-toml"\nregion = "toml-region"\nlease_ttl = 9\netcd_prefix = "/x"\n')
    s = CoordinationSettings.load(
        {"node_id": "from-flag", "lease_ttl": None},
        env={"SCHED_REGION": "env-region", "SCHED_NODE_ID": "from-env"},
        toml_file=f,
        shared_keys=frozenset({"etcd_prefix"}),
    )
    assert s.node_id == "from-flag"
    assert s.region == "env-region"
    assert s.lease_ttl == 9


def test_lists_and_bools_from_strings() -> None:
    e = EtcdSettings.load({}, env={"SCHED_ETCD_ENDPOINTS": "127.0.0.1:1, 127.0.0.1:2"})
    assert e.etcd_endpoints == ("127.0.0.1:1", "127.0.0.1:2")


@pytest.mark.parametrize(
    ("flags", "field", "reason"),
    [
        ({"lease_ttl": "1"}, "lease_ttl", "minimum lease TTL is 2"),
        ({"lease_ttl": "abc"}, "lease_ttl", "is not a valid int"),
        ({"partitions": "0"}, "partitions", "outside 1-65536"),
        ({"lease_ttl": "3", "renew_interval": "2"}, "renew_interval", "renew_interval + 2 x rpc_timeout"),
        ({"safety_margin": "4"}, "safety_margin", "lease_ttl / 2"),
        ({"unsafe_disable_fencing": "true"}, "unsafe_disable_fencing", "refused outside test mode"),
        ({"unsafe_disable_fencing": "maybe"}, "unsafe_disable_fencing", "not a valid bool"),
        ({"no_such": "1"}, "no_such", "unknown setting"),
    ],
)
def test_invalid(flags: dict[str, str], field: str, reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHED_TEST_MODE", raising=False)
    with pytest.raises(InvalidArgument) as err:
        CoordinationSettings.load(flags, env={})
    assert err.value.field == field
    assert reason in err.value.reason


def test_unsafe_switch_allowed_in_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHED_TEST_MODE", "1")
    assert CoordinationSettings.load({"unsafe_disable_fencing": "true"}, env={}).unsafe_disable_fencing


def test_unknown_toml_key(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text("lease_tll = 5\n")
    with pytest.raises(InvalidArgument, match=r"config\.lease_tll: unknown setting"):
        CoordinationSettings.load({}, env={}, toml_file=f)


def test_etcd_prefix_shape() -> None:
    with pytest.raises(InvalidArgument) as err:
        EtcdSettings.load({"etcd_prefix": "sched/"}, env={})
    assert err.value.field == "etcd_prefix"


@pytest.mark.parametrize(
    ("flags", "field", "reason"),
    [
        ({"max_clock_skew": "0"}, "max_clock_skew", "outside 0.05-600 seconds"),
        ({"max_clock_skew": "soon"}, "max_clock_skew", "not a valid float"),
        ({"clock_probe_interval": "0.001"}, "clock_probe_interval", "0.05-60 seconds"),
        ({"unsafe_disable_clock_guard": "true"}, "unsafe_disable_clock_guard", "refused outside test mode"),
    ],
)
def test_clock_guard_settings_invalid(flags: dict[str, str], field: str, reason: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHED_TEST_MODE", raising=False)
    with pytest.raises(InvalidArgument) as err:
        PlannerSettings.load(flags, env={})
    assert err.value.field == field
    assert reason in err.value.reason


def test_clock_guard_settings_from_every_source(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text("max_clock_skew = 0.5\nclock_probe_interval = 2\n")
    s = PlannerSettings.load({}, env={}, toml_file=f)
    assert (s.max_clock_skew, s.clock_probe_interval, s.probe_rtt_bound) == (0.5, 2.0, 0.5)
    s = PlannerSettings.load({"clock_probe_interval": "0.25"}, env={"SCHED_MAX_CLOCK_SKEW": "2"}, toml_file=f)
    assert (s.max_clock_skew, s.clock_probe_interval) == (2.0, 0.25)
    assert PlannerSettings().max_clock_skew == 1.0 and PlannerSettings().probe_rtt_bound == 0.5
