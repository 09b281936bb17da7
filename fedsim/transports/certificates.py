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
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedsim.errors import ConfigError

__all__ = ["DEFAULT_TLS_HOSTS", "TlsFiles", "write_tls_files"]

DEFAULT_TLS_HOSTS = ("broker", "localhost", "127.0.0.1")
"""Names in the generated broker certificate: the compose service, and loopback."""


@dataclass(frozen=True)
class TlsFiles:
    """Where :func:`write_tls_files` put the CA certificate and the broker's certificate/key."""

    ca_cert: Path
    cert: Path
    key: Path


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def write_tls_files(
    out_dir: str | Path, hosts: Sequence[str] = DEFAULT_TLS_HOSTS, *, days: int = 825
) -> TlsFiles:
    """Write ``ca.crt``, ``broker.crt`` and ``broker.key`` (0600) to ``out_dir``."""
    if not hosts:
        raise ConfigError("the broker certificate needs at least one host name")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(out / "ca.crt", out / "broker.crt", out / "broker.key")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _with_openssl(files, list(hosts), days)
    else:
        _with_cryptography(files, list(hosts), days)
    return files


def _with_cryptography(files: TlsFiles, hosts: list[str], days: int) -> None:
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
    _write(files.ca_cert, ca_cert.public_bytes(pem), 0o644)
    _write(files.cert, cert.public_bytes(pem), 0o644)
    _write(files.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()), 0o600)


def _with_openssl(files: TlsFiles, hosts: list[str], days: int) -> None:
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
             "-keyout", tmp / "ca.key", "-out", files.ca_cert],
            ["req", *ec, "-subj", f"/CN={hosts[0]}", "-keyout", tmp / "broker.key",
             "-out", tmp / "broker.csr"],
            ["x509", "-req", "-in", tmp / "broker.csr", "-CA", files.ca_cert, "-CAkey",
             tmp / "ca.key", "-CAcreateserial", "-days", str(days), "-extfile", tmp / "ext",
             "-out", files.cert],
        ]
        for step in steps:
            done = subprocess.run([openssl, *map(str, step)], capture_output=True, check=False)
            if done.returncode != 0:
                raise ConfigError(f"openssl {step[0]} failed: {done.stderr.decode(errors='replace')}")
        _write(files.key, (tmp / "broker.key").read_bytes(), 0o600)
