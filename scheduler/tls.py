"""TLS for the gRPC ports and channels, from PEM files that are re-read when they change.

Server side (`ServerTls`): grpcio's dynamic server credentials. gRPC calls our fetch callback before
every new connection's handshake; it re-reads the certificate, key and CA files and hands gRPC a new
configuration only when their bytes changed and the new key belongs to the new certificate (a rotation
that swaps the files one by one is never served half-done: the old pair stays until both match).
Connections already established keep their session: existing worker streams survive a rotation.

Client side (`ClientTls`, `Dialer`): channel credentials are fixed when a channel is made, so the
files are re-read (a few KiB) whenever a channel is about to be made or re-dialled; `Dialer.generation`
moves when they changed, and holders of long-lived channels (worker streams, the clock guard's peer
channels) rebuild theirs at the next (re)connection. Short-lived channels (status fan-out, health
checks, schedctl) are made per use and always see the current files.

The verified client certificate reaches servicers through `context.auth_context()` (keys
`x509_common_name`, `x509_subject_alternative_name`, `x509_pem_cert`, `transport_security_type`):
authorization maps it to a principal; this module only makes sure it was requested and verified.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

Options = Sequence[tuple[str, Any]]


class TlsFileError(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def _read(path: str, field: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TlsFileError(field, f"cannot read {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise TlsFileError(field, f"{path} is not PEM")
    return data


def read_ca(path: str, *, field: str = "tls_ca_file") -> bytes:
    data = _read(path, field)
    from cryptography import x509

    try:
        if not x509.load_pem_x509_certificates(data):
            raise ValueError("no certificate")
    except ValueError as e:
        raise TlsFileError(field, f"{path} holds no PEM certificate: {e}") from None
    return data


def load_pair(cert_file: str, key_file: str, *, cert_field: str = "tls_cert_file",
              key_field: str = "tls_key_file") -> tuple[bytes, bytes]:
    """(certificate chain, key) as PEM bytes, checked to belong together."""
    cert, key = _read(cert_file, cert_field), _read(key_file, key_field)
    problem = pair_problem(cert, key)
    if problem is not None:
        field = key_field if "key" in problem else cert_field
        raise TlsFileError(field, f"{problem} ({cert_file}, {key_file})")
    return cert, key


def pair_problem(cert: bytes, key: bytes) -> str | None:
    """Why `key` cannot serve `cert` (unparsable, or another key pair), or None."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        leaf = x509.load_pem_x509_certificates(cert)[0]
    except (ValueError, IndexError) as e:
        return f"the certificate is not a PEM certificate: {e}"
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as e:
        return f"the key is not an unencrypted PEM private key: {e}"
    der = serialization.Encoding.DER
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(der, spki) != leaf.public_key().public_bytes(der, spki):
        return "the key does not belong to the certificate"
    return None


@dataclass(frozen=True)
class _Files:
    cert: bytes | None
    key: bytes | None
    ca: bytes | None


def _read_quiet(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def ca_problem(ca: bytes) -> str | None:
    """Why `ca` is not a usable CA bundle (no PEM certificate in it), or None."""
    from cryptography import x509

    try:
        if x509.load_pem_x509_certificates(ca):
            return None
    except ValueError as e:
        return f"the CA bundle holds no PEM certificate: {e}"
    return "the CA bundle holds no PEM certificate"


def _client_problem(f: _Files) -> str | None:
    if f.cert is not None and f.key is not None and (problem := pair_problem(f.cert, f.key)) is not None:
        return problem
    return ca_problem(f.ca) if f.ca is not None else None


class ServerTls:
    """A server port's credentials, re-read from the files on change (see the module docstring)."""

    def __init__(self, cert_file: str, key_file: str, ca_file: str | None = None, *,
                 require_client_cert: bool = False) -> None:
        if require_client_cert and not ca_file:
            raise ValueError("require_client_cert needs ca_file")
        self.cert_file, self.key_file, self.ca_file = cert_file, key_file, ca_file
        self.require_client_cert = require_client_cert
        self.reloads = 0  # configurations handed to gRPC after the first (tests, logs)
        self._lock = threading.Lock()  # the callback runs on gRPC's threads
        self._have: _Files | None = None
        self._refused: _Files | None = None  # a half-rotated set already warned about

    def _config(self, f: _Files) -> Any:
        assert f.cert is not None and f.key is not None
        return grpc.ssl_server_certificate_configuration([(f.key, f.cert)], root_certificates=f.ca)

    def credentials(self) -> grpc.ServerCredentials:
        cert, key = load_pair(self.cert_file, self.key_file)
        ca = read_ca(self.ca_file) if self.ca_file else None
        self._have = _Files(cert, key, ca)
        return grpc.dynamic_ssl_server_credentials(self._config(self._have), self._fetch,
                                                   require_client_authentication=self.require_client_cert)

    def _fetch(self) -> Any:
        """gRPC's per-handshake callback: a new configuration, or None to keep the current one. Never raises
        (an exception here would fail the handshake of a client that did nothing wrong)."""
        try:
            now = _Files(_read_quiet(self.cert_file), _read_quiet(self.key_file), _read_quiet(self.ca_file))
        except OSError as e:  # a file briefly missing mid-rotation: keep serving the current set
            log.warning("TLS files unreadable; keeping the current certificate: %s", e)
            return None
        with self._lock:
            if now == self._have:
                return None
            assert now.cert is not None and now.key is not None
            problem = pair_problem(now.cert, now.key)
            if problem is None and self.ca_file and (now.ca is None or b"-----BEGIN " not in now.ca):
                problem = "the CA bundle is not PEM"
            if problem is not None:
                if now != self._refused:
                    self._refused = now
                    log.warning("new TLS files not loaded, keeping the current certificate: %s", problem,
                                extra={"event": "tls_reload_refused", "cert_file": self.cert_file})
                return None
            self._have = now
            self.reloads += 1
        log.info("TLS certificate reloaded", extra={"event": "tls_reloaded", "cert_file": self.cert_file})
        try:
            return self._config(now)
        except Exception as e:  # should not happen after the checks; never fail a handshake for it
            log.warning("TLS reload failed: %r", e)
            return None


class ClientTls:
    """A client's TLS files: CA bundle (None: the system's roots), and a certificate and key for mutual TLS."""

    def __init__(self, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None, *,
                 server_name: str | None = None) -> None:
        if (cert_file is None) != (key_file is None):
            raise ValueError("cert_file and key_file go together")
        self.ca_file, self.cert_file, self.key_file = ca_file, cert_file, key_file
        self.server_name = server_name  # verify the server's certificate against this name, not the address
        self._lock = threading.Lock()
        self._files: _Files | None = None
        self._creds: grpc.ChannelCredentials | None = None
        self._refused: _Files | None = None  # a bad new set already logged
        self._unreadable = False  # a file missing already logged (said again once it came back and went)
        self.generation = 0  # moves each time the files' content changed (and at the first read)

    def refresh(self) -> int:
        """Re-read the files; returns the generation (bumped when their bytes changed). A file that cannot be
        read now, a key that does not belong to the certificate (half-rotated) or a CA bundle that is not PEM
        keeps the last good credentials (logged once per bad set), unless there are none yet."""
        try:
            now = _Files(_read_quiet(self.cert_file), _read_quiet(self.key_file), _read_quiet(self.ca_file))
        except OSError as e:
            if self._creds is None:
                raise
            if not self._unreadable:
                self._unreadable = True
                log.error("TLS files unreadable; keeping the current ones: %s", e, extra={
                    "event": "tls_reload_refused", "cert_file": self.cert_file, "ca_file": self.ca_file})
            return self.generation
        self._unreadable = False
        with self._lock:
            if now != self._files:
                if self._creds is not None and (problem := _client_problem(now)) is not None:
                    if now != self._refused:  # a rotation swaps files one by one: say so once, not per dial
                        self._refused = now
                        log.error("new TLS files not loaded, keeping the current ones: %s", problem, extra={
                            "event": "tls_reload_refused", "cert_file": self.cert_file, "ca_file": self.ca_file})
                    return self.generation
                self._files = now
                self._creds = grpc.ssl_channel_credentials(root_certificates=now.ca, private_key=now.key,
                                                           certificate_chain=now.cert)
                self.generation += 1
            return self.generation

    def credentials(self) -> grpc.ChannelCredentials:
        self.refresh()
        assert self._creds is not None
        return self._creds

    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


class Dialer:
    """Makes channels to one kind of peer, plaintext (`tls` None) or TLS from files re-read on change."""

    def __init__(self, tls: ClientTls | None = None) -> None:
        self.tls = tls

    @property
    def secure(self) -> bool:
        return self.tls is not None

    def generation(self) -> int:
        """Compare before re-using a long-lived channel: a different value means new files."""
        return 0 if self.tls is None else self.tls.refresh()

    def aio_channel(self, address: str, options: Options = (),
                    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None) -> grpc.aio.Channel:
        """`interceptors`: e.g. the bearer token's (scheduler/auth/bearer.py)."""
        if self.tls is None:
            return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)
        return grpc.aio.secure_channel(address, self.tls.credentials(), options=[*options, *self.tls.options()],
                                       interceptors=interceptors)

    def channel(self, address: str, options: Options = ()) -> grpc.Channel:
        """A blocking channel (health checks, `schedctl dev`'s readiness probe)."""
        if self.tls is None:
            return grpc.insecure_channel(address, options=list(options))
        return grpc.secure_channel(address, self.tls.credentials(), options=[*options, *self.tls.options()])


PLAINTEXT = Dialer()


def client_tls(ca_file: str | None, cert_file: str | None, key_file: str | None,
               server_name: str | None = None) -> ClientTls | None:
    """TLS when any file is given (a CA alone: server-verified TLS without a client certificate)."""
    if ca_file is None and cert_file is None and key_file is None:
        return None
    return ClientTls(ca_file, cert_file, key_file, server_name=server_name)


def peer_identity(context: Any) -> dict[str, list[str]]:
    """The verified peer's TLS identity as gRPC reports it (`x509_common_name`,
    `x509_subject_alternative_name`, ...), decoded; empty on a plaintext connection. For authorization."""
    auth = context.auth_context() or {}
    return {k: [v.decode(errors="replace") for v in vs] for k, vs in auth.items()
            if (k.startswith("x509_") and k != "x509_pem_cert") or k == "transport_security_type"}
