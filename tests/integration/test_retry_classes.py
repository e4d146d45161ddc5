"""Retry classes end to end: a planner process, a worker process and a real etcd; failures come from the
SDK's typed exceptions, the built-in `http` executor against a local webhook, and the built-in `shell`
executor's exit codes (docs/workers.md).

- transient (TransientError, HTTP 503/429, exit 75): retried until max_attempts, each wait at least
  the recorded backoff (exponential, full jitter, derived from the execution id: execution.backoff_ms)
  and HTTP Retry-After, at most the backoff ceiling of that attempt plus the planner's reaction time;
  then dead letter. A transient failure that clears succeeds on a later attempt.
- permanent (PermanentError, HTTP 400, exits 64-78 but 75): one attempt, dead letter.
- unknown (any other exception, other exit codes): max_unknown_attempts attempts, dead letter.
- The dead letter (index key and record, read from etcd) keeps the payload, every attempt's error
  class, message and timestamps. The work ran exactly as many times as the record has attempts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from chaos.infra.etcd import EtcdCluster
from scheduler.execution import ErrorClass, ExecState, Execution, backoff_ms
from scheduler.ids import execution_id
from scheduler.model import Policies, RetryPolicy, Schedule
from scheduler.store.etcd import EtcdClient
from tests.integration.engine import Engine, connected, lines, next_second_ms, wait_until

pytestmark = pytest.mark.etcd

RETRY = RetryPolicy(max_attempts=4, initial_backoff_ms=400, max_backoff_ms=3_000, multiplier=2.0,
                    max_unknown_attempts=2)
# A retry is dispatched by the first planner round after its wait (rounds every 50 ms); this much more
# is allowed for a loaded machine. It bounds the gap from above only; the lower bound is exact.
REACTION_MS = 2_500
T, P, U = ErrorClass.TRANSIENT, ErrorClass.PERMANENT, ErrorClass.UNKNOWN


class Hook:
    """The webhook: /<status>/<name> answers <status> (429 with Retry-After: 1); counts requests."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.base = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        assert request.headers["Idempotency-Key"]
        status = int(request.path.split("/")[1])
        headers = {"Retry-After": "1"} if status == 429 else {}
        return web.Response(status=status, text=f"answer {status}", headers=headers)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    h = Hook()
    app = web.Application()
    app.router.add_post("/{tail:.*}", h.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    h.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield h
    finally:
        await runner.cleanup()


def sched(sid: str, planned_ms: int, task: str, payload: dict[str, object]) -> Schedule:
    return Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool", task_type=task,
                    payload=json.dumps(payload).encode(), start_ms=planned_ms, end_ms=planned_ms,
                    policies=Policies(retry=RETRY, execution_timeout_ms=10_000))


def check_spacing(e: Execution, retry_after_ms: int = 0) -> list[int]:
    """Every retry waited at least its backoff (and Retry-After), at most the attempt's ceiling plus
    the planner's reaction time. Returns the gaps."""
    gaps = []
    for n in range(1, len(e.attempts)):
        prev, nxt = e.attempts[n - 1], e.attempts[n]
        gap = nxt.dispatched_ms - prev.finished_ms
        ceiling = min(RETRY.max_backoff_ms, int(RETRY.initial_backoff_ms * RETRY.multiplier ** (n - 1)))
        jittered = backoff_ms(e, n)
        assert 0 <= jittered < ceiling, f"{e.id}: backoff {jittered} of attempt {n} outside [0, {ceiling})"
        wait = max(jittered, retry_after_ms)
        assert wait <= gap <= max(ceiling, retry_after_ms) + REACTION_MS, \
            f"{e.id}: attempt {n + 1} came {gap} ms after attempt {n} failed; wait {wait}, ceiling {ceiling}"
        gaps.append(gap)
    return gaps


async def test_retry_classes_end_to_end(etcd_server: EtcdCluster, tmp_path: Path, key_prefix: str,
                                        hook: Hook) -> None:
    shell_log = tmp_path / "shell.log"

    def shell(code: int) -> dict[str, object]:
        return {"command": f'echo "$SCHED_EXECUTION_ID $SCHED_ATTEMPT" >> {shell_log}; exit {code}'}

    async with EtcdClient(etcd_server.config(timeout=2.0)) as kv:
        eng = Engine(etcd_server, tmp_path, kv, prefix=key_prefix.rstrip("/"))
        try:
            eng.start_planner("p1")
            eng.start_worker("w1")
            await connected(eng, "w1")  # and every partition owned: t is then materialized in time
            t = next_second_ms(3)
            # name -> (task, payload, expected final state, expected error class of every failed attempt)
            cases: dict[str, tuple[str, dict[str, object], ExecState, list[ErrorClass]]] = {
                "sdk-permanent": ("effect", {"fail": "permanent"}, ExecState.DEAD_LETTER, [P]),
                "sdk-unknown": ("effect", {"fail": "unknown"}, ExecState.DEAD_LETTER, [U, U]),
                "sdk-flaky": ("effect", {"fail": "transient", "fail_attempts": 2}, ExecState.SUCCEEDED, [T, T]),
                "http-503": ("http", {"url": f"{hook.base}/503/a"}, ExecState.DEAD_LETTER, [T] * 4),
                "http-429": ("http", {"url": f"{hook.base}/429/a"}, ExecState.DEAD_LETTER, [T] * 4),
                "http-400": ("http", {"url": f"{hook.base}/400/a"}, ExecState.DEAD_LETTER, [P]),
                "shell-75": ("shell", shell(75), ExecState.DEAD_LETTER, [T] * 4),
                "shell-65": ("shell", shell(65), ExecState.DEAD_LETTER, [P]),
                "shell-1": ("shell", shell(1), ExecState.DEAD_LETTER, [U, U]),
            }
            for i in range(6):  # more samples of the backoff
                cases[f"sdk-transient-{i}"] = ("effect", {"fail": "transient"}, ExecState.DEAD_LETTER, [T] * 4)
            await eng.create(*(sched(sid, t, task, payload) for sid, (task, payload, _, _) in cases.items()))

            records: dict[str, Execution] = {}

            async def all_settled() -> bool:
                for sid in cases:
                    e = await eng.record(sid, t)
                    if e is not None and e.state in (ExecState.SUCCEEDED, ExecState.DEAD_LETTER):
                        records[sid] = e
                return len(records) == len(cases)

            try:
                await wait_until(all_settled, 60, "every execution to succeed or be dead-lettered", every=0.3)
            except AssertionError as err:
                raise AssertionError(f"{err}: settled {sorted(records)}\n{eng.logs()}") from None
            starts = Counter(ln[0] for ln in lines(eng.starts))
            shell_runs = Counter(ln.split()[0] for ln in shell_log.read_text().splitlines())
        finally:
            eng.close()

        for sid, (task, payload, state, classes) in cases.items():
            e = records[sid]
            eid = execution_id(sid, t)
            failed = [a for a in e.attempts if not a.succeeded]
            assert e.state is state, f"{sid}: {e.state}, attempts {e.attempts}"
            assert [a.error_class for a in failed] == classes, f"{sid}: {[a.error_class for a in failed]}"
            assert [a.attempt for a in e.attempts] == list(range(1, len(e.attempts) + 1))
            for a in failed:
                assert a.message and 0 < a.dispatched_ms <= a.finished_ms, f"{sid}: attempt kept badly: {a}"
            # The work ran once per recorded attempt: no retry after a dead letter, none lost.
            runs = {"effect": starts[eid], "shell": shell_runs[eid],
                    "http": hook.hits[str(payload.get("url", "")).removeprefix(hook.base)]}[task]
            assert runs == len(e.attempts), f"{sid}: ran {runs} times for {len(e.attempts)} attempts"
            if e.state is ExecState.DEAD_LETTER:
                dl = await eng.dead_letter(sid, t)
                assert dl is not None, f"{sid}: no dead-letter index entry"
                assert dl["id"] == eid and bytes.fromhex(str(dl["payload"])) == json.dumps(payload).encode()
            gaps = check_spacing(e, retry_after_ms=1_000 if sid == "http-429" else 0)
            print(f"{sid}: {e.state.value} after {len(e.attempts)} attempts; retry gaps (ms) {gaps}")
        assert "exit code 65" in records["shell-65"].attempts[0].message
        assert "HTTP 400" in records["http-400"].attempts[0].message or "400" in records["http-400"].attempts[0].message
