"""Throwaway TLS and SuperNode-authentication files for a Flower deployment on this machine.

:func:`write_tls` writes a self-signed CA (``ca.pem``) and a SuperLink server certificate it
signs (``server.pem``, key ``server.key``) valid for ``127.0.0.1`` and ``localhost``: what
``flower-superlink --ssl-ca-certfile --ssl-certfile --ssl-keyfile`` serves and what SuperNodes,
``flwr`` and the Flower backend verify with ``root_certificates``. :func:`write_node_key` writes a
SuperNode key pair in the OpenSSH formats Flower reads (an EC P-384 private key for
``flower-supernode --auth-supernode-private-key``, its public key for ``flwr supernode register``).
Made with the ``cryptography`` package (a dependency of Flower), on this machine, nothing fetched;
for tests and benchmarks, never for a real deployment's certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA certificate and the server certificate and key."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def write_tls(directory: Path, days: int = 2) -> TlsFiles:
    """Write a CA and a server certificate for 127.0.0.1/localhost into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedlightning throwaway CA"))
        .issuer_name(_name("fedlightning throwaway CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA384())
    )
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(_pem_key(key))
    files.key.chmod(0o600)
    return files


def write_node_key(directory: Path, name: str) -> tuple[Path, Path]:
    """Write a SuperNode's EC P-384 key pair (OpenSSH formats); return (private, public) paths."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = directory / name, directory / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return private, public
