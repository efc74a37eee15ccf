"""gRPC's status codes, which the relay protocol uses for a stream's end and a Reply's
``code``: shared by the client and the relay (through ``svc_sdk.protocol``)."""

from __future__ import annotations

import enum


class Code(enum.IntEnum):
    """gRPC status codes: a stream's end, and a Reply's ``code``."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16
