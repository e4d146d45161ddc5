"""The effect sink: a small HTTP service outside every fault that drill workers call for each side effect.

It plays the part of Jepsen's in-memory set (drills.md, C1): the one never-faulted witness of what the
workers really did. Both built-in executors reach it:
- the `http` executor POSTs to `<url>/effect?phase=once[&hold_ms=N]` (`http_payload`); its headers carry
  the identity (scheduler/worker/executors/http.py): `Idempotency-Key` (execution id), `X-Fencing-Token`
  (`<partition>:<revision>`), `X-Attempt`, `X-Scheduled-At`;
- a `shell` command (`shell_command`) calls `phase=once&hold_ms=N` (with a hold) or `phase=start` then
  `phase=end` (without) with curl, the same
  headers filled from the executor's `SCHED_*` environment, and `X-Worker` from `$CHAOS_WORKER` (the
  runner sets it per worker process; the http executor cannot say who it is, so the peer address
  stands in).

`fail=permanent` in the query (`http_payload`/`shell_command` with `fail=True`) makes a whole effect that then
answers HTTP 422: the handler did its work and reports a permanent failure (the http executor's "other 4xx",
the shell command's exit 65), so its run ends in the dead-letter list at once (never retried: one effect per
life of the run) and a drill's `replay` has real dead letters to replay.

Each start is checked against the highest fencing revision accepted so far for its partition: a lower
one is REFUSED with HTTP 409 (the fencing check a real downstream would make, DESIGN.md "Ownership and
fencing"); equal or higher is accepted and raises the bar. Every call, accepted or refused, is one JSON
line in the effect log (`EffectRecord`), flushed at once: the log is the checker's source of truth for
effects (I1, I3, I4a). `fence=False` turns the refusal off so meta-tests can show the checker catches
what the sink would have stopped; it is refused outside test mode (`SCHED_TEST_MODE=1`), like the
planner's `unsafe_*` switches.

aiohttp.web, because aiohttp is already a runtime dependency (the http executor's client): no new
package, and a maintained server with keep-alive and a clean asyncio lifecycle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from scheduler.clock import SYSTEM_CLOCK, Clock
from scheduler.config import TEST_MODE_ENV, test_mode
from scheduler.errors import InvalidArgument
from scheduler.ids import ExecutionId, FencingToken

__all__ = ["EffectRecord", "EffectSink", "http_payload", "read_effects", "shell_command"]

MAX_HOLD_MS = 600_000
FAIL_STATUS = 422  # a permanent failure for the http executor (4xx, not a transient one) and curl -f
_HOLD_POLL_S = 0.05  # how often a held effect looks whether its caller is still there


@dataclass(frozen=True)
class EffectRecord:
    """One line of the effect log. `phase` start | end | abort (the caller went away mid-effect: cut short,
    not completed); a refused start has accepted=False and a reason."""

    seq: int
    phase: str
    exec_id: str
    schedule_id: str
    planned_ms: int
    attempt: int
    partition: int
    revision: int
    worker: str
    t_ms: int  # when the sink handled the call (the harness's clock, never faulted)
    accepted: bool
    reason: str = ""
    max_revision: int = 0  # the partition's highest accepted revision when this call arrived
    t_start_ms: int = 0  # on end/abort lines: the matching start's t_ms, so the line is the whole effect

    @staticmethod
    def from_json(d: dict[str, Any]) -> EffectRecord:
        return EffectRecord(**{k: d[k] for k in EffectRecord.__dataclass_fields__ if k in d})


def read_effects(path: Path) -> list[EffectRecord]:
    """The effect log, in the order the sink wrote it. A torn last line (the sink killed mid-write) is skipped."""
    out: list[EffectRecord] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(EffectRecord.from_json(json.loads(line)))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def http_payload(sink_url: str, hold_ms: int = 0, *, fail: bool = False) -> dict[str, Any]:
    """The `http` executor payload of a drill schedule (`fail`: each effect then fails permanently)."""
    q = f"phase=once&hold_ms={hold_ms}" if hold_ms else "phase=once"
    q += "&fail=permanent" if fail else ""
    return {"url": f"{sink_url.rstrip('/')}/effect?{q}", "body": {}}


def shell_command(sink_url: str, hold_ms: int = 0, *, fail: bool = False) -> str:
    """A `shell` executor command. Without a hold: start, then end. With one, a single call that the sink
    holds for `hold_ms` (`phase=once`), so that the job's effect lasts as long as its process: a job the
    worker stops (a cancel, a timeout, a rejected re-attach) or that dies with its worker closes the
    connection, and the sink records the effect cut short (`abort`) at that instant. With start, sleep,
    end the sink never learnt when a stopped job ended, and the checker had to assume it ran until its
    worker died, taking the next attempt for a second run at once. A refusal (409) or an unreachable sink
    exits 65 (EX_DATAERR: permanent, never retried), as a fenced-off job should stop; so does a `fail` effect,
    which the sink answers with 422 once it is whole."""
    url = shlex.quote(sink_url.rstrip("/") + "/effect")
    headers = ('-H "Idempotency-Key: $SCHED_EXECUTION_ID" -H "X-Fencing-Token: $SCHED_FENCING_TOKEN" '
               '-H "X-Attempt: $SCHED_ATTEMPT" -H "X-Scheduled-At: $SCHED_PLANNED_AT" -H "X-Worker: ${CHAOS_WORKER:-}"')
    def call(phase: str) -> str:
        return f"curl -fsS -o /dev/null -X POST {headers} {url}?phase={phase} || exit 65"

    tail = r"\&fail=permanent" if fail else ""
    if hold_ms:
        return call(rf"once\&hold_ms={int(hold_ms)}{tail}")
    return "; ".join([call("start"), call(f"end{tail}")])


class _BadRequest(Exception):
    pass


class EffectSink:
    def __init__(self, log_path: Path, *, fence: bool = True, clock: Clock = SYSTEM_CLOCK) -> None:
        if not fence and not test_mode():
            raise InvalidArgument("fence", f"turning the sink's fencing check off is refused outside test mode "
                                           f"({TEST_MODE_ENV}=1): it is for meta-tests of the checker only")
        self.log_path = log_path
        self.fence = fence
        self.clock = clock
        self.max_revision: dict[int, int] = {}  # partition -> highest accepted revision
        self.accepted = self.refused = 0
        self._seq = 0
        self._started: dict[tuple[str, int, str], int] = {}  # (execution id, attempt, worker) -> start t_ms
        # F8 (slow workers): every effect is held this much longer (the runner sets it for a window).
        self.extra_hold_ms = 0
        # F13: effects of these workers (by name) held this much longer (a stranded worker's long runs).
        self.worker_hold_ms: dict[str, int] = {}
        # Worker name -> (start ms, execution id) of its latest effect: whom a planner hands work (F13).
        self.latest: dict[str, tuple[int, str]] = {}
        self._log: IO[str] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        # Peer address -> worker name, for running(): an http effect names its worker by the peer address
        # only (a namespace run gives each worker its own; chaos/netns_cluster.py fills this in).
        self.peer_names: dict[str, str] = {}

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None) -> str:
        """Serve on host:port (0: a free port, read back), or on `sock`, a listening socket made elsewhere
        (chaos/netns.py `listen()`: in the harness namespace, where workers in their own namespaces reach
        it with their own addresses as peers), and return the base URL."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a", buffering=1)  # line-buffered: each record reaches the file whole
        app = web.Application()
        app.router.add_post("/effect", self._effect)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site: web.BaseSite = web.TCPSite(self._runner, host, port) if sock is None else web.SockSite(self._runner, sock)
        await site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._log is not None:
            self._log.close()
            self._log = None

    async def __aenter__(self) -> EffectSink:
        if not self.url:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- handlers ----------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "accepted": self.accepted, "refused": self.refused,
                                  "fence": self.fence, "max_revision": self.max_revision})

    async def _effect(self, request: web.Request) -> web.Response:
        phase = request.query.get("phase", "once")
        if phase not in ("once", "start", "end"):
            return web.Response(status=400, text=f"phase {phase!r} must be once, start or end")
        try:
            eid, token, attempt, hold_ms = self._identity(request)
        except _BadRequest as e:
            return web.Response(status=400, text=str(e))
        fail = request.query.get("fail", "")
        if fail not in ("", "permanent"):
            return web.Response(status=400, text=f"fail {fail!r} must be permanent or absent")
        worker = request.headers.get("X-Worker", "") or (request.remote or "")
        if phase == "end":  # the shell's second call; a job killed before it never sends it
            self._write("end", eid, token, attempt, worker, accepted=True)
            return self._done(fail)
        prev = self.max_revision.get(token.partition, 0)
        if self.fence and token.revision < prev:
            self.refused += 1
            self._write("start", eid, token, attempt, worker, accepted=False, max_revision=prev,
                        reason=f"stale fencing token {token}: revision {prev} already accepted for partition "
                               f"{token.partition}")
            return web.Response(status=409, text=f"stale fencing token {token} (seen {token.partition}:{prev})")
        self.max_revision[token.partition] = max(prev, token.revision)
        self.accepted += 1
        self._write("start", eid, token, attempt, worker, accepted=True, max_revision=prev)
        if phase == "once":
            hold_ms += self.extra_hold_ms + self._worker_hold(worker)
            if hold_ms and not await self._hold(request, hold_ms):
                # The caller went away mid-effect (its worker was killed, or it gave up): the effect was
                # cut short, not completed. aiohttp does not cancel the handler, so we look.
                self._write("abort", eid, token, attempt, worker, accepted=True, reason="caller disconnected")
                return web.Response(status=499, text="caller went away")
            self._write("end", eid, token, attempt, worker, accepted=True)
            return self._done(fail)
        extra = self.extra_hold_ms + self._worker_hold(worker)
        if extra:  # a shell job's start: the job is slower by the hold (F8, F13)
            await self._hold(request, extra)
        return web.Response(text="ok")

    @staticmethod
    def _done(fail: str) -> web.Response:
        """The answer to a whole effect: ok, or the permanent failure its schedule asked for."""
        if fail:
            return web.Response(status=FAIL_STATUS, text="drill: permanent failure after a whole effect")
        return web.Response(text="ok")

    def _worker_hold(self, worker: str) -> int:
        if not self.worker_hold_ms:
            return 0
        return self.worker_hold_ms.get(self.peer_names.get(worker, worker), 0)

    def recent(self, worker: str, since_ms: int) -> str | None:
        """The execution id of `worker`'s latest effect if it started at or after `since_ms`, else None."""
        t, eid = self.latest.get(worker, (0, ""))
        return eid if eid and t >= since_ms else None

    def running(self, worker: str, since_ms: int = 0) -> int:
        """Effects of `worker` started (at or after `since_ms`) and not yet ended (the F7 nemesis waits for one to
        crash, F13 for one begun after its cut)."""
        return sum(1 for (_, _, w), t in self._started.items()
                   if (w == worker or self.peer_names.get(w) == worker) and t >= since_ms)

    @staticmethod
    async def _hold(request: web.Request, hold_ms: int) -> bool:
        """Sleep `hold_ms` while the caller stays connected; False as soon as it is gone."""
        left = hold_ms / 1000
        while left > 0:
            await asyncio.sleep(min(_HOLD_POLL_S, left))
            left -= _HOLD_POLL_S
            transport = request.transport
            if transport is None or transport.is_closing():
                return False
        return True

    @staticmethod
    def _identity(request: web.Request) -> tuple[ExecutionId, FencingToken, int, int]:
        h = request.headers
        try:
            eid = ExecutionId.parse(h.get("Idempotency-Key", ""), "Idempotency-Key")
            token = FencingToken.parse(h.get("X-Fencing-Token", ""), "X-Fencing-Token")
        except InvalidArgument as e:
            raise _BadRequest(str(e)) from None
        try:
            attempt = int(h.get("X-Attempt", ""))
            hold_ms = int(request.query.get("hold_ms", "0"))
        except ValueError:
            raise _BadRequest("X-Attempt and hold_ms must be integers") from None
        if attempt < 1 or not 0 <= hold_ms <= MAX_HOLD_MS:
            raise _BadRequest(f"X-Attempt must be >= 1 and hold_ms in 0..{MAX_HOLD_MS}")
        return eid, token, attempt, hold_ms

    def _write(self, phase: str, eid: ExecutionId, token: FencingToken, attempt: int, worker: str, *,
               accepted: bool, reason: str = "", max_revision: int = 0) -> None:
        self._seq += 1
        now = self.clock.wall_ms()
        key = (str(eid), attempt, worker)
        if phase == "start":
            if accepted:
                self._started[key] = now
                self.latest[self.peer_names.get(worker, worker)] = (now, str(eid))
            started = 0
        else:
            started = self._started.pop(key, 0)
        rec = EffectRecord(self._seq, phase, str(eid), eid.schedule_id, eid.planned_ms, attempt, token.partition,
                           token.revision, worker, now, accepted, reason, max_revision, started)
        assert self._log is not None, "the sink is not started"
        self._log.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")


async def _serve(args: argparse.Namespace) -> None:
    sink = EffectSink(Path(args.log), fence=not args.unsafe_no_fence)
    url = await sink.start(args.host, args.port)
    print(url, flush=True)  # the runner reads the URL from the first line
    try:
        await asyncio.Event().wait()
    finally:
        await sink.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m chaos.sink", description="Run the drill effect sink.")
    ap.add_argument("--log", required=True, help="effect log (JSON lines, appended)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    ap.add_argument("--unsafe-no-fence", action="store_true",
                    help=f"accept stale tokens (meta-tests only; needs {TEST_MODE_ENV}=1)")
    args = ap.parse_args(argv)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args))
    except InvalidArgument as e:
        print(f"chaos.sink: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
