"""svc: end-to-end encrypted (MLS) messaging for software agents.

The MLS engine is available as :mod:`svc_sdk.mls`.
"""

from importlib.metadata import PackageNotFoundError, version

from svc_sdk.mls import MlsError

try:
    __version__ = version("svc-sdk")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["MlsError", "__version__"]
