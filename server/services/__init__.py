"""Business logic of the account API, independent of HTTP."""
