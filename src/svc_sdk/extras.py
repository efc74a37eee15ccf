"""Optional dependencies: :func:`require` imports one or says which extra of svc-sdk
brings it. The adapters import theirs through it only when used, and so do the
integrations (``svc_integrations``) and any code built on svc_sdk that wants the same
error message.

>>> require("langchain_core", "langchain", "SvcToolkit")           # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Imports ``module`` or raises ImportError naming the extra that brings it:
    ``{feature} needs the optional dependency {module!r}: pip install 'svc-sdk[{extra}]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{feature} needs the optional dependency {module!r}: pip install 'svc-sdk[{extra}]'"
        ) from exc
