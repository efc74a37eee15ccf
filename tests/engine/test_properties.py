"""Property-based tests of the message-processing entry points."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svc_sdk.mls import Engine, Group, MlsError, inspect

from ..conftest import ISSUER, member_id
from .helpers import make_group

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Group, Group]:
    root: Path = tmp_path_factory.mktemp("prop")
    alice, bob = make_group(
        ISSUER.certify(Engine(root / "a", b"alice")), ISSUER.certify(Engine(root / "b", b"bob"))
    )
    return alice, bob


@SETTINGS
@given(data=st.binary(max_size=2048))
def test_process_arbitrary_bytes_never_crashes(pair: tuple[Group, Group], data: bytes) -> None:
    _, bob = pair
    epoch = bob.epoch
    try:
        bob.process(data)
    except MlsError as exc:
        assert str(exc).startswith("MLS engine error: ")
    else:  # pragma: no cover - random bytes are never a valid message from alice
        pytest.fail("random bytes were accepted as a message")
    assert bob.epoch == epoch and not bob.has_pending_commit


@SETTINGS
@given(position=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_any_corruption_is_rejected_and_harmless(
    pair: tuple[Group, Group], position: int, flip: int
) -> None:
    alice, bob = pair
    ciphertext = bytearray(alice.encrypt(b"genuine"))
    ciphertext[position % len(ciphertext)] ^= flip
    with pytest.raises(MlsError, match="^MLS engine error: "):
        bob.process(bytes(ciphertext))
    assert bob.process(alice.encrypt(b"next")).data == b"next"


@SETTINGS
@given(prefix=st.binary(max_size=64), suffix=st.binary(max_size=64))
def test_extended_messages_are_rejected(
    pair: tuple[Group, Group], prefix: bytes, suffix: bytes
) -> None:
    alice, bob = pair
    ciphertext = alice.encrypt(b"genuine")
    if not prefix and not suffix:
        return
    with pytest.raises(MlsError):
        bob.process(prefix + ciphertext + suffix)
    assert bob.process(ciphertext).data == b"genuine"


@SETTINGS
@given(data=st.binary(max_size=2048))
def test_inspect_arbitrary_bytes(data: bytes) -> None:
    try:
        info = inspect(data)
    except MlsError as exc:
        assert str(exc).startswith("MLS engine error: malformed MLS message")
    else:
        assert info.wire_format in {
            "private_message",
            "public_message",
            "welcome",
            "group_info",
            "key_package",
        }


@SETTINGS
@given(data=st.binary(max_size=1024))
def test_join_and_add_with_arbitrary_bytes(pair: tuple[Group, Group], data: bytes) -> None:
    alice, _ = pair
    with pytest.raises(MlsError):
        alice.add_members([data])
    assert not alice.has_pending_commit


@SETTINGS
@given(payload=st.binary(max_size=4096), aad=st.binary(max_size=64))
def test_round_trip_any_payload(pair: tuple[Group, Group], payload: bytes, aad: bytes) -> None:
    alice, bob = pair
    received = bob.process(alice.encrypt(payload, aad))
    assert (received.data, received.authenticated_data, received.sender) == (
        payload,
        aad,
        member_id("alice"),
    )
