"""Each status code a real server (or no server) returns arrives as its typed exception; TLS."""

import asyncio
import datetime
import ipaddress
import time

import pytest
from fixtures_server import idle, start_server, wait_until

from attnserve.clients import (
    NO_RETRY,
    AsyncClient,
    Client,
    InvalidArgument,
    ResourceExhausted,
    RetryPolicy,
    TlsConfig,
    Unauthenticated,
    Unavailable,
)

PROMPT = "import "


@pytest.fixture
def live(server):
    server.pacer.reset()
    yield server
    wait_until(lambda: idle(server.engine), what="the shared server to go idle")


def test_invalid_argument_names_the_field(live):
    with Client(live.target, timeout=5) as client:
        with pytest.raises(InvalidArgument, match="prompt"):
            client.generate("")
        with pytest.raises(InvalidArgument, match="temperature") as caught:
            list(client.stream(PROMPT, temperature=-1.0))
    assert caught.value.status == "INVALID_ARGUMENT" and caught.value.details

    async def main():
        async with AsyncClient(live.target, timeout=5) as client:
            with pytest.raises(InvalidArgument, match="top_p"):
                await client.generate(PROMPT, top_p=2.0)

    asyncio.run(main())


def test_full_queue_is_resource_exhausted_and_not_retried(tiny_model_dir):
    running = start_server(tiny_model_dir, max_batch=1, max_queue=1)
    running.pacer.hold(when=lambda: running.engine.stats()["active"] == 1)  # the first one cannot end
    refused = lambda: (
        running.server.metrics.registry.get_sample_value(
            "attnserve_requests_total", {"method": "Generate", "code": "RESOURCE_EXHAUSTED"}
        )
        or 0
    )
    try:
        with Client(running.target, timeout=10) as client:
            busy = []
            for state in ({"active": 1, "queued": 0}, {"active": 1, "queued": 1}):
                busy.append(client.stream(PROMPT, max_new_tokens=100))
                wait_until(lambda state=state: running.engine.stats() == state, what=str(state))
            with pytest.raises(ResourceExhausted, match="queue"):
                client.generate(PROMPT, max_new_tokens=1)
            assert refused() == 1  # one call reached the server: the client did not send it again
            for stream in busy:
                stream.cancel()
            running.pacer.release()
        wait_until(lambda: idle(running.engine), what="the cancelled requests to leave")
    finally:
        running.stop()


def test_bearer_token_auth(tiny_model_dir, tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    running = start_server(tiny_model_dir, auth_token_file=str(tmp_path / "token"))
    try:
        with Client(running.target, timeout=5) as anonymous:
            assert anonymous.health(timeout=2) is True  # health is exempt
            with pytest.raises(Unauthenticated):
                anonymous.generate(PROMPT, max_new_tokens=2)
            with pytest.raises(Unauthenticated):
                list(anonymous.stream(PROMPT, max_new_tokens=2))
        with Client(running.target, timeout=5, token="wrong") as wrong, pytest.raises(Unauthenticated):
            wrong.model_info()
        with Client(running.target, timeout=5, token="s3cret") as client:
            assert client.generate(PROMPT, max_new_tokens=2).usage.completion_tokens == 2
    finally:
        running.stop()


def test_closed_port_is_unavailable_after_bounded_retries():
    with Client("127.0.0.1:1", timeout=5, retry=NO_RETRY) as client:
        with pytest.raises(Unavailable):  # not DEADLINE_EXCEEDED: the client did not wait for a server
            client.generate(PROMPT)
        with pytest.raises(Unavailable):
            list(client.stream(PROMPT))
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.1, jitter=0.0)
    with Client("127.0.0.1:1", timeout=5, retry=policy) as client:
        t0 = time.monotonic()
        with pytest.raises(Unavailable):  # after its attempts, within the 5 s timeout
            client.model_info()
        assert time.monotonic() - t0 >= 0.3  # it did retry: backoffs of 0.1 s and 0.2 s at the least

    async def main():
        async with AsyncClient("127.0.0.1:1", timeout=5, retry=NO_RETRY) as client:
            with pytest.raises(Unavailable):
                await client.generate(PROMPT)
            with pytest.raises(Unavailable):
                await client.stream(PROMPT).result()

    asyncio.run(main())


def self_signed(path, name: str) -> tuple:
    """A self-signed certificate (its own CA) for `name` and 127.0.0.1; PEM paths (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = path / f"{name}.crt", path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_tls_and_mutual_tls(tiny_model_dir, tmp_path):
    server_cert, server_key = self_signed(tmp_path, "localhost")
    client_cert, client_key = self_signed(tmp_path, "client")
    running = start_server(
        tiny_model_dir, tls_cert=str(server_cert), tls_key=str(server_key), tls_client_ca=str(client_cert)
    )
    target = f"localhost:{running.server.port}"
    try:
        mtls = TlsConfig.from_files(ca=server_cert, cert=client_cert, key=client_key)
        with Client(target, timeout=5, tls=mtls) as client:
            assert client.generate(PROMPT, max_new_tokens=2).usage.completion_tokens == 2
            assert client.health(timeout=2)
        no_cert = TlsConfig.from_files(ca=server_cert)
        with Client(target, timeout=2, tls=no_cert, retry=NO_RETRY) as no_client_cert, pytest.raises(Unavailable):
            no_client_cert.model_info()
        with Client(target, timeout=2, retry=NO_RETRY) as plaintext, pytest.raises(Unavailable):
            plaintext.model_info()
    finally:
        running.stop()
