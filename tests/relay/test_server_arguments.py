"""Bad arguments to the relay's native server (``RelayServer``) are clear errors before
anything listens: half a TLS configuration, material that is not PEM, a negative
duration, a port another listener holds."""

from __future__ import annotations

import socket

import pytest

from svc_sdk.protocol import RelayServer


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="both cert_pem and key_pem"):
        RelayServer("127.0.0.1", 0, max_frame=1024, cert_pem=b"x")
    with pytest.raises(ValueError, match="certificate or key"):
        RelayServer("127.0.0.1", 0, max_frame=1024, cert_pem=b"not pem", key_pem=b"nor this")
    with pytest.raises(ValueError, match="keepalive"):
        RelayServer("127.0.0.1", 0, max_frame=1024, keepalive=-1.0)


def test_a_taken_port_is_an_os_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            RelayServer("127.0.0.1", taken.getsockname()[1], max_frame=1024)
