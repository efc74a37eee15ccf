"""TLS end to end: `svc up` with a certificate serves https:// on both the API and the
relay; clients trust it through SVC_TLS_CA_FILE and refuse it without."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from svc_sdk import SvcChannelManager, TransportError
from svc_sdk.testing import LocalStack
from tests.client.proxy import ConnectProxy, clear_proxy_variables


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "svc test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert_file, key_file


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Path]]:
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SVC_TLS_CA_FILE", str(cert))  # LocalStack signs up over https
        with LocalStack(tls_cert_file=str(cert), tls_key_file=str(key)) as stack:
            yield stack, cert


def test_messages_over_tls(
    tls_stack: tuple[LocalStack, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    stack, cert = tls_stack
    assert stack.api_url.startswith("https://") and stack.relay_url.startswith("https://")
    monkeypatch.setenv("SVC_TLS_CA_FILE", str(cert))
    alice, bob = stack.manager("tls-alice"), stack.manager("tls-bob")
    alice.create("acme/tls/chat")
    bob.join_with_token("acme/tls/chat", alice.invite("acme/tls/chat"), timeout=20)
    alice.send("acme/tls/chat", "over TLS and MLS")
    assert bob.receive("acme/tls/chat", timeout=10) == ["over TLS and MLS"]


def test_tls_runs_end_to_end_through_a_proxy(
    tls_stack: tuple[LocalStack, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTPS_PROXY: the proxy tunnels the API's and the relay's connections and sees their
    host and port, never what goes through the tunnel."""
    stack, cert = tls_stack
    monkeypatch.setenv("SVC_TLS_CA_FILE", str(cert))
    clear_proxy_variables(monkeypatch)
    proxy = ConnectProxy()
    try:
        monkeypatch.setenv("https_proxy", proxy.url)
        alice, bob = stack.manager("tls-proxy-alice"), stack.manager("tls-proxy-bob")
        try:
            alice.create("acme/tls/proxied")
            bob.join_with_token("acme/tls/proxied", alice.invite("acme/tls/proxied"), timeout=20)
            alice.send("acme/tls/proxied", "tunnelled")
            assert bob.receive("acme/tls/proxied", timeout=10) == ["tunnelled"]
        finally:
            alice.close()
            bob.close()
    finally:
        proxy.close()
    assert proxy.targets() == {urlsplit(stack.api_url).netloc, urlsplit(stack.relay_url).netloc}
    assert proxy.piped and b"acme/tls/proxied" not in proxy.piped and b"/v1/" not in proxy.piped


def test_an_untrusted_certificate_is_refused(
    tls_stack: tuple[LocalStack, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stack, _ = tls_stack
    monkeypatch.delenv("SVC_TLS_CA_FILE", raising=False)
    with pytest.raises(TransportError, match="transport error: "):
        SvcChannelManager(
            "tls-mallory",
            endpoint=stack.relay_url,
            data_dir=tmp_path / "m",
            api_key=stack.api_key,
            api_url=stack.api_url,
        )


def test_half_a_tls_configuration_is_a_startup_error(tmp_path: Path) -> None:
    from svc_server.config import Settings
    from svc_server.errors import StartupError

    with pytest.raises(StartupError, match="needs both"):
        _ = Settings(data_dir=tmp_path, tls_cert_file=str(tmp_path / "cert.pem")).tls
    missing = Settings(
        data_dir=tmp_path,
        tls_cert_file=str(tmp_path / "nope.pem"),
        tls_key_file=str(tmp_path / "nope.key"),
    )
    with pytest.raises(StartupError, match="cannot read TLS files"):
        _ = missing.tls
