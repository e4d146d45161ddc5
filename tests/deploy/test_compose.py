"""deploy/compose: valid against the compose specification (check-jsonschema's vendored copy), and the
cluster it describes is the one the docs promise: three etcd members that form one cluster, two planners and
two workers per region with unique ids and addresses, Prometheus scraping every one of them, nothing
published beyond 127.0.0.1, and settings files the real settings classes accept."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.config import CoordinationSettings, EtcdSettings, TlsSettings
from scheduler.planner.settings import PlannerSettings
from scheduler.worker.settings import WorkerSettings
from tests.deploy.tools import DEPLOY, run, tool

COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
REGIONS = ("r1", "r2", "r3")
# What the image sets in its environment (deploy/Dockerfile): the environment beats a TOML file, so a
# shipped TOML file that set one of these would be silently ignored.
IMAGE_ENV_SETTINGS = frozenset({"api_host", "api_port", "health_address", "metrics_address"})
PLANNER_CLASSES = (EtcdSettings, CoordinationSettings, PlannerSettings, TlsSettings)  # as schedctl planner loads them


def services() -> dict[str, Any]:
    svcs: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return svcs


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE))


def test_three_etcd_members_form_one_cluster() -> None:
    etcds = {n: s for n, s in services().items() if n.startswith("etcd-")}
    assert sorted(etcds) == [f"etcd-{r}" for r in REGIONS]
    initial = {flag.partition("=")[2] for s in etcds.values() for flag in s["command"]
               if flag.startswith("--initial-cluster=")}
    assert initial == {",".join(f"etcd-{r}=https://etcd-{r}:2380" for r in REGIONS)}  # peers over TLS
    for name, s in etcds.items():
        assert f"--name={name}" in s["command"] and "--auto-compaction-mode=periodic" in s["command"]


def test_planners_and_workers_per_region_with_unique_ids() -> None:
    svcs = services()
    planners = {n: s for n, s in svcs.items() if s.get("command", [None])[0] == "planner"}
    workers = {n: s for n, s in svcs.items() if s.get("command", [None])[0] == "worker"}
    for r in REGIONS:
        assert len([p for p in planners.values() if p["environment"]["SCHED_REGION"] == r]) == 2, r
        assert len([w for w in workers.values() if w["environment"]["SCHED_REGION"] == r]) == 2, r
    node_ids = [p["environment"]["SCHED_NODE_ID"] for p in planners.values()]
    assert len(set(node_ids)) == len(node_ids), "node ids must be unique (owner keys name them)"
    for name, p in planners.items():
        # What workers and peers dial must be this service's own name, not 0.0.0.0 or another node.
        assert p["environment"]["SCHED_API_ADDRESS"] == f"{name}:7000"
        assert p["environment"]["SCHED_ETCD_ENDPOINTS"].split(",")[0] == f"etcd-{p['environment']['SCHED_REGION']}:2379"
    for w in workers.values():
        seeds = w["environment"]["SCHED_PLANNERS"].split(",")
        assert all(s.removesuffix(":7000") in planners for s in seeds), seeds
    for s in (*planners.values(), *workers.values()):
        assert s["read_only"] is True and "/tmp" in s["tmpfs"]


def test_only_loopback_is_published() -> None:
    for name, s in services().items():
        for port in s.get("ports", ()):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond this host"


def _targets(name: str) -> set[str]:
    groups = yaml.safe_load((COMPOSE_DIR / "prometheus-targets" / f"{name}.yml").read_text())
    return {t for g in groups for t in g["targets"]}


def test_prometheus_scrapes_every_planner_worker_and_etcd_member() -> None:
    svcs = services()
    by_role = {role: {f"{n}:9100" for n, s in svcs.items() if s.get("command", [None])[0] == role}
               for role in ("planner", "worker")}
    assert _targets("planners") == by_role["planner"]
    assert _targets("workers") == by_role["worker"]
    # etcd's client port requires a client certificate: its /metrics are scraped on --listen-metrics-urls.
    assert _targets("etcd") == {f"etcd-{r}:2381" for r in REGIONS}
    for r in REGIONS:
        assert "--listen-metrics-urls=http://0.0.0.0:2381" in svcs[f"etcd-{r}"]["command"]


def test_mutual_tls_everywhere() -> None:
    """Secure by default: every etcd member requires client certificates (peers too), every planner and worker
    gets certificate files, nothing sets insecure, and the certificates name every service dialled."""
    svcs = services()
    env_files = {n: [(COMPOSE_DIR / f).read_text() for f in s.get("env_file", ())] for n, s in svcs.items()}
    sans = svcs["certs"]["command"]
    for name, s in svcs.items():
        cmd = s.get("command", [])
        assert "SCHED_INSECURE" not in str(s.get("environment", {})) + "".join(env_files[name]), name
        if name.startswith("etcd-"):
            assert {"--client-cert-auth", "--peer-client-cert-auth"} <= set(cmd), name
            assert all(u.startswith("https://") for c in cmd if c.startswith(("--listen-client", "--advertise"))
                       for u in [c.partition("=")[2]]), name
            assert name in sans
        elif cmd and cmd[0] in ("planner", "worker"):
            text = "".join(env_files[name])
            assert "SCHED_TLS_CERT_FILE=" in text and "SCHED_TLS_CA_FILE=" in text, name
            if cmd[0] == "planner":
                assert "SCHED_ETCD_CERT_FILE=" in text and name in sans, name


def test_authorization_is_on_from_compose_secrets() -> None:
    """Every planner gets the authorization file and its token file as compose secrets, planner.toml names it
    and sets no insecure, and its [certs] give the certificates the `certs` job writes (schedctl certs dev)
    the roles each service needs: planners their peers' calls, workers pool default, admin everything."""
    import tomllib

    from scheduler.auth.config import load_auth_file
    from scheduler.certs import LEAVES

    settings = tomllib.loads((COMPOSE_DIR / "config" / "planner.toml").read_text())
    assert "insecure" not in settings and settings["auth_file"] == "/run/secrets/auth.toml"
    top = yaml.safe_load(COMPOSE.read_text())["secrets"]
    for name, s in services().items():
        if s.get("command", [None])[0] == "planner":
            targets = {x["target"]: top[x["source"]]["file"] for x in s["secrets"]}
            assert targets == {"auth.toml": "./config/auth.toml", "tokens.toml": "./config/tokens.toml"}, name
    cfg = load_auth_file(str(COMPOSE_DIR / "config" / "auth.toml"))  # tokens.toml beside it, as in /run/secrets
    assert cfg.tokens is not None and cfg.tokens_file is not None
    cn = {leaf.name: leaf.common_name for leaf in LEAVES}
    roles = {ident: sorted(str(g) for g in grants) for ident, grants in cfg.certs.items()}
    assert roles == {cn["planner"]: ["system:planner"], cn["worker"]: ["default:worker"],
                     cn["admin"]: ["system:admin"]}
    worker = tomllib.loads((COMPOSE_DIR / "config" / "worker.toml").read_text())
    assert worker["pool"] == "default"


def test_mounted_files_exist() -> None:
    for name, s in services().items():
        for v in s.get("volumes", ()):
            src = v.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE_DIR / src).exists(), f"{name} mounts {src}, which does not exist"


def _names(*classes: type) -> frozenset[str]:
    return frozenset(f.name for c in classes for f in dataclasses.fields(c))


@pytest.mark.parametrize("toml", sorted(DEPLOY.rglob("planner.toml")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_planner_settings_files_load(toml: Path) -> None:
    every = _names(*PLANNER_CLASSES)
    for cls in PLANNER_CLASSES:
        cls.load({}, env={}, toml_file=toml, shared_keys=every - _names(cls))
    assert not IMAGE_ENV_SETTINGS & _keys(toml)


@pytest.mark.parametrize("toml", sorted(DEPLOY.rglob("worker.toml")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_worker_settings_files_load(toml: Path) -> None:
    WorkerSettings.load({}, env={}, toml_file=toml)
    assert not IMAGE_ENV_SETTINGS & _keys(toml)


def _keys(toml: Path) -> set[str]:
    import tomllib

    return set(tomllib.loads(toml.read_text()))
