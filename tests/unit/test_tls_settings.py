"""`schedctl certs dev`, the TLS settings' validation (errors name the field) and the refusal to run plaintext
off loopback without `insecure`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from scheduler.certs import LEAVES, dev_certs
from scheduler.client.settings import ClientSettings
from scheduler.config import TlsSettings, is_loopback, refuse_plaintext
from scheduler.errors import InvalidArgument
from scheduler.worker.settings import WorkerSettings

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    dev_certs(d, sans=["planner.example", "10.1.2.3"])
    return d


def _cert(d: Path, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate((d / f"{name}.crt").read_bytes())


def test_dev_certs_are_signed_by_the_ca_with_their_usages_and_names(certs: Path) -> None:
    ca = _cert(certs, "ca")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for leaf in LEAVES:
        c = _cert(certs, leaf.name)
        c.verify_directly_issued_by(ca)
        assert c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == leaf.common_name
        usages = set(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        assert usages == set(leaf.usages)
        assert stat.S_IMODE((certs / f"{leaf.name}.key").stat().st_mode) == 0o600, leaf.name
        days = (c.not_valid_after_utc - c.not_valid_before_utc).days
        assert 29 <= days <= 31
    planner = _cert(certs, "planner").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(planner.get_values_for_type(x509.DNSName)) == {"localhost", "planner.example"}
    assert {str(ip) for ip in planner.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.1.2.3"}
    assert ExtendedKeyUsageOID.SERVER_AUTH not in set(
        _cert(certs, "worker").extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert stat.S_IMODE((certs / "ca.key").stat().st_mode) == 0o600
    assert _cert(certs, "etcd-client").subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "sched"


def test_certs_dev_cli_refuses_to_replace_a_ca_and_bad_input(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SCHEDCTL, "certs", "dev", *args], env=CLEAN_ENV, capture_output=True, text=True,
                              timeout=60, check=False)

    d = tmp_path / "c"
    r = run(str(d))
    assert r.returncode == 0, r.stderr
    assert str(d / "planner.key") in r.stdout
    before = (d / "ca.crt").read_bytes()
    r = run(str(d))
    assert r.returncode == 2 and "dir:" in r.stderr and "--force" in r.stderr, r.stderr
    assert (d / "ca.crt").read_bytes() == before  # untouched
    assert run(str(d), "--force").returncode == 0
    assert (d / "ca.crt").read_bytes() != before
    r = run(str(tmp_path / "x"), "--san", "not a name!")
    assert r.returncode == 2 and r.stderr.startswith("schedctl: san:"), r.stderr
    r = run(str(tmp_path / "y"), "--days", "0")
    assert r.returncode == 2 and r.stderr.startswith("schedctl: days:"), r.stderr
    (tmp_path / "file").write_text("")
    r = run(str(tmp_path / "file"))
    assert r.returncode == 2 and "not a directory" in r.stderr, r.stderr


def test_tls_settings_are_checked_at_start_naming_the_field(certs: Path, tmp_path: Path) -> None:
    f = {n: str(certs / n) for n in ("planner.crt", "planner.key", "worker.key", "ca.crt")}
    ok = TlsSettings.load({"tls_cert_file": f["planner.crt"], "tls_key_file": f["planner.key"],
                           "tls_ca_file": f["ca.crt"]}, env={})
    assert ok.enabled and ok.tls_require_client_cert
    (tmp_path / "junk.pem").write_text("hello")
    cases = [
        ({"tls_cert_file": f["planner.crt"]}, "tls_key_file", "go together"),
        ({"tls_cert_file": f["planner.crt"], "tls_key_file": f["worker.key"], "tls_ca_file": f["ca.crt"]},
         "tls_key_file", "does not belong"),
        ({"tls_cert_file": str(tmp_path / "missing.crt"), "tls_key_file": f["planner.key"]}, "tls_cert_file",
         "cannot read"),
        ({"tls_cert_file": f["planner.crt"], "tls_key_file": f["planner.key"],
          "tls_ca_file": str(tmp_path / "junk.pem")}, "tls_ca_file", "not PEM"),
        ({"tls_cert_file": f["planner.crt"], "tls_key_file": f["planner.key"]}, "tls_ca_file",
         "tls_require_client_cert"),
        ({"tls_ca_file": f["ca.crt"]}, "tls_cert_file", "needs its own certificate"),
        ({"tls_require_client_cert": "maybe"}, "tls_require_client_cert", "not a valid bool"),
    ]
    for flags, field, words in cases:
        with pytest.raises(InvalidArgument) as e:
            TlsSettings.load(flags, env={})
        assert e.value.field == field and words in e.value.reason, (flags, str(e.value))
    # Server-only TLS (clients present no certificate: bearer tokens) is a choice, said explicitly.
    TlsSettings.load({"tls_cert_file": f["planner.crt"], "tls_key_file": f["planner.key"],
                      "tls_require_client_cert": "false"}, env={})
    # From the environment and the TOML file too, as every setting.
    env = {"SCHED_TLS_CERT_FILE": f["planner.crt"], "SCHED_TLS_KEY_FILE": f["planner.key"]}
    with pytest.raises(InvalidArgument) as e:
        TlsSettings.load({}, env=env)
    assert e.value.field == "tls_ca_file"
    with pytest.raises(InvalidArgument) as e:
        ClientSettings.load({"tls_cert_file": f["planner.crt"]}, env={})
    assert e.value.field == "tls_key_file"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("10.0.0.1", False), ("::", False), ("planner.example", False), ("", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("address", ["10.0.0.1:7000", "0.0.0.0", "http://etcd-r1:2379", "[2001:db8::1]:7000",
                                     "planner:7000"])
def test_plaintext_off_loopback_is_refused_unless_insecure(address: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        refuse_plaintext("API", address, "api_host", secure=False, insecure=False)
    assert e.value.field == "insecure" and "insecure = true" in e.value.reason and address in e.value.reason
    refuse_plaintext("API", address, "api_host", secure=True, insecure=False)
    refuse_plaintext("API", address, "api_host", secure=False, insecure=True)


@pytest.mark.parametrize("address", ["127.0.0.1:7000", "localhost:7000", "[::1]:7000", "http://127.0.0.1:2379",
                                     "127.0.0.1", "::1"])
def test_plaintext_on_loopback_is_allowed(address: str) -> None:
    refuse_plaintext("API", address, "api_host", secure=False, insecure=False)


def test_a_worker_refuses_plaintext_planners_off_loopback(certs: Path) -> None:
    with pytest.raises(InvalidArgument) as e:
        WorkerSettings.load({"planners": "127.0.0.1:7000,10.0.0.5:7000"}, env={})
    assert e.value.field == "insecure" and "planners[1]" in e.value.reason
    WorkerSettings.load({"planners": "10.0.0.5:7000", "insecure": "true"}, env={})
    WorkerSettings.load({"planners": "10.0.0.5:7000", "tls_ca_file": str(certs / "ca.crt")}, env={})


def test_a_planner_refuses_plaintext_off_loopback(tmp_path: Path) -> None:
    """The real command: exit 2 before anything starts, naming the setting; with insecure it gets further (to
    etcd, which is not there; the API address is then taken as asked)."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SCHEDCTL, "planner", *args], env=CLEAN_ENV, capture_output=True, text=True,
                              timeout=60, check=False)

    r = run("--api-host", "0.0.0.0")  # no auth either: that refusal comes first (tests/unit/auth)
    assert r.returncode == 2 and r.stderr.startswith("schedctl: auth_file:"), r.stderr
    auth = tmp_path / "auth.toml"
    auth.write_text("")
    r = run("--api-host", "0.0.0.0", "--auth-file", str(auth))
    assert r.returncode == 2 and r.stderr.startswith("schedctl: insecure: refusing plaintext API") \
        and "api_host" in r.stderr, r.stderr
    r = run("--etcd-endpoints", "10.9.9.9:2379")
    assert r.returncode == 2 and "etcd_endpoints[0]" in r.stderr, r.stderr
    r = run("--tls-cert-file", str(tmp_path / "none.crt"), "--tls-key-file", str(tmp_path / "none.key"))
    assert r.returncode == 2 and r.stderr.startswith("schedctl: tls_cert_file: cannot read"), r.stderr
    r = run("--api-host", "0.0.0.0", "--insecure", "banana")
    assert r.returncode == 2 and r.stderr.startswith("schedctl: insecure:") and "not a valid bool" in r.stderr
