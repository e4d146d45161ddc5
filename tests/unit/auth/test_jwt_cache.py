"""The cache of verified JWTs (scheduler/auth/jwt_cache.py): a token sent again is not verified again, a
token that expires while cached is refused from then on (an injected clock, no sleeping), a refusal is
never remembered, and the cache is bounded.

Shown to fail with the expiry check removed (VerifiedCache.get answering an expired entry): both cases of
test_a_token_that_expires_while_cached_is_refused then accept the expired token ("DID NOT RAISE")."""

from __future__ import annotations

from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from scheduler.auth.jwt_cache import VerifiedCache
from scheduler.auth.principal import Principal
from scheduler.auth.tokens import JwtSettings, JwtVerifier
from scheduler.errors import Unauthenticated

ISS, AUD = "https://idp.test", "sched"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def key() -> Any:
    return ec.generate_private_key(ec.SECP256R1())


def token(key: Any, sub: str = "svc", **claims: Any) -> str:
    body = {"iss": ISS, "aud": AUD, "sub": sub, "exp": int(T0) + 60, "iat": int(T0),
            "permissions": ["payments:reader"], **claims}
    return jwt.encode(body, key, algorithm="ES256")


def verifier(key: Any, clock: Clock, leeway: float = 0.0, **kw: Any) -> JwtVerifier:
    return JwtVerifier(JwtSettings(issuer=ISS, audience=AUD, leeway_s=leeway), [(None, key.public_key())],
                       now=clock, **kw)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every signature verification (jwt.decode) made, by token."""
    calls: list[str] = []
    real = jwt.decode

    def counting(tok: str, *a: Any, **kw: Any) -> Any:
        calls.append(tok)
        return real(tok, *a, **kw)
    monkeypatch.setattr(jwt, "decode", counting)
    return calls


def test_the_same_token_is_verified_once(key: Any, decodes: list[str]) -> None:
    v = verifier(key, Clock())
    tok = token(key)
    first = v.verify(tok)
    assert [v.verify(tok) for _ in range(5)] == [first] * 5
    assert decodes == [tok] and v.cache.hits == 5
    assert first == Principal("jwt:svc", first.grants)


@pytest.mark.parametrize("leeway", [0.0, 30.0])
def test_a_token_that_expires_while_cached_is_refused(key: Any, leeway: float) -> None:
    clock = Clock()
    v = verifier(key, clock, leeway)
    tok = token(key)  # exp = T0 + 60
    v.verify(tok)
    clock.t = T0 + 60 + leeway - 0.001  # still valid: answered from the cache
    v.verify(tok)
    assert v.cache.hits == 1
    clock.t = T0 + 60 + leeway  # the instant a full verification refuses it
    with pytest.raises(Unauthenticated, match="expired"):
        v.verify(tok)
    with pytest.raises(Unauthenticated, match="expired"):
        v.verify(tok)  # and it stays refused: nothing was put back
    assert len(v.cache) == 0


def test_a_token_not_yet_valid_is_refused_on_the_verifiers_clock(key: Any) -> None:
    clock = Clock()
    v = verifier(key, clock)
    with pytest.raises(Unauthenticated, match=r"not yet valid \(nbf\)"):
        v.verify(token(key, nbf=int(T0) + 10))
    with pytest.raises(Unauthenticated, match=r"not yet valid \(iat\)"):
        v.verify(token(key, iat=int(T0) + 10))
    clock.t = T0 + 10
    v.verify(token(key, nbf=int(T0) + 10))


def test_refusals_are_never_cached(key: Any, decodes: list[str]) -> None:
    v = verifier(key, Clock())
    other = ec.generate_private_key(ec.SECP256R1())
    good, forged = token(key), token(other)  # the same claims, signed by a key we do not trust
    v.verify(good)
    for _ in range(3):
        with pytest.raises(Unauthenticated, match="bearer token refused"):
            v.verify(forged)
    assert decodes.count(forged) == 3, "each refused call verified in full"
    assert len(v.cache) == 1
    wrong_aud = token(key, aud="someone-else")
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            v.verify(wrong_aud)
    assert len(v.cache) == 1


def test_the_cache_is_bounded_least_recently_used_out(key: Any, decodes: list[str]) -> None:
    v = verifier(key, Clock(), cache=VerifiedCache(max_entries=2))
    a, b, c = (token(key, sub=s) for s in "abc")
    v.verify(a)
    v.verify(b)
    v.verify(a)  # a is now the most recent
    v.verify(c)  # b goes
    assert len(v.cache) == 2
    decodes.clear()
    v.verify(a)
    v.verify(c)
    assert decodes == []
    v.verify(b)
    assert decodes == [b]
    with pytest.raises(ValueError, match="max_entries"):
        VerifiedCache(0)
