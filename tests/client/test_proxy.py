"""Agents behind an HTTP proxy: HTTP_PROXY / HTTPS_PROXY / ALL_PROXY / NO_PROXY, read as
curl reads them, take both the account API's connections and the relay's through a
CONNECT tunnel (docs/operations.md, "Agents behind an HTTP proxy")."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from svc_sdk import SvcChannelManager, TransportError
from svc_sdk.testing import LocalStack
from tests.client.proxy import ConnectProxy

VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def clear_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectProxy]:
    clear_proxy_variables(monkeypatch)
    running = ConnectProxy()
    yield running
    running.close()


def authority(url: str) -> str:
    return urlsplit(url).netloc


def start_agent(stack: LocalStack, directory: Path, name: str) -> SvcChannelManager:
    """An agent made directly (not through the stack, which would close it at the end)."""
    return SvcChannelManager(
        name,
        endpoint=stack.relay_url,
        data_dir=directory / name,
        api_key=stack.api_key,
        api_url=stack.api_url,
        timeout=5,
    )


def test_an_agent_reaches_the_api_and_the_relay_through_the_proxy(
    stack: LocalStack,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
    ids: Callable[[str], str],
    channel_name: str,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://agent:s3cr%40t@127.0.0.1:{proxy.port}")
    alice, bob = stack.manager(ids("alice")), stack.manager(ids("bob"))
    try:
        alice.create(channel_name)
        bob.join_with_token(channel_name, alice.invite(channel_name), timeout=20)
        alice.send(channel_name, "through the proxy")
        assert bob.receive(channel_name, timeout=10) == ["through the proxy"]
    finally:
        alice.close()
        bob.close()
    assert proxy.targets() == {authority(stack.api_url), authority(stack.relay_url)}
    basic = "Basic " + base64.b64encode(b"agent:s3cr@t").decode()
    assert {auth for _, auth in proxy.tunnels} == {basic}


def test_no_proxy_goes_direct(
    stack: LocalStack,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
    ids: Callable[[str], str],
    channel_name: str,
) -> None:
    monkeypatch.setenv("ALL_PROXY", proxy.url)
    monkeypatch.setenv("no_proxy", "example.com, 127.0.0.0/8")
    alice = stack.manager(ids("alice"))
    try:
        alice.create(channel_name)
        alice.send(channel_name, "direct")
    finally:
        alice.close()
    assert proxy.tunnels == []


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", "proxy authorization required"),
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", "unsuccessful"),
    ],
)
def test_a_proxy_that_refuses_the_tunnel_is_a_transport_error(
    stack: LocalStack,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    answer: bytes,
    why: str,
) -> None:
    clear_proxy_variables(monkeypatch)
    refusing = ConnectProxy(answer=answer)
    monkeypatch.setenv("HTTP_PROXY", refusing.url)
    try:
        with pytest.raises(TransportError, match=f"proxy 127.0.0.1:{refusing.port}.*{why}"):
            start_agent(stack, tmp_path, "behind-a-strict-proxy")
    finally:
        refusing.close()
    assert refusing.targets() == {authority(stack.api_url)}


def test_a_proxy_the_transport_cannot_speak_is_refused_not_bypassed(
    stack: LocalStack, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(TransportError, match=r"socks5://127\.0\.0\.1:1080.*only http:// proxies"):
        start_agent(stack, tmp_path, "behind-a-socks-proxy")
