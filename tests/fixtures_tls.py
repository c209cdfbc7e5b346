"""A throwaway PKI for the TLS tests: a CA, a server certificate for 127.0.0.1, a client certificate."""

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def issue(name: str, issuer=None, ca: bool = False):
    """A key and a certificate for `name`, signed by `issuer` (key, cert) or self-signed."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_key, issuer_cert = issuer or (key, None)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return key, builder.sign(issuer_key, hashes.SHA256())


def pem(key=None, cert=None) -> bytes:
    if cert is not None:
        return cert.public_bytes(serialization.Encoding.PEM)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a stranger CA."""
    folder = tmp_path_factory.mktemp("pki")
    ca = issue("attnserve test CA", ca=True)
    server_key, server_cert = issue("127.0.0.1", issuer=ca)
    client_key, client_cert = issue("client", issuer=ca)
    stranger = issue("stranger CA", ca=True)
    files = {
        "ca": pem(cert=ca[1]),
        "server.crt": pem(cert=server_cert),
        "server.key": pem(server_key),
        "client.crt": pem(cert=client_cert),
        "client.key": pem(client_key),
        "stranger": pem(cert=stranger[1]),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder, files
