"""Channel names: ``org/namespace/service``.

Each of the three parts is 1 to 64 characters of ``A-Z a-z 0-9 . _ -``; the relay and
the account API enforce the same rule.

>>> check_channel_name("acme/support/triage")
'acme/support/triage'
>>> is_valid_channel_name("acme//triage")
False
"""

from __future__ import annotations

import re

from svc_sdk.errors import ChannelNameError

# Shared with the relay and the account API, which enforce the same rule.
PATTERN = r"^[A-Za-z0-9._-]{1,64}/[A-Za-z0-9._-]{1,64}/[A-Za-z0-9._-]{1,64}$"
_NAME = re.compile(PATTERN)


def is_valid_channel_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.match(name) is not None and "\n" not in name


def check_channel_name(name: object) -> str:
    """Returns the name, or raises ChannelNameError (a RuntimeError)."""
    if not is_valid_channel_name(name):
        raise ChannelNameError(name if isinstance(name, str) else repr(name))
    return name  # type: ignore[return-value]
