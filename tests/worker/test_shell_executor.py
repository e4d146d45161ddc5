"""The shell executor with real /bin/sh processes: exit-code classes, environment, timeouts, kills."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from scheduler.worker import PermanentError, TaskTimeout, TransientError
from scheduler.worker.attempt import ErrorClass, classify
from scheduler.worker.executors.shell import CommandFailed, ShellExecutor
from tests.worker.conftest import make_ctx


def _payload(command: str, **kw: object) -> bytes:
    import json

    return json.dumps({"command": command, **kw}).encode()


def _dead(pid: int) -> bool:
    """Gone or a zombie waiting for a parent to reap it: either way it runs no more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_success_sees_the_execution_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHED_PLANNERS", "10.0.0.1:7000")  # the worker's own settings stay private
    out = tmp_path / "env"
    cmd = ('printf "%s\\n" "$SCHED_EXECUTION_ID" "$SCHED_SCHEDULE_ID" "$SCHED_PLANNED_AT" "$SCHED_ATTEMPT" '
           f'"$SCHED_FENCING_TOKEN" "$GREETING" "${{SCHED_PLANNERS-unset}}" > {out}')
    await ShellExecutor()(make_ctx(), _payload(cmd, env={"GREETING": "hi", "SCHED_ATTEMPT": "99"}))
    assert out.read_text().splitlines() == [
        "nightly@2026-03-08T07:00:00.000Z", "nightly", "2026-03-08T07:00:00.000Z", "3", "12:9001", "hi", "unset"]


@pytest.mark.parametrize(
    ("code", "exc", "error_class"),
    [
        (75, TransientError, ErrorClass.TRANSIENT),  # EX_TEMPFAIL
        (65, PermanentError, ErrorClass.PERMANENT),  # EX_DATAERR
        (64, PermanentError, ErrorClass.PERMANENT),  # EX_USAGE
        (78, PermanentError, ErrorClass.PERMANENT),  # EX_CONFIG
        (3, CommandFailed, ErrorClass.UNKNOWN),
        (79, CommandFailed, ErrorClass.UNKNOWN),
        (1, CommandFailed, ErrorClass.UNKNOWN),
    ],
)
async def test_exit_codes(code: int, exc: type[Exception], error_class: ErrorClass) -> None:
    with pytest.raises(exc) as info:
        await ShellExecutor()(make_ctx(), _payload(f"echo something went wrong >&2; exit {code}"))
    assert classify(info.value).error_class is error_class
    assert f"exit code {code}" in str(info.value) and "something went wrong" in str(info.value)


async def test_killed_by_signal_is_unknown() -> None:
    with pytest.raises(CommandFailed, match="killed by signal SIGKILL"):
        await ShellExecutor()(make_ctx(), _payload("kill -9 $$"))


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    ex = ShellExecutor(kill_grace=0.5)
    with pytest.raises(TaskTimeout, match=r"0\.3 s timeout") as info:
        await ex(make_ctx(), _payload(f"sleep 30 & echo $! > {pidfile}; echo started; wait", timeout_s=0.3))
    assert classify(info.value).error_class is ErrorClass.TIMEOUT
    assert "started" in str(info.value)
    child = int(pidfile.read_text())
    await asyncio.sleep(0.1)
    assert _dead(child), "the background child of the shell was killed too"


async def test_worker_deadline_limits_the_command(tmp_path: Path) -> None:
    with pytest.raises(TaskTimeout):
        await ShellExecutor(kill_grace=0.2)(make_ctx(timeout=0.3), _payload("sleep 30", timeout_s=60))


async def test_cancel_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    ex = ShellExecutor(kill_grace=0.5)
    task = asyncio.create_task(ex(make_ctx(), _payload(f"trap '' TERM; sleep 30 & echo $! > {pidfile}; wait")))
    while not pidfile.exists() or not pidfile.read_text().strip():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _dead(int(pidfile.read_text())), "SIGKILL after the grace reached a child that ignored SIGTERM"


async def test_a_stop_request_sigterms_the_group_at_once(tmp_path: Path) -> None:
    """A planner's Cancel sets ctx.cancel_event; the command gets SIGTERM then, not when the worker cancels
    the handler's task `cancel_grace` (5 s) later. (It did: a game day's `cancel_other` runs each waited
    2-4 s for the run they cancelled to finish by itself.) Fails on the old executor: the wait below
    times out, the command running on."""
    marker, ready = tmp_path / "term", tmp_path / "ready"
    ctx = make_ctx()
    ex = ShellExecutor(kill_grace=5.0)  # a graceful exit: no SIGKILL needed
    task = asyncio.create_task(ex(ctx, _payload(
        f"trap 'echo got TERM > {marker}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done")))
    while not ready.exists():
        await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    ctx.cancel_event.set()
    await asyncio.wait_for(task, 3.0)  # exit 0 from its trap; the attempt's stop decides its outcome (CANCELLED)
    assert marker.read_text().strip() == "got TERM"
    assert loop.time() - asked < 3.0


async def test_a_stop_request_sigkills_what_ignores_sigterm_after_the_kill_grace(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    ctx = make_ctx()
    task = asyncio.create_task(ShellExecutor(kill_grace=0.3)(
        ctx, _payload(f"trap '' TERM; sleep 30 & echo $! > {pidfile}; wait")))
    while not pidfile.exists() or not pidfile.read_text().strip():
        await asyncio.sleep(0.01)
    ctx.cancel_event.set()
    with pytest.raises(CommandFailed, match="SIGKILL"):
        await asyncio.wait_for(task, 3.0)
    assert _dead(int(pidfile.read_text())), "SIGKILL after the grace reached a child that ignored SIGTERM"


async def test_a_cancelled_shell_attempt_is_cancelled_and_logs_no_unretrieved_exception(tmp_path: Path) -> None:
    """Through the worker's Attempt: the command dies of the stop's SIGTERM, the outcome is CANCELLED, and
    the handler's exception is taken (a game day's workers logged 726 "Task exception was never retrieved"
    at ERROR before it was)."""
    import gc

    from scheduler.worker.attempt import Attempt, Status, Stop

    seen: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    ready = tmp_path / "ready"
    ctx = make_ctx()
    a = Attempt(ctx, _payload(f"touch {ready}; sleep 30"), ShellExecutor(kill_grace=2.0), "p", timeout=60)
    run = asyncio.create_task(a.run())
    while not ready.exists():
        await asyncio.sleep(0.01)
    a.request_stop(Stop.CANCEL, grace=5.0, message="overlap")
    outcome = await asyncio.wait_for(run, 3.0)  # SIGTERM at once, not after the 5 s grace
    assert outcome.status is Status.CANCELLED
    del a, run
    gc.collect()
    await asyncio.sleep(0)
    assert not [c for c in seen if "never retrieved" in str(c.get("message", ""))], seen


async def test_background_child_does_not_hold_the_result(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    loop = asyncio.get_running_loop()
    start = loop.time()
    # `sleep` keeps the output pipe open after the shell exits; the result must not wait for it.
    await ShellExecutor()(make_ctx(), _payload(f"sleep 5 & echo $! > {pidfile}; exit 0"))
    assert loop.time() - start < 2
    os.kill(int(pidfile.read_text()), signal.SIGKILL)  # left alone by design; the test cleans up


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b"not json", "payload: not valid JSON"),
        (b"[1]", "payload: must be a JSON object"),
        (b"{}", "payload.command: required"),
        (b'{"command": ""}', "payload.command: required"),
        (b'{"command": "true", "timeout_s": 0}', "payload.timeout_s:"),
        (b'{"command": "true", "timeout_s": "5"}', "payload.timeout_s:"),
        (b'{"command": "true", "env": {"A": 1}}', "payload.env.A: must be a string"),
        (b'{"command": "true", "env": []}', "payload.env: must be an object"),
        (b'{"command": "true", "timeout": 5}', "payload.timeout: unknown field"),
    ],
)
async def test_invalid_payload_is_permanent_and_names_the_field(payload: bytes, field: str) -> None:
    with pytest.raises(PermanentError) as info:
        await ShellExecutor()(make_ctx(), payload)
    assert str(info.value).startswith(field)


async def test_the_output_tails_and_the_exit_code_are_kept_for_the_attempt() -> None:
    ctx = make_ctx()
    await ShellExecutor()(ctx, _payload("echo hello; echo oops >&2"))
    assert ctx.output is not None
    assert (ctx.output.stdout_tail, ctx.output.stderr_tail, ctx.output.exit_code) == ("hello\n", "oops\n", 0)
    big = make_ctx()
    with pytest.raises(Exception):  # noqa: B017, PT011 (the class is tested above; here the tails)
        await ShellExecutor()(big, _payload("yes a | head -c 10000; echo END; exit 3"))
    assert big.output is not None and big.output.exit_code == 3
    assert len(big.output.stdout_tail) == 4096 and big.output.stdout_tail.endswith("a\nEND\n")


async def test_a_worker_without_allow_shell_refuses_shell_executions() -> None:
    """Shell is opt-in per worker (issue 14): without allow_shell the `shell` task type fails permanently
    (dead letter at once, no retry), and says why and how to turn it on."""
    from scheduler.worker import Worker, WorkerSettings
    from scheduler.worker.errors import PermanentError
    from scheduler.worker.executors import register_builtin

    for allow, expect_refusal in ((False, True), (True, False)):
        w = Worker(settings=WorkerSettings(worker_id="w", allow_shell=allow))
        register_builtin(w, w.settings)
        handler = w._handlers["shell"]
        refused = getattr(handler, "__name__", "") == "refuse_shell"
        assert refused is expect_refusal
        if refused:
            with pytest.raises(PermanentError, match="allow-shell"):
                await handler(make_ctx(), b'{"command": "true"}')
        await w.close()


_HOST = """
import asyncio, json, sys
from scheduler.worker.executors.shell import ShellExecutor
from tests.worker.conftest import make_ctx
cmd = sys.argv[1]
asyncio.run(ShellExecutor(kill_grace=0.5)(make_ctx(), json.dumps({"command": cmd}).encode()))
"""


@pytest.mark.skipif(not Path("/proc").exists(), reason="the parent-death guard is Linux only")
def test_a_sigkilled_worker_takes_its_commands_process_group_with_it(tmp_path: Path) -> None:
    """An audit: `kill -9` of a worker left its command (and what the command started) running, re-parented to
    init, while the planner retried the attempt elsewhere after the heartbeat timeout: two attempts of one id
    at once, two effects. The command's group now gets SIGTERM, then SIGKILL, when its worker dies."""
    import subprocess
    import sys
    import time

    pids, late = tmp_path / "pids", tmp_path / "late"
    # A background child and the shell itself: both must go, and the shell's last line must never run.
    cmd = f"sleep 30 & echo $! $$ > {pids}; wait; echo ran-to-the-end > {late}"
    host = subprocess.Popen([sys.executable, "-c", _HOST, cmd], cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 20
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
    finally:
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
    child, shell = (int(x) for x in pids.read_text().split())
    deadline = time.monotonic() + 10
    while not (_dead(child) and _dead(shell)):
        if time.monotonic() > deadline:
            for pid in (child, shell):  # by pid: leave nothing behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail("the command outlived its SIGKILLed worker")
        time.sleep(0.02)
    time.sleep(0.2)
    assert not late.exists(), "the command ran on after its worker died"
