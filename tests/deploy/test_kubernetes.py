"""deploy/kubernetes: every overlay renders with `kubectl kustomize` and passes `kubernetes-validate --strict`
(offline: the schemas ship in the wheel) against the oldest and the newest Kubernetes we support, and the
rendered objects keep the promises docs/deploy.md makes: gRPC health probes, non-root read-only pods, a PDB
and a NetworkPolicy per workload, stable and unique node ids, references that resolve, PodMonitors that
select real ports, and a PrometheusRule that promtool accepts and that matches the rule files."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.tools import DEPLOY, ROOT, run, tool

K8S = DEPLOY / "kubernetes"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
REGIONS = ("region-r1", "region-r2", "region-r3")
# The oldest release we support (gRPC probes are GA since 1.27) and kubernetes-validate's newest.
K8S_VERSIONS = ("1.29.0", "1.37.0")
CRD_GROUPS = ("monitoring.coreos.com/",)  # Prometheus Operator kinds: no schema in kubernetes-validate
# Made by the operator, not by kustomize (docs/deploy.md, "Kubernetes").
EXTERNAL_SECRETS = frozenset({"sched-etcd-client-tls", "sched-planner-tls", "sched-worker-tls", "sched-auth"})


@functools.cache
def rendered(overlay: str) -> str:
    return run(tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)).stdout


def objects(overlay: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(rendered(overlay)) if o]


def of_kind(overlay: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in objects(overlay) if o["kind"] == kind]


def workloads(overlay: str) -> Iterator[dict[str, Any]]:
    yield from (o for o in objects(overlay) if o["kind"] in ("Deployment", "StatefulSet"))


def sched_workloads(overlay: str) -> Iterator[dict[str, Any]]:
    yield from (w for w in workloads(overlay) if w["spec"]["template"]["metadata"]["labels"].get(
        "app.kubernetes.io/name") == "sched")


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", ())}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_the_overlays_are_the_documented_ones() -> None:
    assert sorted(["single-region", "try-out", *REGIONS]) == OVERLAYS


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_overlay_validates_strictly(overlay: str, version: str, tmp_path: Path) -> None:
    out = tmp_path / f"{overlay}.yaml"
    out.write_text(rendered(overlay))
    r = run(tool("kubernetes-validate"), "--strict", "--kubernetes-version", version, "--quiet", str(out))
    warnings = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    # Only the CRDs may go unchecked here; test_prometheus_operator_objects checks them instead.
    assert all("Couldn't find schema" in w and any(g in w for g in CRD_GROUPS) for w in warnings), warnings


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_as_non_root_on_a_read_only_root(overlay: str) -> None:
    for w in workloads(overlay):
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, w["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_planners_and_workers_are_probed_on_grpc_health(overlay: str) -> None:
    kinds = {}
    for w in sched_workloads(overlay):
        c = w["spec"]["template"]["spec"]["containers"][0]
        kinds[c["args"][0]] = w["kind"]
        # The plaintext health port: the kubelet's gRPC probe presents no client certificate to the mTLS API.
        assert c["livenessProbe"]["grpc"]["port"] == 7001 and c["readinessProbe"]["grpc"]["port"] == 7001
        # CPU throttling freezes a planner past its lease: no CPU limit (docs/deploy.md, "Sizing").
        assert "cpu" not in c["resources"]["limits"]
    assert kinds == {"planner": "StatefulSet", "worker": "Deployment"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_has_a_pdb_and_a_network_policy(overlay: str) -> None:
    pdbs = of_kind(overlay, "PodDisruptionBudget")
    policies = of_kind(overlay, "NetworkPolicy")
    for w in sched_workloads(overlay):
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert [p for p in pdbs if selects(p["spec"]["selector"], labels)], w["metadata"]["name"]
        assert [p for p in policies if selects(p["spec"]["podSelector"], labels)], w["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve(overlay: str) -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in objects(overlay)}
    for w in workloads(overlay):
        pod = w["spec"]["template"]["spec"]
        if "serviceAccountName" in pod:
            assert ("ServiceAccount", pod["serviceAccountName"]) in names
        for v in pod.get("volumes", ()):
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in names, v
            if "secret" in v:
                assert v["secret"]["secretName"].removeprefix(_prefix(overlay)) in EXTERNAL_SECRETS, v
        for c in pod["containers"]:
            for ref in c.get("envFrom", ()):
                assert ("ConfigMap", ref["configMapRef"]["name"]) in names, ref
    for cm in of_kind(overlay, "ConfigMap"):
        if "SCHED_PLANNERS" in cm.get("data", {}):
            for seed in cm["data"]["SCHED_PLANNERS"].split(","):
                assert ("Service", seed.rpartition(":")[0]) in names, f"workers' seed {seed} is no Service"


def _prefix(overlay: str) -> str:
    return overlay.removeprefix("region-") + "-" if overlay in REGIONS else ""


def test_node_ids_are_pod_names_unique_across_regions() -> None:
    """The node id is the StatefulSet pod's name, so the StatefulSets of a stretched cluster must differ."""
    sets = []
    for overlay in REGIONS:
        (sts,) = [w for w in sched_workloads(overlay) if w["kind"] == "StatefulSet"]
        e = env(sts["spec"]["template"]["spec"]["containers"][0])
        assert e["SCHED_NODE_ID"] == "$(POD_NAME)" and e["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        sets.append(sts["metadata"]["name"])
        (cm,) = [c for c in of_kind(overlay, "ConfigMap") if "SCHED_REGION" in c.get("data", {})]
        assert cm["data"]["SCHED_REGION"] == overlay.removeprefix("region-")
        first = cm["data"]["SCHED_ETCD_ENDPOINTS"].split(",")[0]
        assert first.startswith(f"etcd-{overlay.removeprefix('region-')}."), "this region's member first"
    assert len(set(sets)) == len(REGIONS), sets


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mutual_tls_unless_the_try_out_says_insecure(overlay: str) -> None:
    """Secure by default: planners and workers get certificate files from secrets; only the try-out runs
    plaintext, and says so with SCHED_INSECURE=true (without it they would refuse to start off loopback)."""
    insecure = [c["data"].get("SCHED_INSECURE") for c in of_kind(overlay, "ConfigMap") if "SCHED_INSECURE" in
                c.get("data", {})]
    for w in sched_workloads(overlay):
        pod = w["spec"]["template"]["spec"]
        e = env(pod["containers"][0])
        if overlay == "try-out":
            assert not [n for n in e if n.startswith("SCHED_TLS_")], w["metadata"]["name"]
            assert not [v for v in pod["volumes"] if "secret" in v]
        else:
            assert {"SCHED_TLS_CERT_FILE", "SCHED_TLS_KEY_FILE", "SCHED_TLS_CA_FILE"} <= set(e), w["metadata"]["name"]
            mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
            assert str(Path(e["SCHED_TLS_CERT_FILE"]).parent) in mounts  # a directory mount: renewals reach it
    assert insecure == (["true"] if overlay == "try-out" else [])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_authorization_on_unless_the_try_out_turns_it_off(overlay: str) -> None:
    """The shipped planner.toml names an auth file in the sched-auth secret, mounted as a directory (so that
    its token file and key set reload), and never sets insecure; only the try-out empties auth_file, and says
    insecure with it."""
    import tomllib

    settings = tomllib.loads((K8S / "base" / "config" / "planner.toml").read_text())
    assert "insecure" not in settings
    auth_dir = str(Path(settings["auth_file"]).parent)
    data = {k: v for c in of_kind(overlay, "ConfigMap") for k, v in c.get("data", {}).items()}
    (sts,) = [w for w in sched_workloads(overlay) if w["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"].removeprefix(_prefix(overlay))
               for v in pod["volumes"] if "secret" in v}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    if overlay == "try-out":
        assert data.get("SCHED_AUTH_FILE") == "" and data.get("SCHED_INSECURE") == "true"
        assert "sched-auth" not in secrets.values()
    else:
        assert "SCHED_AUTH_FILE" not in data
        (name,) = [n for n, s in secrets.items() if s == "sched-auth"]
        assert mounts[name]["mountPath"] == auth_dir and "subPath" not in mounts[name]


def test_the_example_auth_file_loads() -> None:
    import tomllib

    from scheduler.auth.config import parse_auth
    data = tomllib.loads((K8S / "auth.example.toml").read_text())
    data.pop("tokens_file")  # a file the operator makes
    cfg = parse_auth(data)
    assert {str(g) for g in cfg.certs["sched-planner"]} == {"system:planner"}


def test_try_out_points_the_planners_at_its_own_etcd_without_tls() -> None:
    (etcd,) = [w for w in workloads("try-out") if w["metadata"]["name"] == "etcd"]
    members = {f"etcd-{i}.etcd:2379" for i in range(etcd["spec"]["replicas"])}
    (cm,) = [c for c in of_kind("try-out", "ConfigMap") if "SCHED_ETCD_ENDPOINTS" in c.get("data", {})]
    assert set(cm["data"]["SCHED_ETCD_ENDPOINTS"].split(",")) == members
    (sts,) = [w for w in sched_workloads("try-out") if w["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "secret" in v]
    assert not [n for n in env(pod["containers"][0]) if n.startswith("SCHED_ETCD_")]


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_prometheusrule", ROOT / "scripts" / "gen_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prometheusrule_is_generated_from_the_rule_files() -> None:
    gen = _load_generator()
    assert gen.OUT.read_text() == gen.render(), "stale: run scripts/gen_prometheusrule.py"


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != "try-out"])
def test_prometheus_operator_objects(overlay: str, tmp_path: Path) -> None:
    """kubernetes-validate has no schema for these kinds: promtool checks the rules, and each PodMonitor must
    select pods that have the port it scrapes."""
    (rule,) = of_kind(overlay, "PrometheusRule")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    run(tool("promtool"), "check", "rules", str(rules))
    monitors = of_kind(overlay, "PodMonitor")
    assert len(monitors) == 2
    for m in monitors:
        pods = [w["spec"]["template"] for w in workloads(overlay)
                if selects(m["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        assert len(pods) == 1, m["metadata"]["name"]
        ports = {p["name"] for c in pods[0]["spec"]["containers"] for p in c["ports"]}
        assert {e["port"] for e in m["spec"]["podMetricsEndpoints"]} <= ports
