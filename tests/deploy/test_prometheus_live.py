"""A real Prometheus (Debian's) scrapes a running `schedctl dev --regions 3` cluster with the shipped
scrape config and rule files, and every query of every dashboard panel returns data: the dashboard cannot
drift from the metrics unnoticed. Also: every target is up, every rule evaluates without error, and the
etcd metrics the rules read exist under those names in etcd 3.5.

The only change to the shipped prometheus.yml is the interval (1 s instead of 15 s, so that rates exist
within seconds); the target files name the dev cluster's loopback addresses. Serial: it starts 3 etcd
members, 3 planners, 3 workers and Prometheus (about a minute on the 2-core CI machine)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.infra.ports import is_bind_error, pick_port
from chaos.infra.procs import forget, spawn
from tests.deploy.test_dashboard import panel_exprs
from tests.deploy.tools import ETCD_METRICS, PROMETHEUS_DIR, tool

pytestmark = pytest.mark.etcd  # schedctl dev starts its own
BIN = Path(sys.executable).parent
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")} | {"XDG_CONFIG_HOME": "/nonexistent"}
RATE_INTERVAL = "20s"  # what Grafana's $__rate_interval stands for here (scrape interval 1 s)
ATTEMPTS = 5  # starts lost to a port another process took meanwhile


def wait_for(what: str, ready: Any, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout:g}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    forget(proc.pid)


@pytest.fixture(scope="module")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`schedctl dev --regions 3`; yields its ready text (API, etcd URLs, metrics URLs)."""
    base = tmp_path_factory.mktemp("dev")
    for _ in range(ATTEMPTS):
        log = base / "dev.log"
        listen = f"127.0.0.1:{pick_port()}"
        proc = spawn([str(BIN / "schedctl"), "dev", "--regions", "3", "--workers", "1", "--partitions", "8",
                      "--listen", listen, "--data-dir", str(base / "data")], log, env=CLEAN_ENV)
        try:
            wait_for("the cluster is ready", lambda f=log: "cluster ready" in f.read_text(errors="replace"), 240,
                     proc, log)
        except AssertionError:
            stop(proc)
            text = log.read_text(errors="replace")
            if "cannot listen" in text or is_bind_error(text):
                shutil.rmtree(base / "data", ignore_errors=True)
                log.rename(base / f"dev.{time.monotonic_ns()}.log")
                continue
            raise
        try:
            yield log.read_text()
        finally:
            stop(proc)
        return
    pytest.fail(f"schedctl dev lost its port {ATTEMPTS} times")


def schedctl(server: str, *args: str) -> None:
    r = subprocess.run([str(BIN / "schedctl"), *args, "--server", server], capture_output=True, text=True,
                       env=CLEAN_ENV, timeout=60, check=False)
    assert r.returncode == 0, r.stderr


def write_config(directory: Path, ready: str) -> Path:
    metrics = dict(re.findall(r"metrics  (\S+): http://(\S+)/metrics", ready))
    etcds = re.findall(r"etcd \S+ http://(\S+);", ready)
    assert len(etcds) == 3 and len(metrics) == 6, ready
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    (directory / "rules").symlink_to(PROMETHEUS_DIR / "rules")
    targets = directory / "targets"
    targets.mkdir()
    planners = [a for n, a in metrics.items() if "-p" in n]
    workers = [a for n, a in metrics.items() if "-w" in n]
    for name, addresses in (("planners", planners), ("workers", workers), ("etcd", etcds)):
        (targets / f"{name}.yml").write_text(yaml.safe_dump([{"targets": addresses}]))
    return directory / "prometheus.yml"


@pytest.fixture(scope="module")
def prometheus(dev_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("prometheus")
    config = write_config(base, dev_cluster)
    for attempt in range(ATTEMPTS):
        port = pick_port()
        log = base / f"prometheus{attempt}.log"
        proc = spawn([tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={base / f'data{attempt}'}",
                      f"--web.listen-address=127.0.0.1:{port}"], log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for("Prometheus is ready", lambda u=url: _ok(f"{u}/-/ready"), 60, proc, log)
        except AssertionError:
            stop(proc)
            if is_bind_error(log.read_text(errors="replace")):
                continue
            raise
        try:
            yield url
        finally:
            stop(proc)
        return
    pytest.fail(f"Prometheus lost its port {ATTEMPTS} times")


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def api(base: str, path: str, **params: str) -> Any:
    with urllib.request.urlopen(f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def results(base: str, expr: str) -> list[Any]:
    data = api(base, "query", query=expr.replace("$__rate_interval", RATE_INTERVAL))
    return list(data["result"])


def test_every_dashboard_query_returns_data(dev_cluster: str, prometheus: str) -> None:
    server = re.search(r"export SCHED_SERVER=(\S+)\)", dev_cluster)
    assert server, dev_cluster
    # Runs every second (executions, start lag, handler time) and one that dead-letters at once.
    schedctl(server.group(1), "schedule", "create", "--id", "tick", "--cron", "* * * * * *", "--command", "true")
    schedctl(server.group(1), "schedule", "create", "--id", "doomed", "--cron", "* * * * * *", "--command", "false",
             "--max-attempts", "1", "--max-unknown-attempts", "1")
    exprs = {e for es in panel_exprs().values() for e in es} | ETCD_METRICS | {"up"}
    deadline = time.monotonic() + 120
    empty = exprs
    while empty and time.monotonic() < deadline:
        empty = {e for e in empty if not results(prometheus, e)}
        time.sleep(2)
    assert not empty, f"queries without data after 120 s: {sorted(empty)}"
    by_panel = {title: [bool(results(prometheus, e)) for e in es] for title, es in panel_exprs().items()}
    assert all(all(v) for v in by_panel.values()), by_panel


def test_every_target_is_up_and_every_rule_evaluates(prometheus: str) -> None:
    deadline = time.monotonic() + 60  # file discovery hands targets over within about 5 s
    while time.monotonic() < deadline:
        targets = api(prometheus, "targets")["activeTargets"]
        groups = api(prometheus, "rules")["groups"]
        bad_targets = [(t["scrapeUrl"], t["lastError"]) for t in targets if t["health"] != "up"]
        bad_rules = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
        if len(targets) == 9 and not bad_targets and not bad_rules:
            break
        time.sleep(1)
    assert {t["labels"]["job"] for t in targets} == {"sched-planner", "sched-worker", "etcd"}
    assert len(targets) == 9 and not bad_targets and not bad_rules, (bad_targets, bad_rules)
    # The healthy cluster raises no page (a dead letter of the doomed schedule is a ticket).
    firing = api(prometheus, "alerts")["alerts"]
    assert not [a for a in firing if a["labels"]["severity"] == "page" and a["state"] == "firing"], firing
