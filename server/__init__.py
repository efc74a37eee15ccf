"""svc server side, installed as ``svc_server``: the account API and the relay."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("svc-sdk")
except PackageNotFoundError:  # a source tree without an install
    __version__ = "0.0.0"
