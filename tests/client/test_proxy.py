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
from tests.client.proxy import ConnectProxy, clear_proxy_variables


@pytest.fixture(params=[False, True], ids=["200 alone", "200 with the relay's first bytes"])
def proxy(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[ConnectProxy]:
    clear_proxy_variables(monkeypatch)
    running = ConnectProxy(early=request.param)
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
        # More than HTTP/2's default 64 KiB window: lost SETTINGS from the relay would
        # leave the stream stalled there.
        bulk = [f"{i:06d}" * 10_000 for i in range(5)]
        for text in bulk:
            alice.send(channel_name, text)
        received: list[str] = []
        while len(received) < len(bulk):
            got = bob.receive(channel_name, timeout=10)
            assert got, f"stalled after {len(received)} of {len(bulk)} messages of 60 KB"
            received += got
        assert received == bulk
    finally:
        alice.close()
        bob.close()
    assert proxy.targets() == {authority(stack.api_url), authority(stack.relay_url)}
    if proxy.early:  # the relay's HTTP/2 server spoke first: its bytes came with the 200
        assert proxy.early[authority(stack.relay_url)] > 0
    basic = "Basic " + base64.b64encode(b"agent:s3cr@t").decode()
    assert {auth for _, auth in proxy.tunnels} == {basic}


def test_no_proxy_goes_direct(
    stack: LocalStack,
    monkeypatch: pytest.MonkeyPatch,
    ids: Callable[[str], str],
    channel_name: str,
) -> None:
    clear_proxy_variables(monkeypatch)
    proxy = ConnectProxy()
    try:
        monkeypatch.setenv("ALL_PROXY", proxy.url)
        through = stack.manager(ids("through"))
        through.create(channel_name)
        through.close()
        assert proxy.targets() == {authority(stack.api_url), authority(stack.relay_url)}
        monkeypatch.setenv("no_proxy", "example.com, 127.0.0.0/8")
        tunnels = len(proxy.tunnels)
        direct = stack.manager(ids("direct"))
        direct.create(f"{channel_name}-direct")
        direct.send(f"{channel_name}-direct", "direct")
        direct.close()
        assert len(proxy.tunnels) == tunnels
    finally:
        proxy.close()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", r"requires authorization \(407\)"),
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", r"refused the tunnel \(403\)"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not HTTP"),
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
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_proxy_variables(monkeypatch)
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(TransportError, match=r"ALL_PROXY names a socks5:// proxy: only http://"):
        start_agent(stack, tmp_path, "behind-a-socks-proxy")
    monkeypatch.setenv("ALL_PROXY", "http://agent:pa@ss@127.0.0.1:3128")
    with pytest.raises(TransportError, match="percent-encode '@'") as refused:
        start_agent(stack, tmp_path, "behind-a-misspelt-proxy")
    assert "pa@ss" not in str(refused.value)
