"""Errors a server reports to the person starting it."""


class StartupError(RuntimeError):
    """A server could not start; the message says what to fix (``svc`` prints it)."""
