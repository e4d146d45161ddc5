"""Where the client finds the server: an explicit argument, then `SCHED_SERVER`, then a TOML file.

Same precedence and validation as every other settings class (scheduler/config.py): flags >
`SCHED_*` environment > TOML. The file is `--config`, else `$SCHED_CONFIG`, else
`$XDG_CONFIG_HOME/schedctl/config.toml` (`~/.config/...`) when it exists.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler.auth.bearer import read_token_file
from scheduler.config import Settings, check_tls_files
from scheduler.errors import InvalidArgument

if TYPE_CHECKING:
    from scheduler.tls import ClientTls

DEFAULT_SERVER = "127.0.0.1:7000"  # `schedctl dev` and `schedctl planner --api-port 7000` listen here


@dataclass(frozen=True)
class ClientSettings(Settings):
    server: str = DEFAULT_SERVER  # host:port of any planner node
    request_timeout: float = 10.0  # seconds per call (retries included)
    # TLS (docs/operations.md, "Security"): any of these turns it on. The CA bundle that signs the planners'
    # certificates (none: the system's roots), and a client certificate and key for mutual TLS.
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_name: str | None = None  # verify the server's certificate against this name, not the address
    token_file: str = ""  # a file holding the bearer token to send (a cluster with auth on); empty: none

    def tls(self) -> ClientTls | None:
        from scheduler.tls import client_tls

        return client_tls(self.tls_ca_file, self.tls_cert_file, self.tls_key_file, self.tls_server_name)

    def validate(self) -> None:
        host, sep, port = self.server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise InvalidArgument("server", f"{self.server!r} is not host:port (e.g. 127.0.0.1:7000)")
        if not 0 < self.request_timeout < math.inf:  # nan compares false both ways: it read as a timeout (exit 5)
            raise InvalidArgument("request_timeout", f"is {self.request_timeout}; must be a positive number of seconds")
        check_tls_files("tls_", self.tls_cert_file, self.tls_key_file, self.tls_ca_file)

    def token(self) -> str | None:
        """The bearer token from token_file (InvalidArgument naming `token_file` if unreadable), or None."""
        return read_token_file(self.token_file) if self.token_file else None


def default_config_file(env: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if env is None else env
    if env.get("SCHED_CONFIG"):
        return Path(env["SCHED_CONFIG"])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    path = base / "schedctl" / "config.toml"
    return path if path.is_file() else None


def load_client_settings(flags: Mapping[str, Any], config: str | Path | None = None,
                         env: Mapping[str, str] | None = None,
                         shared_keys: frozenset[str] = frozenset()) -> ClientSettings:
    """`shared_keys`: other processes' setting names allowed in the same TOML file (a planner's file
    can serve the CLI on the same host)."""
    return ClientSettings.load(flags, env=env, toml_file=config or default_config_file(env), shared_keys=shared_keys)
