"""Throw-away certificates for a local or test cluster (`schedctl certs dev DIR`), with `cryptography`.

One CA signs: `planner` (server and client: it serves the API and dials its peers; SANs 127.0.0.1,
localhost and any `--san`), `worker` (client), `admin` (client: an operator), `etcd-server` (server,
same SANs), `etcd-client` (client, CN `sched`: with etcd's `--client-cert-auth` the CN is the etcd
user, the one granted the cluster's prefix) and `etcd-root` (client, CN `root`, for setting etcd's
auth up with etcdctl). Keys are ECDSA P-256, written 0600; certificates 0644.

Not a production PKI: the CA key sits next to the certificates. docs/operations.md ("Security") says
what a production setup looks like (cert-manager, or your own CA) and which names the certificates need.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from scheduler.errors import InvalidArgument

DEFAULT_DAYS = 30
DEFAULT_SANS = ("127.0.0.1", "localhost")
SERVER, CLIENT = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True)
class Leaf:
    name: str  # file stem: DIR/NAME.crt, DIR/NAME.key
    common_name: str
    usages: tuple[x509.ObjectIdentifier, ...]
    sans: bool  # carries the host names (a server certificate)


LEAVES = (
    Leaf("planner", "planner", (SERVER, CLIENT), True),
    Leaf("worker", "worker", (CLIENT,), False),
    Leaf("admin", "admin", (CLIENT,), False),
    Leaf("etcd-server", "etcd-server", (SERVER, CLIENT), True),
    Leaf("etcd-client", "sched", (CLIENT,), False),
    Leaf("etcd-root", "root", (CLIENT,), False),
)


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sched dev"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def make_ca(common_name: str = "sched dev CA", *, days: int = DEFAULT_DAYS) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    start = _now() - dt.timedelta(minutes=5)  # tolerate a little clock skew between machines
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Authority(cert, key)


def issue(ca: Authority, common_name: str, usages: Sequence[x509.ObjectIdentifier], *,
          sans: Sequence[str] = (), days: int = DEFAULT_DAYS,
          not_before: dt.datetime | None = None, not_after: dt.datetime | None = None,
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf certificate signed by `ca`. `not_before`/`not_after` override the validity (tests make an
    expired one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or _now() - dt.timedelta(minutes=5)
    end = not_after or start + dt.timedelta(days=days)
    b = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca.cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                      content_commitment=False, key_encipherment=False, data_encipherment=False,
                                      key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False))
    if sans:
        b = b.add_extension(_san(sans), critical=False)
    return b.sign(ca.key, hashes.SHA256()), key


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_private(path: Path, data: bytes) -> None:
    """Created 0600 from the start (never briefly world-readable), replacing any file there."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    os.replace(tmp, path)


def write_leaf(directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    write_private(directory / f"{name}.key", key_pem(key))
    write_public(directory / f"{name}.crt", cert_pem(cert))


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*$")


def validate_san(name: str) -> str:
    """An IP address or a DNS name (a leading `*.` allowed), else InvalidArgument naming `san`."""
    n = name.strip()
    try:
        return str(ipaddress.ip_address(n))
    except ValueError:
        pass
    if len(n) > 253 or not _DNS.match(n):
        raise InvalidArgument("san", f"{name!r} is neither an IP address nor a DNS name")
    return n


def dev_certs(directory: Path, *, sans: Sequence[str] = (), days: int = DEFAULT_DAYS,
              force: bool = False, if_missing: bool = False, owner: tuple[int, int] | None = None) -> list[Path]:
    """Write the CA and every leaf of `LEAVES` into `directory`; returns the files written. Refuses to replace
    an existing CA (everything it signed would stop being trusted) unless `force`; with `if_missing`, a
    directory that holds a CA is left as it is (nothing written: a compose `up` run again). `owner`
    (uid, gid): hand the files to that user (a root one-shot container writing for the image's user)."""
    if if_missing and (directory / "ca.crt").exists():
        return []
    if not 1 <= days <= 3650:
        raise InvalidArgument("days", f"{days} is outside 1-3650")
    names = [*DEFAULT_SANS, *(validate_san(s) for s in sans if s.strip() not in DEFAULT_SANS)]
    if directory.exists() and not directory.is_dir():
        raise InvalidArgument("dir", f"{directory} exists and is not a directory")
    if (directory / "ca.crt").exists() and not force:
        raise InvalidArgument("dir", f"{directory / 'ca.crt'} exists: refusing to replace the CA (certificates it "
                              "signed would no longer be trusted); use --force to replace it, or another DIR")
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    ca = make_ca(days=days)
    written: list[Path] = []
    write_private(directory / "ca.key", key_pem(ca.key))
    write_public(directory / "ca.crt", cert_pem(ca.cert))
    written += [directory / "ca.crt", directory / "ca.key"]
    for leaf in LEAVES:
        cert, key = issue(ca, leaf.common_name, leaf.usages, sans=names if leaf.sans else (), days=days)
        write_leaf(directory, leaf.name, cert, key)
        written += [directory / f"{leaf.name}.crt", directory / f"{leaf.name}.key"]
    if owner is not None:
        for path in written:
            os.chown(path, *owner)
    return written


def parse_owner(value: str) -> tuple[int, int]:
    uid, sep, gid = value.partition(":")
    if not uid.isdigit() or (sep and not gid.isdigit()):
        raise InvalidArgument("owner", f"{value!r} is not UID[:GID] (numbers)")
    return int(uid), int(gid or uid)


def load_ca(directory: Path) -> Authority:
    """The CA `dev_certs` wrote (tests issue more certificates from it)."""
    cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return Authority(cert, key)
