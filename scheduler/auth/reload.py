"""The bearer-token material of the auth file, re-read while the planner runs: the JWT key set (JWKS or
PEM public keys) and the static token file. A key rotation at the identity provider, or a token added or
revoked, then needs no restart.

How: at most every `interval` seconds (checked on the call path, so an idle planner reads nothing) the
files' bytes are read (a few KiB) and compared with those loaded. Changed bytes are parsed and validated
whole, as at start; only a set that passes replaces the current one, so the node is never left open (no
verifier) or locked out (a half-written JWKS, an empty token list) by a bad file: it keeps the material it
has and logs an error naming the file's key and the reason, once per bad content. A reloaded JWT verifier
starts with an empty verified-token cache (scheduler/auth/jwt_cache.py), so a token signed by a key that
was removed is refused from then on.

The TLS certificates have their own reload, at each handshake (scheduler/tls.py); this module follows the
same rule: the last good material stays until a complete good one replaces it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from scheduler.auth.config import AuthConfig
from scheduler.auth.tokens import JwtVerifier, StaticTokens
from scheduler.errors import InvalidArgument

log = logging.getLogger("scheduler.auth")

RELOAD_INTERVAL_S = 2.0

T = TypeVar("T")
Fingerprint = tuple[bytes | None, ...]


def _fingerprint(paths: tuple[str, ...]) -> Fingerprint:
    out: list[bytes | None] = []
    for p in paths:
        try:
            out.append(Path(p).read_bytes())
        except OSError:
            out.append(None)  # the loader says why (and names the key)
    return tuple(out)


class Material(Generic[T]):
    """One piece of material (`what`: the auth file key it comes from) built from `paths` by `load`."""

    def __init__(self, what: str, paths: tuple[str, ...], load: Callable[[], T], current: T,
                 check: Callable[[T, T], str] = lambda old, new: "") -> None:
        """`current`: what was loaded at start (from these files); `check(old, new)`: why `new` may not
        replace `old` although it parsed ("" if it may)."""
        self.what, self.paths, self._load, self._check = what, paths, load, check
        self.current = current
        self._have = _fingerprint(paths)
        self._refused: Fingerprint | None = None
        self.reloads = 0
        self.refusals = 0

    def poll(self) -> None:
        now = _fingerprint(self.paths)
        if now in (self._have, self._refused):
            return
        try:
            new = self._load()
            why = self._check(self.current, new)
        except InvalidArgument as e:  # what the loaders raise: it names the key and the reason
            why = str(e)
        except Exception as e:  # anything else (a file that is not UTF-8, ...): still keep the current one
            why = f"{self.what}: {e!r}"
        if why:
            self._refused = now
            self.refusals += 1
            log.error("%s: the new file was not loaded, keeping the current one: %s", self.what, why,
                      extra={"event": "auth_reload_refused", "field": self.what, "reason": why})
            return
        self.current, self._have, self._refused = new, now, None
        self.reloads += 1
        log.info("%s reloaded", self.what, extra={"event": "auth_reloaded", "field": self.what})


def _tokens_check(old: StaticTokens | None, new: StaticTokens | None) -> str:
    if old is not None and old.entries and new is not None and not new.entries:
        # Most likely a file caught mid-write, or emptied by mistake: every static-token caller (workers,
        # service accounts) would be locked out. Revoking them all is a restart without tokens_file.
        return "it holds no [[token]] (to revoke every static token, remove tokens_file and restart)"
    return ""


class AuthFiles:
    """The current JWT verifier and static tokens of an AuthConfig, re-read when their files change."""

    def __init__(self, cfg: AuthConfig, *, interval: float = RELOAD_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval, self.clock = interval, clock
        self._next = clock() + interval
        self.jwt_material: Material[JwtVerifier | None] | None = None
        self.tokens_material: Material[StaticTokens | None] | None = None
        src = cfg.jwt_source
        if src is not None and cfg.jwt is not None:
            self.jwt_material = Material("jwt key set", src.files(), src.load, cfg.jwt)
        path = cfg.tokens_file
        if path is not None and cfg.tokens is not None:
            self.tokens_material = Material("tokens_file", (path,), lambda: StaticTokens.load(path), cfg.tokens,
                                            _tokens_check)
        self._static_jwt, self._static_tokens = cfg.jwt, cfg.tokens

    @property
    def watching(self) -> bool:
        return self.jwt_material is not None or self.tokens_material is not None

    @property
    def jwt(self) -> JwtVerifier | None:
        return self.jwt_material.current if self.jwt_material is not None else self._static_jwt

    @property
    def tokens(self) -> StaticTokens | None:
        return self.tokens_material.current if self.tokens_material is not None else self._static_tokens

    def maybe_reload(self) -> None:
        """Re-read the files if `interval` has passed since the last look."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval
        self.reload()

    def reload(self) -> None:
        for m in (self.jwt_material, self.tokens_material):
            if m is not None:
                m.poll()
