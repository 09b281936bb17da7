"""A private certificate authority and a broker certificate for one run (``fedsim deploy``).

:func:`write_tls_files` makes a fresh CA (EC P-256, valid ``days``) and signs with it a broker
certificate whose subject alternative names are the given host names and IP addresses; clients
and the server trust the CA only (``--tls-ca ca.crt``), so a broker certificate from anywhere
else is refused. The CA's private key is never written: it signs the one certificate and is
forgotten (run ``fedsim deploy`` again for new certificates). The broker's key is written with
mode 0600. With the ``cryptography`` package the work is done in-process; without it by the
``openssl`` command line tool.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedsim.atomic import replace_together
from fedsim.errors import ConfigError

__all__ = ["BROKER_CERT", "BROKER_KEY", "CA_CERT", "DEFAULT_TLS_HOSTS", "TlsFiles", "tls_file_contents",
           "write_tls_files"]

DEFAULT_TLS_HOSTS = ("broker", "localhost", "127.0.0.1")
"""Names in the generated broker certificate: the compose service, and loopback."""


@dataclass(frozen=True)
class TlsFiles:
    """Where :func:`write_tls_files` put the CA certificate and the broker's certificate/key."""

    ca_cert: Path
    cert: Path
    key: Path


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


CA_CERT, BROKER_CERT, BROKER_KEY = "ca.crt", "broker.crt", "broker.key"


def write_tls_files(
    out_dir: str | Path, hosts: Sequence[str] = DEFAULT_TLS_HOSTS, *, days: int = 825
) -> TlsFiles:
    """Write ``ca.crt``, ``broker.crt`` and ``broker.key`` (0600) to ``out_dir``, replaced
    together (:func:`~fedsim.atomic.replace_together`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    contents = tls_file_contents(hosts, days=days)
    replace_together({out / name: content for name, content in contents.items()},
                     durability="file")
    return TlsFiles(out / CA_CERT, out / BROKER_CERT, out / BROKER_KEY)


def tls_file_contents(
    hosts: Sequence[str] = DEFAULT_TLS_HOSTS, *, days: int = 825
) -> dict[str, tuple[bytes, int]]:
    """A fresh CA (its key forgotten) and a broker certificate and key for ``hosts``: each
    file's name (:data:`CA_CERT`, :data:`BROKER_CERT`, :data:`BROKER_KEY`) -> its bytes and
    mode (the key 0600), nothing written."""
    if not hosts:
        raise ConfigError("the broker certificate needs at least one host name")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        ca_cert, cert, key = _with_openssl(list(hosts), days)
    else:
        ca_cert, cert, key = _with_cryptography(list(hosts), days)
    return {CA_CERT: (ca_cert, 0o644), BROKER_CERT: (cert, 0o644), BROKER_KEY: (key, 0o600)}


def _with_cryptography(hosts: list[str], days: int) -> tuple[bytes, bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsim run CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h) for h in hosts
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return (ca_cert.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _with_openssl(hosts: list[str], days: int) -> tuple[bytes, bytes, bytes]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigError(
            "generating TLS certificates needs the 'cryptography' package or the openssl tool "
            "(or pass --tls-cert/--tls-key, or --plain for an unencrypted listener)"
        )
    san = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        (tmp / "ext").write_text(
            f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
            "extendedKeyUsage=serverAuth\n"
        )
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        steps = [
            ["req", "-x509", *ec, "-days", str(days), "-subj", "/CN=fedsim run CA",
             "-keyout", tmp / "ca.key", "-out", tmp / CA_CERT],
            ["req", *ec, "-subj", f"/CN={hosts[0]}", "-keyout", tmp / "broker.key",
             "-out", tmp / "broker.csr"],
            ["x509", "-req", "-in", tmp / "broker.csr", "-CA", tmp / CA_CERT, "-CAkey",
             tmp / "ca.key", "-CAcreateserial", "-days", str(days), "-extfile", tmp / "ext",
             "-out", tmp / BROKER_CERT],
        ]
        for step in steps:
            done = subprocess.run([openssl, *map(str, step)], capture_output=True, check=False)
            if done.returncode != 0:
                raise ConfigError(f"openssl {step[0]} failed: {done.stderr.decode(errors='replace')}")
        return ((tmp / CA_CERT).read_bytes(), (tmp / BROKER_CERT).read_bytes(),
                (tmp / "broker.key").read_bytes())
