from __future__ import annotations

from typing import Any

from svc_sdk import Channel, SvcClient
from svc_sdk.testing import LocalStack


def client(stack: LocalStack, name: str, **kwargs: Any) -> SvcClient:
    return SvcClient(
        kwargs.pop("endpoint", stack.relay_url),
        kwargs.pop("data_dir", stack.agent_dir(name)),
        name.encode(),
        api_key=kwargs.pop("api_key", stack.api_key),
        api_url=stack.api_url,
        **kwargs,
    )


def pair(
    stack: LocalStack, channel: str, a: str, b: str
) -> tuple[SvcClient, Channel, SvcClient, Channel]:
    """Two agents in one channel: ``a`` created it and added ``b`` by key package."""
    ca, cb = client(stack, a), client(stack, b)
    chan_a = ca.create_channel(channel)
    welcome = chan_a.add_member(cb.generate_key_package())
    chan_b = cb.join_channel(channel, welcome)
    return ca, chan_a, cb, chan_b


def take(channel: Channel, n: int, timeout: float = 20.0) -> list[bytes]:
    out = []
    for _ in range(n):
        message = channel.next_message(timeout)
        assert message is not None, f"got {len(out)} of {n} messages: {out[-3:]}"
        out.append(message.data)
    return out
