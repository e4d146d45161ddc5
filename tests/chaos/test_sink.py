"""The effect sink over real HTTP on 127.0.0.1 (port 0), called by the production http and shell
executors as drill workers call it: it records every call and refuses a stale fencing token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from chaos.sink import EffectSink, http_payload, read_effects, shell_command
from scheduler.config import TEST_MODE_ENV
from scheduler.errors import InvalidArgument
from scheduler.ids import FencingToken
from scheduler.worker.errors import PermanentError
from scheduler.worker.executors.http import HttpExecutor
from scheduler.worker.executors.shell import ShellExecutor
from tests.worker.conftest import make_ctx

EID = "nightly@2026-03-08T07:00:00.000Z"


async def post(url: str, token: str, *, attempt: int = 1, eid: str = EID, phase: str = "once",
               worker: str = "w1") -> int:
    headers = {"Idempotency-Key": eid, "X-Fencing-Token": token, "X-Attempt": str(attempt), "X-Worker": worker}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/effect?phase={phase}", headers=headers) as r:
        return r.status


async def test_records_accepts_and_refuses_a_lower_token(tmp_path: Path) -> None:
    log = tmp_path / "effects.jsonl"
    async with EffectSink(log) as sink:
        assert sink.url.startswith("http://127.0.0.1:") and not sink.url.endswith(":0")
        assert await post(sink.url, "3:100") == 200
        assert await post(sink.url, "3:120", attempt=2) == 200  # a newer claim raises the bar
        assert await post(sink.url, "3:100", attempt=3) == 409  # the old owner is refused now
        assert await post(sink.url, "3:120", attempt=4) == 200  # equal: the same claim, accepted
        assert await post(sink.url, "4:5") == 200  # partitions are fenced apart
        assert await post(sink.url, "oops") == 400
        assert (sink.accepted, sink.refused) == (4, 1)
    recs = read_effects(log)
    starts = [r for r in recs if r.phase == "start"]
    assert [(r.attempt, r.accepted) for r in starts] == [(1, True), (2, True), (3, False), (4, True), (1, True)]
    refused = starts[2]
    assert refused.max_revision == 120 and "stale fencing token 3:100" in refused.reason
    assert all(r.schedule_id == "nightly" and r.planned_ms == 1772953200000 for r in recs)
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    assert sum(1 for r in recs if r.phase == "end") == 4  # `once`: an end line per accepted call


async def test_the_http_executor_reaches_it_and_a_refusal_is_permanent(tmp_path: Path) -> None:
    log = tmp_path / "effects.jsonl"
    ex = HttpExecutor()
    try:
        async with EffectSink(log) as sink:
            payload = json.dumps(http_payload(sink.url, hold_ms=150)).encode()
            await ex(make_ctx(attempt=1, fencing_token=FencingToken(12, 9001)), payload)
            with pytest.raises(PermanentError, match="409"):
                await ex(make_ctx(attempt=2, fencing_token=FencingToken(12, 9000)), payload)
    finally:
        await ex.aclose()
    start, end, refused = read_effects(log)
    assert (start.phase, start.exec_id, start.partition, start.revision, start.accepted) == (
        "start", EID, 12, 9001, True)
    assert end.phase == "end" and end.t_ms - start.t_ms >= 140  # the sink held the answer: the effect lasts
    assert end.t_start_ms == start.t_ms  # an end line is the whole effect
    assert start.worker == "127.0.0.1"  # the http executor cannot say who it is: the peer stands in
    assert not refused.accepted and refused.revision == 9000


async def test_a_shell_command_reports_start_and_end_and_stops_when_refused(tmp_path: Path) -> None:
    log = tmp_path / "effects.jsonl"
    ex = ShellExecutor()
    async with EffectSink(log) as sink:
        cmd = shell_command(sink.url, hold_ms=200)
        payload = json.dumps({"command": cmd, "env": {"CHAOS_WORKER": "r1-w2"}}).encode()
        await ex(make_ctx(attempt=1, fencing_token=FencingToken(7, 50)), payload)
        with pytest.raises(PermanentError):  # exit 65: a fenced-off job stops, and is not retried
            await ex(make_ctx(attempt=2, fencing_token=FencingToken(7, 49)), payload)
    recs = read_effects(log)
    assert [(r.phase, r.attempt, r.accepted) for r in recs] == [("start", 1, True), ("end", 1, True),
                                                                 ("start", 2, False)]
    assert {r.worker for r in recs} == {"r1-w2"}
    assert recs[1].t_ms - recs[0].t_ms >= 190


@pytest.mark.parametrize("hold_ms", [0, 100])
async def test_a_failing_schedule_has_its_whole_effect_then_a_permanent_failure(tmp_path: Path, hold_ms: int) -> None:
    """`fail`: the effect happens in full, then both executors report a permanent failure (never retried), so
    the run goes straight to the dead-letter list and a drill has a real dead letter to replay."""
    log = tmp_path / "effects.jsonl"
    http, shell = HttpExecutor(), ShellExecutor()
    try:
        async with EffectSink(log) as sink:
            with pytest.raises(PermanentError, match="422"):
                await http(make_ctx(attempt=1, fencing_token=FencingToken(3, 10)),
                           json.dumps(http_payload(sink.url, hold_ms, fail=True)).encode())
            cmd = shell_command(sink.url, hold_ms, fail=True)
            with pytest.raises(PermanentError):
                await shell(make_ctx(attempt=2, fencing_token=FencingToken(3, 10)),
                            json.dumps({"command": cmd}).encode())
            await http(make_ctx(attempt=3, fencing_token=FencingToken(3, 10)),
                       json.dumps(http_payload(sink.url, hold_ms)).encode())  # fixed: succeeds
            assert await post(sink.url, "3:10", phase="once&fail=sometimes") == 400
    finally:
        await http.aclose()
    recs = read_effects(log)
    assert [(r.phase, r.attempt, r.accepted) for r in recs] == [
        ("start", 1, True), ("end", 1, True), ("start", 2, True), ("end", 2, True), ("start", 3, True),
        ("end", 3, True)]


async def test_a_shell_job_stopped_mid_effect_is_recorded_cut_short(tmp_path: Path) -> None:
    """A job the worker stops (cancel, timeout, rejected re-attach) closes its call to the sink, which records
    the effect cut short at that instant: the checker then knows when it ended (with start, sleep, end, a
    stopped job never said so, and its effect seemed to run until its worker died)."""
    log = tmp_path / "effects.jsonl"
    ex = ShellExecutor()
    async with EffectSink(log) as sink:
        payload = json.dumps({"command": shell_command(sink.url, hold_ms=5_000)}).encode()
        job = asyncio.create_task(ex(make_ctx(attempt=1, fencing_token=FencingToken(7, 50)), payload))
        for _ in range(200):
            if sink.accepted:
                break
            await asyncio.sleep(0.02)
        job.cancel()  # what the worker's stop does: the executor kills the job's process group
        with contextlib.suppress(asyncio.CancelledError):
            await job
        for _ in range(100):
            if len(read_effects(log)) == 2:
                break
            await asyncio.sleep(0.02)
    recs = read_effects(log)
    assert [(r.phase, r.attempt) for r in recs] == [("start", 1), ("abort", 1)]
    assert recs[1].t_ms - recs[0].t_ms < 4_000


async def test_fencing_off_is_for_tests_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_MODE_ENV, raising=False)
    with pytest.raises(InvalidArgument, match="refused outside test mode"):
        EffectSink(tmp_path / "e.jsonl", fence=False)
    monkeypatch.setenv(TEST_MODE_ENV, "1")
    async with EffectSink(tmp_path / "e.jsonl", fence=False) as sink:
        assert await post(sink.url, "3:100") == 200
        assert await post(sink.url, "3:90") == 200  # accepted: what the checker's I4 must then catch
    assert all(r.accepted for r in read_effects(tmp_path / "e.jsonl"))


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "e.jsonl"
    log.write_text('{"seq":1,"phase":"start","exec_id":"a@x","schedule_id":"a","planned_ms":1,"attempt":1,'
                   '"partition":0,"revision":5,"worker":"w","t_ms":10,"accepted":true}\n{"seq":2,"pha')
    assert [r.seq for r in read_effects(log)] == [1]


async def test_a_caller_that_goes_away_mid_effect_is_recorded_as_cut_short(tmp_path: Path) -> None:
    """A worker killed during a held http effect (F7): the sink records an abort, not a completion,
    so the retry that follows is not a duplicate."""
    log = tmp_path / "effects.jsonl"
    async with EffectSink(log) as sink:
        headers = {"Idempotency-Key": EID, "X-Fencing-Token": "1:1", "X-Attempt": "1"}
        async with aiohttp.ClientSession() as s:
            with pytest.raises(TimeoutError):
                async with s.post(f"{sink.url}/effect?phase=once&hold_ms=2000", headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=0.2)):
                    pass
        for _ in range(40):
            if any(r.phase == "abort" for r in read_effects(log)):
                break
            await asyncio.sleep(0.05)
    assert [r.phase for r in read_effects(log)] == ["start", "abort"]


def test_the_sink_runs_as_a_process_and_prints_its_url(tmp_path: Path) -> None:
    """How the runner starts it: `python -m chaos.sink`, URL on the first line; stopped by its pid."""
    p = subprocess.Popen([sys.executable, "-m", "chaos.sink", "--log", str(tmp_path / "e.jsonl")],
                         stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            assert json.loads(r.read())["fence"] is True
    finally:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(10)
    refused = subprocess.run([sys.executable, "-m", "chaos.sink", "--log", str(tmp_path / "e.jsonl"),
                              "--unsafe-no-fence"], capture_output=True, text=True, timeout=30,
                             env={k: v for k, v in os.environ.items() if k != TEST_MODE_ENV},
                             cwd=Path(__file__).parents[2], check=False)
    assert refused.returncode == 2 and "refused outside test mode" in refused.stderr
