"""Auth settings at start: a planner off loopback refuses to run with every call allowed unless told so;
`schedctl auth token` makes a token its printed entry admits; bool settings work as bare switches."""

from __future__ import annotations

import tomllib

import pytest

from scheduler.auth.tokens import StaticTokens
from scheduler.cli.main import main
from scheduler.config import TlsSettings
from scheduler.errors import InvalidArgument
from scheduler.planner.settings import PlannerSettings, is_loopback, refuse_open_api


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.5.0.1", True), ("::1", True),
                                                ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                                ("::", False), ("10.0.0.5", False), ("planner-1", False)])
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_planner_off_loopback_needs_auth_or_insecure() -> None:
    with pytest.raises(InvalidArgument) as e:
        refuse_open_api("0.0.0.0", "", insecure=False)
    assert e.value.field == "auth_file" and "insecure" in e.value.reason
    refuse_open_api("0.0.0.0", "", insecure=True)
    refuse_open_api("0.0.0.0", "/etc/sched/auth.toml", insecure=False)
    refuse_open_api(PlannerSettings().api_host, "", insecure=False)  # the default stays open, on loopback
    assert TlsSettings.load({"insecure": None}, env={"SCHED_INSECURE": "1"}).insecure  # one switch for both


def test_schedctl_planner_off_loopback_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["planner", "--api-host", "0.0.0.0", "--etcd-endpoints", "127.0.0.1:1"]) == 2
    assert "auth_file: the API would listen on 0.0.0.0 with every call allowed" in capsys.readouterr().err


def test_schedctl_auth_token_prints_a_token_its_entry_admits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["auth", "token", "ci", "-p", "payments:writer", "-p", "payments-pool:worker"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert token.startswith("sched_") and token not in err
    tokens = StaticTokens.parse(tomllib.loads(err), "stderr")
    assert tokens.verify(token).name == "token:ci"
    assert {str(g) for g in tokens.verify(token).grants} == {"payments:writer", "payments-pool:worker"}
    assert main(["auth", "token", "ci", "-p", "payments:owner"]) == 2
    assert "permission[0]" in capsys.readouterr().err
