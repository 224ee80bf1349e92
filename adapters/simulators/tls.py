"""Self-signed TLS material generated in memory for the simulators (nothing
is kept on disk beyond the instant ``load_cert_chain`` needs a file)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["self_signed_cert", "server_tls_context", "client_tls_context"]


def self_signed_cert(*hosts: str) -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) valid for a day for ``hosts`` (IPs or names;
    default 127.0.0.1 and localhost), generated in memory."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "notify-sim")])
    now = dt.datetime.now(dt.timezone.utc)
    san: list[x509.GeneralName] = []
    for host in hosts or ("127.0.0.1", "localhost"):
        try:
            san.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            san.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def server_tls_context(*hosts: str) -> tuple[bytes, ssl.SSLContext]:
    """(cert PEM for clients to trust, server SSLContext) for ``hosts``."""
    cert, key = self_signed_cert(*hosts)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as d:  # load_cert_chain reads files only
        cp, kp = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        with open(cp, "wb") as f:
            f.write(cert)
        with open(kp, "wb") as f:
            f.write(key)
        ctx.load_cert_chain(cp, kp)
    return cert, ctx


def client_tls_context(cert_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=cert_pem.decode())
