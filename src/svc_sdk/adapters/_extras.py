"""Optional dependencies, imported only by the adapters that need them."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Imports ``module`` or explains which extra of svc-sdk brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{feature} needs the optional dependency {module!r}: pip install 'svc-sdk[{extra}]'"
        ) from exc
