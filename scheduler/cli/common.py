"""Plumbing shared by the subcommands that talk to a server: connection flags, running one async
call, turning a ClientError into a message that says what to fix and an exit code, tables, JSON.

Exit codes (docs/cli.md): 0 ok; 1 the server failed the call (INTERNAL, RESOURCE_EXHAUSTED, ...);
2 bad usage or INVALID_ARGUMENT (`field: reason` on stderr); 3 NOT_FOUND; 4 conflict: ALREADY_EXISTS,
ABORTED (stale version) or FAILED_PRECONDITION (state forbids it); 5 UNAVAILABLE or
DEADLINE_EXCEEDED (retrying may help); 6 a wait ran out (`region switchover --timeout`); 7 UNAUTHENTICATED
(no token, or a refused one); 8 PERMISSION_DENIED (the token's roles do not allow it); 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from scheduler.cli.output import Exit
from scheduler.client import ClientError, SchedulerClient, load_client_settings
from scheduler.config import CoordinationSettings, EtcdSettings, TlsSettings
from scheduler.errors import InvalidArgument
from scheduler.ids import format_rfc3339_ms
from scheduler.planner.settings import PlannerSettings
from scheduler.worker.settings import WorkerSettings

_EXIT = {
    grpc.StatusCode.INVALID_ARGUMENT: Exit.INVALID,
    grpc.StatusCode.OUT_OF_RANGE: Exit.INVALID,
    grpc.StatusCode.NOT_FOUND: Exit.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: Exit.CONFLICT,
    grpc.StatusCode.ABORTED: Exit.CONFLICT,
    grpc.StatusCode.FAILED_PRECONDITION: Exit.CONFLICT,
    grpc.StatusCode.UNAVAILABLE: Exit.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: Exit.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: Exit.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: Exit.PERMISSION_DENIED,
}

# One config file may hold a planner's or worker's settings and the CLI's `server`.
_SHARED_KEYS = frozenset(
    f for cls in (EtcdSettings, CoordinationSettings, PlannerSettings, WorkerSettings, TlsSettings)
    for f in cls.__dataclass_fields__
)


def client_parent() -> argparse.ArgumentParser:
    """Flags every server-talking leaf command takes (on the leaf, so they go after the verb)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--server", metavar="HOST:PORT", help="any planner node's API address "
                   "(default: $SCHED_SERVER, then `server` in the config file, then 127.0.0.1:7000)")
    g.add_argument("--config", metavar="FILE", help="TOML file with `server` / `request_timeout` "
                   "(default: $SCHED_CONFIG, then ~/.config/schedctl/config.toml if it exists)")
    g.add_argument("--timeout", type=float, metavar="SECONDS", dest="request_timeout",
                   help="deadline per call, retries included (default 10)")
    g.add_argument("--token-file", metavar="FILE", dest="token_file",
                   help="file holding the bearer token to send, for a cluster with auth on "
                        "(default: $SCHED_TOKEN_FILE, then `token_file` in the config file)")
    g.add_argument("--json", action="store_true", help="print JSON (the proto JSON mapping) for machines")
    add_tls_flags(g)
    return p


def add_tls_flags(g: argparse._ArgumentGroup) -> None:
    """--tls-ca-file, --tls-cert-file, --tls-key-file, --tls-server-name (env SCHED_TLS_*, config file keys)."""
    g.add_argument("--tls-ca-file", metavar="FILE", help="CA bundle (PEM) that signs the planners' certificates; "
                   "any --tls-* flag turns TLS on (default: $SCHED_TLS_CA_FILE, then the config file)")
    g.add_argument("--tls-cert-file", metavar="FILE", help="client certificate (PEM) for mutual TLS "
                   "(with --tls-key-file; env SCHED_TLS_CERT_FILE)")
    g.add_argument("--tls-key-file", metavar="FILE", help="client key (PEM) (env SCHED_TLS_KEY_FILE)")
    g.add_argument("--tls-server-name", metavar="NAME", help="the name the server's certificate must carry, when "
                   "not the address's host (env SCHED_TLS_SERVER_NAME)")


def tls_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k, None) for k in ("tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name")}


def _hint(err: ClientError, server: str) -> str:
    if err.code in (grpc.StatusCode.UNAVAILABLE,):
        return (f"cannot reach the scheduler API at {server} ({err.message}); is a planner running there? "
                "Set --server, SCHED_SERVER or `server` in the config file.")
    if err.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{server} did not answer in time ({err.message}); raise --timeout or check the planner's health."
    if err.code is grpc.StatusCode.UNIMPLEMENTED:
        return (f"the server at {server} does not offer this call ({err.message or 'UNIMPLEMENTED'}): "
                "is it older than schedctl?")
    if err.code is grpc.StatusCode.ABORTED:
        return f"{err.describe()} (it changed since you read it: get it again, then retry with its version)"
    if err.code is grpc.StatusCode.UNAUTHENTICATED:
        return (f"not authenticated by {server}: {err.message}. Pass a token with --token-file FILE, "
                "SCHED_TOKEN_FILE or `token_file` in the config file.")
    if err.code is grpc.StatusCode.PERMISSION_DENIED:
        return f"permission denied: {err.message}. Ask an admin for the role (docs/operations.md, Security)."
    if err.code is grpc.StatusCode.ALREADY_EXISTS:
        return f"{err.describe()} (pick another id, or change the existing one with `update`)"
    return err.describe()


def run_call(args: argparse.Namespace, body: Callable[[SchedulerClient], Awaitable[int]]) -> int:
    """Load the connection settings, run `body` with a connected client, map failures to exit codes."""
    try:
        settings = load_client_settings({"server": args.server, "request_timeout": args.request_timeout,
                                         **tls_flags(args), "token_file": getattr(args, "token_file", None)},
                                        config=args.config, shared_keys=_SHARED_KEYS)
        token = settings.token()
    except InvalidArgument as e:
        print(f"schedctl: {e}", file=sys.stderr)
        return Exit.INVALID

    async def main() -> int:
        async with SchedulerClient(settings.server, timeout=settings.request_timeout, tls=settings.tls(),
                                   token=token) as client:
            return await body(client)

    try:
        return asyncio.run(main())
    except InvalidArgument as e:  # caught client-side, before anything was sent
        print(f"schedctl: {e}", file=sys.stderr)
        return Exit.INVALID
    except ClientError as e:
        if e.violations:
            for v in e.violations:
                print(f"schedctl: {v}", file=sys.stderr)
        else:
            print(f"schedctl: {_hint(e, settings.server)}", file=sys.stderr)
        return _EXIT.get(e.code, Exit.FAILURE)


# ---- output ---------------------------------------------------------------------------------------


def to_dict(m: Message) -> dict[str, Any]:
    return json_format.MessageToDict(m, preserving_proto_field_name=True)


def print_json(value: Any) -> None:
    if isinstance(value, Message):
        value = to_dict(value)
    json.dump(value, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell; the last column is left ragged (it may be long)."""
    cells = [[str(c) for c in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        line = "  ".join(c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r))
        sys.stdout.write(line.rstrip() + "\n")


def ts(t: Any) -> str:
    """A Timestamp field as RFC3339 UTC with milliseconds, as in execution ids (`...:36.000Z`), `-` when
    unset (the caller passes `msg.field if HasField`)."""
    return "-" if t is None else format_rfc3339_ms(t.ToMilliseconds())


def opt_ts(m: Any, field: str) -> str:
    return ts(getattr(m, field)) if m.HasField(field) else "-"


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """`EXECUTION_STATE_SUCCEEDED` -> `succeeded`."""
    name: str = enum.Name(value)
    return name.removeprefix(prefix).lower() if value else "-"


def enum_choices(enum: Any, prefix: str) -> list[str]:
    return [k.removeprefix(prefix).lower() for k, v in enum.items() if v]


def enum_value(enum: Any, prefix: str, choice: str) -> Any:
    return enum.Value(prefix + choice.upper())


def duration_text(ms: int) -> str:
    """`250ms`, `5.6s`, `90s`, `5m`, `2h`: what a person reads at a glance (a lag, a timeout)."""
    if ms % 1000:
        return f"{ms}ms" if abs(ms) < 1000 else f"{ms / 1000:.1f}s"
    s = ms // 1000
    return f"{s}s" if s < 120 or s % 60 else (f"{s // 60}m" if s < 7200 or s % 3600 else f"{s // 3600}h")
