"""`schedctl dev` as a newcomer runs it (README quickstart): the real binary, real etcd, planner and
worker children, the real CLI in a second "shell". Stopping it must leave no process behind."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.infra.etcd import free_port
from chaos.infra.ports import is_bind_error
from chaos.infra.procs import forget, spawn
from scheduler.planner.settings import PlannerSettings

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")} | {"XDG_CONFIG_HOME": "/nonexistent"}

pytestmark = pytest.mark.etcd  # it starts an etcd of its own


def descendants(pid: int) -> set[int]:
    """Every live descendant of pid, from /proc (no psutil dependency)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - found
        found |= frontier
    return found


def describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            out.append(f"{pid}: {b' '.join(argv).decode(errors='replace')}")
        except OSError:
            out.append(f"{pid}: (gone)")
    return "; ".join(out)


def printed_pids(text: str) -> set[int]:
    """The pids `schedctl dev` says it started (etcd, planner, workers)."""
    return {int(m) for m in re.findall(r"\bpid (\d+)", text)}


def assert_all_gone(direct: set[int], others: set[int]) -> None:
    """The children `schedctl dev` started must be gone when it returns; anything they started must
    follow within a moment (a helper they ran may still be exiting), or it is an orphan."""
    left = sorted(p for p in direct if alive(p))
    assert not left, f"children left running: {describe(left)}"
    deadline = time.monotonic() + 5
    while any(alive(p) for p in others - direct):
        assert time.monotonic() < deadline, f"orphans: {describe(sorted(p for p in others if alive(p)))}"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Dev:
    """`schedctl dev` as a user starts it. `--listen` needs a fixed port, and dev picks etcd's and the
    metrics ports itself by bind-and-release: on a busy machine one of them may be taken before it
    is bound. Such a start (the process exits before "cluster ready", its output naming a taken
    address) is retried on new ports a bounded number of times; any other exit fails the test."""

    ATTEMPTS = 5

    def __init__(self, tmp: Path, workers: int = 2, data_dir: Path | None = None, regions: int = 1,
                 extra: tuple[str, ...] = ()) -> None:
        self.tmp, self.workers, self.data_dir, self.regions, self.extra = tmp, workers, data_dir, regions, extra
        self.log = tmp / "dev.log"
        self.bind_retries = 0
        self._spawn()

    def _spawn(self) -> None:
        self.port = free_port()
        self.server = f"127.0.0.1:{self.port}"
        argv = [SCHEDCTL, "dev", "--listen", self.server, "--workers", str(self.workers)]
        if self.regions != 1:
            argv += ["--regions", str(self.regions)]
        if self.data_dir is not None:
            argv += ["--data-dir", str(self.data_dir)]
        self.proc = spawn([*argv, *self.extra], self.log, env=CLEAN_ENV)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while "cluster ready" not in self.text():
            if self.proc.poll() is not None and is_bind_error(self.text()) and self.bind_retries < self.ATTEMPTS:
                self._start_over()
                deadline = time.monotonic() + timeout
                continue
            assert self.proc.poll() is None, f"schedctl dev exited {self.proc.returncode}:\n{self.text()}"
            assert time.monotonic() < deadline, f"schedctl dev not ready in {timeout}s:\n{self.text()}"
            time.sleep(0.2)

    def _start_over(self) -> None:
        forget(self.proc.pid)  # exited, and it stopped its children (it says so: "stopped")
        self.bind_retries += 1
        self.log.rename(self.log.with_suffix(f".bind{self.bind_retries}.log"))  # kept for diagnosis
        if self.data_dir is not None:  # fresh for the test: its ports.json may name the taken port
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self._spawn()

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"schedctl dev did not stop within {timeout}s:\n{self.text()}") from None
        forget(self.proc.pid)
        return rc


@pytest.fixture
def dev_factory(tmp_path: Path) -> Iterator[list[Dev]]:
    started: list[Dev] = []
    yield started
    for d in started:
        kids = descendants(d.proc.pid)
        if d.proc.poll() is None:
            d.stop(signal.SIGKILL)
        for pid in kids:  # last resort, by pid: the test failed before checking them
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def schedctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCHEDCTL, *args], env=CLEAN_ENV, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_readme_quickstart(dev_factory: list[Dev], tmp_path: Path) -> None:
    dev = Dev(tmp_path)
    dev_factory.append(dev)
    dev.wait_ready()
    out = dev.text()
    assert f"API      {dev.server}" in out
    data_dir = Path(re.search(r"data in (\S+)", out)[1])  # type: ignore[index]
    assert data_dir.is_dir()
    urls = re.findall(r"metrics  \S+: (http://\S+)", out)
    if any(f.name == "metrics_address" for f in dataclasses.fields(PlannerSettings)):
        assert len(urls) == 1 + 2, out  # the planner and each worker
        for url in urls:
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert resp.status == 200 and b"# HELP" in resp.read()
    else:
        assert "metrics  (not available in this build)" in out and not urls
    kids = descendants(dev.proc.pid)
    # etcd, the planner and two workers, by the pids it printed.
    assert len(printed_pids(out)) == 4 and printed_pids(out) <= kids, (out, kids)

    # The second shell: the README's commands.
    r = schedctl("schedule", "create", "--server", dev.server, "--id", "hello", "--cron", "*/5 * * * * *",
                 "--command", "echo hello from $SCHED_EXECUTION_ID")
    assert r.returncode == 0, r.stderr + dev.text()
    deadline = time.monotonic() + 60
    done: list[dict[str, object]] = []
    while len(done) < 2:
        r = schedctl("exec", "list", "--server", dev.server, "--schedule", "hello", "--json")
        assert r.returncode == 0, r.stderr
        done = [e for e in json.loads(r.stdout)["executions"] if e["state"] == "EXECUTION_STATE_SUCCEEDED"]
        assert time.monotonic() < deadline, f"fewer than two successful runs in 60s: {r.stdout}"
        time.sleep(1)
    assert all(str(e["execution_id"]).startswith("hello@") for e in done)
    r = schedctl("exec", "list", "--server", dev.server, "--schedule", "hello")
    assert r.returncode == 0 and "succeeded" in r.stdout
    # The command's output is kept on the attempt and shown by exec get (issue 9).
    first = str(done[-1]["execution_id"])
    r = schedctl("exec", "get", "--server", dev.server, first)
    assert r.returncode == 0 and f"hello from {first}" in r.stdout and "stdout (tail)" in r.stdout, r.stdout

    kids |= descendants(dev.proc.pid)  # shell commands running right now too
    assert dev.stop(signal.SIGTERM) == 0, dev.text()
    assert "stopped" in dev.text()
    assert_all_gone(printed_pids(out), kids)
    assert not data_dir.exists(), "the temporary data directory was not removed"


def test_plaintext_is_said_once_and_tls_is_one_flag_away(dev_factory: list[Dev], tmp_path: Path) -> None:
    """`schedctl dev --tls --certs DIR`: etcd, the planner and the worker over mutual TLS with `schedctl certs
    dev` certificates; schedctl gets in with the printed SCHED_TLS_* and not without."""
    certs = tmp_path / "certs"
    dev = Dev(tmp_path, workers=1, extra=("--tls", "--certs", str(certs)))
    dev_factory.append(dev)
    dev.wait_ready()
    out = dev.text()
    assert "plaintext on loopback" not in out and "mutual TLS everywhere" in out, out
    env_line = re.search(r"schedctl needs: export (.+)", out)
    assert env_line is not None, out
    tls_env = dict(kv.split("=", 1) for kv in env_line[1].split())
    assert tls_env["SCHED_TLS_CERT_FILE"] == str(certs / "admin.crt")
    etcd_url = re.search(r"etcd     pid \d+, (\S+),", out)
    assert etcd_url is not None and etcd_url[1].startswith("https://"), out

    def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SCHEDCTL, *args, "--server", dev.server], env=CLEAN_ENV | env, capture_output=True,
                              text=True, timeout=60, check=False)

    r = run("schedule", "create", "--id", "tls-hello", "--cron", "*/2 * * * * *", "--command", "echo hi", env=tls_env)
    assert r.returncode == 0, r.stderr + dev.text()
    deadline = time.monotonic() + 60
    while True:
        r = run("exec", "list", "--schedule", "tls-hello", "--state", "succeeded", "--json", env=tls_env)
        assert r.returncode == 0, r.stderr
        if json.loads(r.stdout)["executions"]:
            break
        assert time.monotonic() < deadline, "no successful run over mutual TLS in 60 s"
        time.sleep(1)
    r = run("exec", "list", "--schedule", "tls-hello", "--timeout", "3", env={})  # plaintext: refused
    assert r.returncode == 5, r.stderr
    assert dev.stop(signal.SIGTERM) == 0, dev.text()
    assert (certs / "ca.crt").exists()  # --certs is kept

    (tmp_path / "plain").mkdir()
    plain = Dev(tmp_path / "plain", workers=0)
    dev_factory.append(plain)
    plain.wait_ready()
    text = plain.text()
    assert text.count("plaintext on loopback") == 1 and "TLS      off" in text, text
    assert plain.stop(signal.SIGTERM) == 0


def test_sigkilled_dev_leaves_no_orphans(dev_factory: list[Dev], tmp_path: Path) -> None:
    data = tmp_path / "data"
    dev = Dev(tmp_path, workers=1, data_dir=data)
    dev_factory.append(dev)
    dev.wait_ready()
    kids = descendants(dev.proc.pid)
    assert len(kids) >= 3, kids
    dev.stop(signal.SIGKILL)  # no handler runs: only the parent-death signal can clean up
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in kids):
        assert time.monotonic() < deadline, f"orphans: {[p for p in kids if alive(p)]}"
        time.sleep(0.1)
    assert (data / "etcd").is_dir() and (data / "logs" / "planner.log").is_file()  # --data-dir is kept


def test_bad_options_exit_2_naming_the_field() -> None:
    r = schedctl("dev", "--listen", "localhost")
    assert r.returncode == 2 and "listen: 'localhost' is not host:port" in r.stderr
    r = schedctl("dev", "--workers", "-1")
    assert r.returncode == 2 and "workers: -1 is outside 0-64" in r.stderr
    r = schedctl("dev", "--listen", f"127.0.0.1:{free_port()}", "--certs", "/nonexistent")
    assert r.returncode == 2 and "certs: --certs goes with --tls" in r.stderr, r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        r = schedctl("dev", "--listen", address)
    assert r.returncode == 2 and f"listen: cannot listen on {address}: Address already in use" in r.stderr


def test_ctrl_c_reaches_only_the_supervisor_which_stops_every_child(dev_factory: list[Dev], tmp_path: Path) -> None:
    dev = Dev(tmp_path, workers=1)
    dev_factory.append(dev)
    dev.wait_ready()
    kids = descendants(dev.proc.pid)
    # A terminal's Ctrl-C signals its foreground process group; the children have their own, so
    # only the supervisor gets it, as here.
    own = os.getpgid(dev.proc.pid)
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):  # gone already
            assert os.getpgid(pid) != own, f"child {pid} shares the supervisor's process group"
    assert dev.stop(signal.SIGINT) == 0, dev.text()
    assert "SIGINT: stopping workers, planner, etcd" in dev.text()
    direct = printed_pids(dev.text())
    assert len(direct) == 3 and direct <= kids  # etcd, the planner, one worker
    assert_all_gone(direct, kids)


def test_three_regions_r1_plans_and_a_switchover_moves_it(dev_factory: list[Dev], tmp_path: Path) -> None:
    """`schedctl dev --regions 3`: an etcd member, a planner and a worker per region, r1 primary; one line
    per region; `region switchover` moves planning; Ctrl-C stops every child."""
    dev = Dev(tmp_path, workers=1, regions=3)
    dev_factory.append(dev)
    dev.wait_ready(timeout=120)
    text = dev.text()
    assert "3-region cluster ready" in text
    for line in ("r1 (primary)", "r2 (standby)", "r3 (standby)"):
        assert line in text, text
    kids = descendants(dev.proc.pid)
    st = json.loads(schedctl("region", "status", "--json", "--server", dev.server).stdout)
    assert st["region_policy"]["primary_region"] == "r1" and st["region_policy"]["standby_regions"] == ["r2", "r3"]
    assert {p["owner_region"] for p in st["partitions"]} == {"r1"}
    r = schedctl("region", "switchover", "--to", "r2", "--server", dev.server, "--timeout", "60")
    assert r.returncode == 0 and "switchover complete: r2 owns every partition" in r.stdout, r.stdout + r.stderr
    assert dev.stop(signal.SIGINT) == 0, dev.text()
    assert "stopping workers, planners, etcd" in dev.text()
    assert_all_gone(kids, kids)
