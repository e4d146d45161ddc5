"""Bearer tokens: JWTs verified against configured public keys, and static tokens stored as hashes.

JWT verification is PyJWT's (`jwt.decode`: signature, `exp`, `nbf`, `iss`, `aud`, with a leeway for
clock skew); the keys come from a JWKS file or PEM public keys read at start, never fetched at run
time, so an identity provider outage or a hijacked key URL cannot change who gets in. Only asymmetric
algorithms are accepted: a public key is not a secret, and an HMAC "signed" with it would be a forgery
(the classic algorithm-confusion attack); `none` is never accepted.

Static tokens are for service accounts without an identity provider: the file holds the SHA-256 of each
token, never the token, and a presented token's hash is compared against every entry with
`hmac.compare_digest` (no early exit), so neither the file nor the comparison's timing gives a token away.
A token of 256 random bits needs no slow hash: there is nothing to brute-force from its SHA-256.

A verified JWT is remembered (scheduler/auth/jwt_cache.py) until its `exp` plus the leeway, on the
verifier's clock: the time claims are checked here against that same clock rather than by PyJWT (which
reads the system clock), so that the cache and a full verification agree on when a token expires.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from scheduler.auth.jwt_cache import VerifiedCache
from scheduler.auth.principal import Principal, lenient_permissions, parse_permissions
from scheduler.errors import InvalidArgument, Unauthenticated

ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})
STATIC_PREFIX = "sched_"  # static tokens look like `sched_<43 urlsafe chars>`: never three dot-separated parts


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2


@dataclass(frozen=True)
class JwtSettings:
    issuer: str
    audience: str
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    permissions_claim: str = "permissions"
    subject_claim: str = "sub"
    leeway_s: float = 30.0  # clock skew allowed on exp / nbf / iat


class JwtVerifier:
    """Verifies a JWT's signature against the configured keys and its registered claims."""

    def __init__(self, settings: JwtSettings, keys: Sequence[tuple[str | None, Any]], *,
                 now: Callable[[], float] = time.time, cache: VerifiedCache | None = None) -> None:
        """`keys`: (kid or None, a cryptography public key or PyJWK key object); `now`: wall-clock seconds
        since the epoch, for `exp` / `nbf` / `iat` and the cache's expiry; `cache`: verified tokens (a new
        bounded one by default; one per verifier, so a reloaded key set starts empty)."""
        if not keys:
            raise InvalidArgument("jwt", "no public keys: set jwks_file or public_key_files")
        bad = [a for a in settings.algorithms if a not in ASYMMETRIC]
        if bad:
            raise InvalidArgument("jwt.algorithms", f"{', '.join(bad)}: only asymmetric algorithms "
                                  f"({', '.join(sorted(ASYMMETRIC))}) verify with public keys")
        self.s, self.keys = settings, list(keys)
        self.now = now
        self.cache = cache if cache is not None else VerifiedCache()

    def _candidates(self, token: str) -> list[Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"malformed bearer token: {e}") from None
        kid = header.get("kid")
        if kid is not None:
            named = [k for key_id, k in self.keys if key_id == kid]
            if named:
                return named
        # No kid, or one we do not know: try every key (a handful at most), so PEM keys without ids work.
        return [k for _, k in self.keys]

    def verify(self, token: str) -> Principal:
        digest = hashlib.sha256(token.encode()).digest()
        now = self.now()
        cached = self.cache.get(digest, now)
        if cached is not None:
            return cached
        principal, until = self._verify(token, now)  # raises on any refusal: nothing is cached then
        self.cache.put(digest, principal, until)
        return principal

    def _verify(self, token: str, now: float) -> tuple[Principal, float]:
        """The principal, and the instant the token stops being valid (its `exp` plus the leeway)."""
        last: jwt.PyJWTError | None = None
        for key in self._candidates(token):
            try:
                claims: dict[str, Any] = jwt.decode(
                    token, key, algorithms=list(self.s.algorithms), audience=self.s.audience, issuer=self.s.issuer,
                    options={"require": ["exp", "iss", "aud"], "verify_exp": False, "verify_nbf": False,
                             "verify_iat": False})
            except (jwt.InvalidSignatureError, jwt.InvalidKeyError) as e:
                last = e  # not this key (another key, or a key of another type): try the next
                continue
            except jwt.PyJWTError as e:  # wrong audience or issuer, a required claim missing, malformed
                raise Unauthenticated(f"bearer token refused: {e}") from None
            until = self._check_times(claims, now)
            sub = claims.get(self.s.subject_claim)
            name = f"jwt:{sub}" if isinstance(sub, str) and sub else "jwt:?"
            return Principal(name, lenient_permissions(claims.get(self.s.permissions_claim))), until
        raise Unauthenticated(f"bearer token refused: {last or 'signature verification failed'}")

    def _check_times(self, claims: Mapping[str, Any], now: float) -> float:
        """PyJWT's rules for `exp`, `nbf` and `iat` (integers; leeway both ways), on our clock. Returns the
        instant from which the token is refused."""
        leeway = self.s.leeway_s

        def number(claim: str) -> int:
            try:
                return int(claims[claim])
            except (ValueError, TypeError, OverflowError):
                raise Unauthenticated(f"bearer token refused: the {claim} claim must be an integer") from None

        exp = number("exp")
        if exp <= now - leeway:
            raise Unauthenticated("bearer token refused: Signature has expired")
        for claim in ("nbf", "iat"):
            if claim in claims and number(claim) > now + leeway:
                raise Unauthenticated(f"bearer token refused: The token is not yet valid ({claim})")
        return exp + leeway


def load_jwks(path: str) -> list[tuple[str | None, Any]]:
    try:
        data = json.loads(Path(path).read_text())
        keyset = jwt.PyJWKSet.from_dict(data)
    except (OSError, ValueError, jwt.PyJWTError) as e:
        raise InvalidArgument("jwt.jwks_file", f"cannot read a JWKS from {path}: {e}") from None
    return [(k.key_id, k.key) for k in keyset.keys]


def load_pem_keys(paths: Sequence[str]) -> list[tuple[str | None, Any]]:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    out: list[tuple[str | None, Any]] = []
    for i, p in enumerate(paths):
        try:
            out.append((None, load_pem_public_key(Path(p).read_bytes())))
        except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as e:
            raise InvalidArgument(f"jwt.public_key_files[{i}]", f"cannot read a PEM public key from {p}: {e}") \
                from None
    return out


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_static_token() -> str:
    """256 random bits, URL-safe: what `schedctl auth token` hands out."""
    return STATIC_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class StaticToken:
    name: str
    sha256: bytes
    principal: Principal


class StaticTokens:
    """The token file: `[[token]]` tables with `name`, `sha256` (hex) and `permissions`."""

    def __init__(self, entries: Sequence[StaticToken]) -> None:
        self.entries = list(entries)

    @classmethod
    def load(cls, path: str) -> StaticTokens:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidArgument("tokens_file", f"cannot read {path}: {e}") from None
        return cls.parse(data, path)

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str) -> StaticTokens:
        extra = set(data) - {"token"}
        if extra:
            raise InvalidArgument(f"tokens_file.{sorted(extra)[0]}", f"unknown key in {where} (only [[token]])")
        entries: list[StaticToken] = []
        names: set[str] = set()
        for i, t in enumerate(data.get("token", [])):
            f = f"token[{i}]"
            if not isinstance(t, dict):
                raise InvalidArgument(f, "is not a table")
            unknown = set(t) - {"name", "sha256", "permissions"}
            if unknown:
                raise InvalidArgument(f"{f}.{sorted(unknown)[0]}", "unknown key (name, sha256, permissions)")
            name, digest = t.get("name"), t.get("sha256")
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"{f}.name", "is required")
            if name in names:
                raise InvalidArgument(f"{f}.name", f"{name!r} appears twice")
            names.add(name)
            try:
                raw = bytes.fromhex(digest) if isinstance(digest, str) else b""
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise InvalidArgument(f"{f}.sha256", "must be 64 hex digits: the SHA-256 of the token "
                                      "(`schedctl auth token` prints one)")
            perms = parse_permissions(t.get("permissions", []), f"{f}.permissions")
            entries.append(StaticToken(name, raw, Principal(f"token:{name}", perms)))
        return cls(entries)

    def verify(self, token: str) -> Principal:
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for e in self.entries:  # every entry, whatever matched: the time taken does not depend on which
            if hmac.compare_digest(digest, e.sha256):
                found = e.principal
        if found is None:
            raise Unauthenticated("bearer token refused: not a known token")
        return found
