"""One `WorkerService.Connect` stream to one planner, re-opened with jittered backoff when it breaks.

The stream knows the wire (Hello first, Welcome back, heartbeats at the planner's interval, one writer
so messages keep their order); what the messages mean is the owner's business (worker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.auth.bearer import bearer_interceptors, read_token_file
from scheduler.clock import Clock
from scheduler.tasks import cancel_and_wait
from scheduler.tls import Dialer, client_tls
from scheduler.worker import protocol
from scheduler.worker.backoff import Backoff
from scheduler.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

EOF_: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs does not declare it


class StreamOwner(Protocol):
    clock: Clock  # the streams' silence and heartbeat times are on its monotonic clock

    def hello(self) -> wpb.WorkerMessage: ...
    def heartbeat(self, address: str) -> wpb.WorkerMessage: ...
    def stream_up(self, stream: PlannerStream, welcome: wpb.Welcome) -> None: ...
    def stream_closing(self, stream: PlannerStream) -> None: ...
    def stream_down(self, stream: PlannerStream) -> None: ...
    def on_message(self, stream: PlannerStream, msg: wpb.PlannerMessage) -> None: ...


class ProtocolError(Exception):
    pass


def dialer(settings: WorkerSettings) -> Dialer:
    """Plaintext, or TLS (mutual with a certificate) from the files in the settings, re-read on change."""
    return Dialer(client_tls(settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file,
                             settings.tls_server_name))


def channel(address: str, settings: WorkerSettings, dial: Dialer | None = None) -> grpc.aio.Channel:
    keepalive_ms = int(settings.keepalive_time * 1000)
    # The token is read on every dial, so a rotated token file is picked up at the next reconnect.
    token = read_token_file(settings.token_file) if settings.token_file else None
    return (dial or dialer(settings)).aio_channel(address, interceptors=bearer_interceptors(token), options=[
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", keepalive_ms),
        ("grpc.http2.max_pings_without_data", 0),
        # Our own backoff paces re-dials; gRPC's default (up to 120 s) would keep a restarted planner waiting.
        ("grpc.initial_reconnect_backoff_ms", int(settings.reconnect_backoff_min * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(settings.reconnect_backoff_min * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(settings.reconnect_backoff_max * 1000)),
        ("grpc.enable_http_proxy", 0),
    ])


class PlannerStream:
    def __init__(self, address: str, owner: StreamOwner, settings: WorkerSettings) -> None:
        self.address = address
        self.planner_id = ""  # from the Welcome
        self.region = ""
        self.heartbeat_interval = settings.heartbeat_interval
        # After this long without this stream, its attempts are given up (the planner's Welcome says).
        self.heartbeat_timeout = settings.heartbeat_interval * 10
        self.sessions = 0  # Welcomes received, for tests and logs
        self.probe_seen = 0  # the latest Probe of this session, echoed by its heartbeats
        # Silence (Welcome.acks_heartbeats): the planner answers every heartbeat, so a session that has heard
        # nothing for heartbeat_timeout is ended, as the planner ends a silent worker's. Without it only gRPC's
        # keepalive (keepalive_time, twice) found a cut link: 10-20 s, while the planner gave the stream's runs
        # up after two heartbeat timeouts and ran them again elsewhere (the F13 drill: 13 duplicate effects).
        self.acks = False
        self.last_heard = 0.0  # monotonic time of the latest message on the current session
        self._hb_seq = 0
        self._hb_sent: dict[int, float] = {}  # seq -> monotonic send time, the latest few
        # Send time of the latest heartbeat this planner acknowledged (kept past the session's end): it had
        # heard from us by then, so it cannot give up our attempts before two heartbeat timeouts after it.
        self.acked_sent: float | None = None
        self.silent_ends = 0
        self._owner = owner
        self._settings = settings
        self._dial = dialer(settings)
        self._generation = self._dial.generation()  # of the TLS files the channel was made with
        self._channel = channel(address, settings, self._dial)
        self.stub = wgrpc.WorkerServiceStub(self._channel)
        self.channels_made = 1  # a new one after a certificate rotation (tests)
        self._backoff = Backoff(settings.reconnect_backoff_min, settings.reconnect_backoff_max)
        self._queue: asyncio.Queue[wpb.WorkerMessage | None] | None = None  # None: nothing can be sent
        self._call: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._again_now = False  # re-open without backoff (credit reclaim)
        self._cut: asyncio.TimerHandle | None = None  # ends a half-closed session the planner keeps open
        self._silent = False  # the current session was ended for silence

    @property
    def connected(self) -> bool:
        """Welcomed and not half-closed: messages sent now reach the planner on this session."""
        return self._queue is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"planner-stream {self.address}")

    def send(self, msg: wpb.WorkerMessage) -> bool:
        if self._queue is None:
            return False
        self._queue.put_nowait(msg)
        return True

    def half_close(self) -> None:
        """End our side of the session. The planner stops dispatching and closes its side; anything it
        sent before that (assignments within our credits, acks) is still read and handled."""
        if self._queue is not None:
            self._owner.stream_closing(self)
            self._queue.put_nowait(None)
            self._queue = None
            # The planner should now end the call; one that does not is cut off after welcome_timeout.
            call = self._call
            self._cut = asyncio.get_running_loop().call_later(self._settings.welcome_timeout, call.cancel)

    def recycle(self) -> None:
        """Close the session gracefully and open a new one at once: the only way to get back credits
        a planner is sitting on."""
        self._again_now = True
        self.half_close()

    def stop_redialling(self) -> None:
        """Let the current session end on its own (after half_close) and open no new one."""
        self._stopping = True

    async def close(self, graceful_timeout: float = 0.0) -> None:
        self._stopping = True
        if graceful_timeout > 0 and self._queue is not None and self._task is not None:
            self.half_close()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), graceful_timeout)
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self._channel.close(None)

    async def _fresh_channel(self) -> None:
        """Before each (re)connection: rotated TLS files mean a new channel (credentials are fixed per channel);
        the session that ran is over, so nothing is lost by closing the old one."""
        try:
            generation = self._dial.generation()
        except OSError as e:  # unreadable files and no credentials yet: the dial below fails and is retried
            log.warning("cannot read TLS files: %s", e, extra={"planner": self.address})
            return
        if generation == self._generation:
            return
        old = self._channel
        self._generation = generation
        self._channel = channel(self.address, self._settings, self._dial)
        self.stub = wgrpc.WorkerServiceStub(self._channel)
        self.channels_made += 1
        log.info("TLS files changed: new channel", extra={"planner": self.address, "event": "tls_redial"})
        await old.close(None)

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._fresh_channel()
                await self._session()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                # Not this task being cancelled: the half-closed call was cut, or a silent one (grpc.aio
                # reports a locally cancelled call as CancelledError). Carry on as after a broken stream.
                if not self._silent:
                    log.info("planner did not end a half-closed stream; cut it", extra={"planner": self.address})
                self._silent = False
            except grpc.aio.AioRpcError as e:
                log.info("planner stream broke", extra={"planner": self.address, "code": e.code().name,
                                                        "details": e.details()})
            except Exception as e:  # a bug or a protocol breach: keep the worker alive, re-dial
                log.warning("planner stream failed", extra={"planner": self.address, "error": repr(e)})
            if self._stopping:
                return
            if self._again_now:
                self._again_now = False
                continue
            await asyncio.sleep(self._backoff.next())

    async def _session(self) -> None:
        queue: asyncio.Queue[wpb.WorkerMessage | None] = protocol.outgoing()
        queue.put_nowait(self._owner.hello())
        call = self.stub.Connect(self._requests(queue))
        self._call = call
        welcomed = False
        heartbeats: asyncio.Task[None] | None = None
        try:
            first = await asyncio.wait_for(call.read(), self._settings.welcome_timeout)
            if first is EOF_ or first.WhichOneof("body") != "welcome":
                raise ProtocolError(f"expected a Welcome, got {first!r}")
            self._welcome(first.welcome)
            self._queue = queue
            welcomed = True
            self._owner.stream_up(self, first.welcome)
            heartbeats = asyncio.create_task(self._heartbeats(queue, call))
            while True:
                msg = await call.read()
                if msg is EOF_:
                    return
                self.last_heard = self._owner.clock.monotonic()
                if msg.WhichOneof("body") == "heartbeat_ack":
                    self._acked(msg.heartbeat_ack.seq)
                    continue
                self._owner.on_message(self, msg)
        finally:
            if self._cut is not None:
                self._cut.cancel()
                self._cut = None
            if heartbeats is not None:
                heartbeats.cancel()
            if self._queue is queue:
                self._queue = None
            queue.put_nowait(None)  # ends the request iterator if the call is still open
            call.cancel()
            if welcomed:
                self._owner.stream_down(self)

    def _welcome(self, w: wpb.Welcome) -> None:
        self.planner_id, self.region = w.planner_id, w.region
        if w.HasField("heartbeat_interval") and (w.heartbeat_interval.seconds or w.heartbeat_interval.nanos):
            self.heartbeat_interval = w.heartbeat_interval.ToMilliseconds() / 1000
        if w.HasField("heartbeat_timeout") and (w.heartbeat_timeout.seconds or w.heartbeat_timeout.nanos):
            self.heartbeat_timeout = w.heartbeat_timeout.ToMilliseconds() / 1000
        self.sessions += 1
        self.probe_seen = 0  # a new session's planner numbers its probes afresh
        self.acks = w.acks_heartbeats
        self.last_heard = self._owner.clock.monotonic()
        self._hb_seq = 0
        self._hb_sent.clear()
        self._backoff.reset()
        log.info("planner stream open", extra={"planner": self.address, "planner_id": self.planner_id,
                                               "region": self.region})

    async def _heartbeats(self, queue: asyncio.Queue[wpb.WorkerMessage | None], call: Any) -> None:
        while self._queue is queue:
            await asyncio.sleep(self.heartbeat_interval)
            if self._queue is not queue:
                return
            silent = self._owner.clock.monotonic() - self.last_heard
            if self.acks and silent > self.heartbeat_timeout:
                self.silent_ends += 1
                log.warning("planner silent past the heartbeat timeout; ending the stream", extra={
                    "planner": self.address, "event": "planner_silent", "silent_s": round(silent, 3)})
                self._silent = True
                call.cancel()  # the session ends as a broken one; the stream re-dials
                return
            self.heartbeat_now()

    def heartbeat_now(self) -> None:
        """A heartbeat on this session now (besides the periodic ones), echoing the latest probe."""
        if self._queue is not None:
            hb = self._owner.heartbeat(self.address)
            hb.heartbeat.probe_echo = self.probe_seen
            self._hb_seq += 1
            hb.heartbeat.seq = self._hb_seq
            self._hb_sent[self._hb_seq] = self._owner.clock.monotonic()
            if len(self._hb_sent) > 16:
                del self._hb_sent[min(self._hb_sent)]
            self._queue.put_nowait(hb)

    def _acked(self, seq: int) -> None:
        sent = self._hb_sent.get(seq)
        if sent is not None and (self.acked_sent is None or sent > self.acked_sent):
            self.acked_sent = sent

    @staticmethod
    async def _requests(queue: asyncio.Queue[wpb.WorkerMessage | None]) -> AsyncIterator[wpb.WorkerMessage]:
        while (msg := await queue.get()) is not None:
            yield msg
