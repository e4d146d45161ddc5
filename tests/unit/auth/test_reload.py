"""The auth file's key material re-read without a restart (scheduler/auth/reload.py): a rotated JWT key set
and an edited static token file take effect at the next look, and a bad new file (unparsable, half
written, empty, gone) keeps the current material and logs one error naming the key: the node is never
left open or locked out."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from scheduler.auth.authn import Authenticator
from scheduler.auth.config import parse_auth
from scheduler.auth.tokens import new_static_token, token_hash
from scheduler.errors import Unauthenticated
from tests.unit.auth.test_tokens import AUD, ISS, bearer, sign


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def replace(path: Path, text: str) -> None:
    """Atomically, as a Kubernetes secret update or `mv` does."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def tokens_toml(tokens: dict[str, str]) -> str:
    return "\n".join(f'[[token]]\nname = "{n}"\nsha256 = "{token_hash(t)}"\npermissions = ["payments:reader"]\n'
                     for n, t in tokens.items())


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == "auth_reload_refused"]


def test_the_static_token_file_is_reloaded_and_a_bad_one_keeps_the_current(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    alice, bob = new_static_token(), new_static_token()
    f = tmp_path / "tokens.toml"
    f.write_text(tokens_toml({"alice": alice}))
    clock = Clock()
    a = Authenticator(parse_auth({"tokens_file": "tokens.toml"}, base=tmp_path), reload_interval=2.0, clock=clock)
    assert a.authenticate(bearer(alice), None).name == "token:alice"

    replace(f, tokens_toml({"bob": bob}))  # alice revoked, bob added
    clock.t = 1.0  # not looked at yet
    assert a.authenticate(bearer(alice), None).name == "token:alice"
    clock.t = 2.0
    assert a.authenticate(bearer(bob), None).name == "token:bob"
    with pytest.raises(Unauthenticated):
        a.authenticate(bearer(alice), None)

    caplog.set_level(logging.ERROR, logger="scheduler.auth")
    for bad, reason in (('[[token]]\nname = "half', "cannot read"),  # caught mid-write
                        ('[[token]]\nname = "x"\nsha256 = "00"\n', "token[0].sha256"),
                        ("", "holds no [[token]]")):  # would lock every token out
        caplog.clear()
        replace(f, bad)
        for _ in range(3):
            clock.t += 2.0
            assert a.authenticate(bearer(bob), None).name == "token:bob"
        assert len(refusals(caplog)) == 1, "one error per bad content, not one per look"
        assert reason in refusals(caplog)[0].getMessage() and "tokens_file" in refusals(caplog)[0].getMessage()
    f.unlink()
    clock.t += 2.0
    assert a.authenticate(bearer(bob), None).name == "token:bob"
    replace(f, tokens_toml({"alice": alice, "bob": bob}))
    clock.t += 2.0
    assert a.authenticate(bearer(alice), None).name == "token:alice"
    assert a.files.tokens_material is not None and a.files.tokens_material.reloads == 2


def jwks(*pairs: tuple[Any, str]) -> str:
    return json.dumps({"keys": [{**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(k.public_key())), "kid": kid,
                                 "use": "sig", "alg": "ES256"} for k, kid in pairs]})


def test_a_rotated_jwt_key_set_is_reloaded_and_empties_the_cache(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    f = tmp_path / "jwks.json"
    f.write_text(jwks((old, "old")))
    clock = Clock()
    a = Authenticator(parse_auth({"jwt": {"issuer": ISS, "audience": AUD, "jwks_file": "jwks.json"}},
                                 base=tmp_path), reload_interval=2.0, clock=clock)
    by_old, by_new = sign(old, kid="old"), sign(new, kid="new")
    a.authenticate(bearer(by_old), None)  # verified, and cached
    with pytest.raises(Unauthenticated):
        a.authenticate(bearer(by_new), None)

    replace(f, jwks((new, "new")))  # the identity provider retired the old key
    clock.t = 2.0
    assert a.authenticate(bearer(by_new), None).name == "jwt:svc-a"
    with pytest.raises(Unauthenticated):  # cached before the rotation: refused after it
        a.authenticate(bearer(by_old), None)

    caplog.set_level(logging.ERROR, logger="scheduler.auth")
    for bad, reason in (('{"keys": [', "jwt.jwks_file"), ('{"keys": []}', "")):
        caplog.clear()
        replace(f, bad)
        clock.t += 2.0
        assert a.authenticate(bearer(by_new), None).name == "jwt:svc-a"
        assert len(refusals(caplog)) == 1 and reason in refusals(caplog)[0].getMessage()
    assert a.files.jwt_material is not None and a.files.jwt_material.reloads == 1


def test_pem_public_key_files_are_reloaded(tmp_path: Path) -> None:
    from tests.unit.auth.test_tokens import pem

    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "idp.pem").write_bytes(pem(old))
    a = Authenticator(parse_auth({"jwt": {"issuer": ISS, "audience": AUD, "public_key_files": ["idp.pem"]}},
                                 base=tmp_path), reload_interval=0.0)
    a.authenticate(bearer(sign(old)), None)
    (tmp_path / "idp.pem").write_bytes(b"-----BEGIN PUBLIC KEY-----\nnot a key\n")
    a.authenticate(bearer(sign(old)), None)  # kept
    (tmp_path / "idp.pem").write_bytes(pem(new))
    a.authenticate(bearer(sign(new)), None)
    with pytest.raises(Unauthenticated):
        a.authenticate(bearer(sign(old)), None)
