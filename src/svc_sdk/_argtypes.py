"""argparse types shared by the ``svc`` command's parsers."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (no upper bound if None).

    >>> whole_number(1, 1000)("25")
    25
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"{low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, not {value}")
        return value

    return parse
