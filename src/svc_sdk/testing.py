"""``LocalStack``: the account API and the relay on free loopback ports, for tests,
notebooks and ``svc demo``. Needs the server extra (``pip install 'svc-sdk[server]'``).

>>> with LocalStack() as stack:                                   # doctest: +SKIP
...     with stack.manager("alice") as alice, stack.manager("bob") as bob:
...         alice.create("acme/demo/chat")
...         bob.join_with_token("acme/demo/chat", alice.invite("acme/demo/chat"))
...         alice.send("acme/demo/chat", "hello")
...         print(bob.receive("acme/demo/chat"))
['hello']

The stack is one ``svc up`` process (SQLite in a temporary directory) so the servers
never share a GIL or an event loop with the agents under test. ``settings`` become
``SVC_*`` environment variables of that process, e.g. ``token_ttl_seconds=30``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from svc_sdk import credentials
from svc_sdk.agent_credential import CREDENTIAL_LABEL, CredentialContent
from svc_sdk.errors import InternalError
from svc_sdk.manager import SvcChannelManager
from svc_sdk.mls import Engine

_ADDRESS = re.compile(r"^svc (account API|relay)\s+(https?://\S+)$")


class LocalStack:
    """A running account API and relay (``start()``, or use it as a context manager),
    with one signed-up account: ``api_url``, ``relay_url`` and ``api_key`` point at
    them, and ``manager(identity)`` makes agents on them."""

    def __init__(self, *, start_timeout: float = 30.0, **settings: Any) -> None:
        self._settings = settings
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._owned_dir: str | None = None
        self._managers: list[SvcChannelManager] = []
        self._lock = threading.Lock()
        self.api_url = ""
        self.relay_url = ""
        self.api_key = ""
        self.account_id = ""
        self.data_dir = Path()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> LocalStack:
        """Starts ``svc up`` on free ports with a fresh SQLite database in a temporary
        directory, and signs up one account; returns self once both servers answer."""
        self._owned_dir = tempfile.mkdtemp(prefix="svc-stack-")
        self.data_dir = Path(self._owned_dir)
        try:
            self._launch(0, 0)
            account = self.signup()
            self.api_key = account["api_key"]["key"]
            self.account_id = account["account"]["id"]
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, api_port: int, relay_port: int) -> None:
        env = dict(os.environ)
        env.pop("SVC_DATABASE_URL", None)
        env.pop("SVC_REDIS_URL", None)
        env["SVC_DATA_DIR"] = str(self.data_dir / "server")
        for name, value in self._settings.items():
            env[f"SVC_{name.upper()}"] = str(value)
        command = ["up", "--api-port", str(api_port), "--relay-port", str(relay_port)]
        # -P: the installed svc_sdk, never a folder of that name in the working directory.
        self._proc = subprocess.Popen(  # noqa: S603 - our own interpreter, fixed arguments
            [sys.executable, "-P", "-m", "svc_cli", *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._read_addresses()

    def _read_addresses(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        found: dict[str, str] = {}
        deadline = time.monotonic() + self._start_timeout
        while len(found) < 2:
            line = self._proc.stdout.readline()
            if not line:
                err = self._proc.stderr.read() if self._proc.stderr else ""
                raise InternalError(f"svc up exited during start-up: {err.strip()}")
            match = _ADDRESS.match(line.strip())
            if match:
                found[match.group(1)] = match.group(2)
            if time.monotonic() > deadline:
                raise InternalError("svc up did not start in time")
        self.api_url, self.relay_url = found["account API"], found["relay"]
        # Keep the pipes drained so a chatty server never blocks on a full pipe.
        for stream in (self._proc.stdout, self._proc.stderr):
            threading.Thread(target=_drain, args=(stream,), daemon=True).start()

    @property
    def pid(self) -> int | None:
        """The ``svc up`` process, which serves the relay (the account API runs in a child
        of it); None before start."""
        return None if self._proc is None else self._proc.pid

    def stop(self) -> None:
        """Closes the managers it made, stops the servers, deletes the temporary data."""
        with self._lock:
            managers, self._managers = self._managers, []
        for manager in managers:
            manager.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------

    def signup(self, email: str | None = None) -> dict[str, Any]:
        """Creates another account; returns the API's answer (``api_key.key`` is the key)."""
        email = email or f"agent-{uuid.uuid4().hex[:12]}@example.com"
        response = httpx.post(
            f"{self.api_url}/v1/accounts",
            json={"email": email},
            timeout=10,
            verify=credentials.tls_verify(),
        )
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def agent_dir(self, identity: bytes | str) -> Path:
        """The data_dir ``manager`` gives ``identity``: inside the stack's temporary
        directory, so ``stop`` removes it."""
        ident = identity.encode() if isinstance(identity, str) else identity
        return self.data_dir / "agents" / ident.hex()

    def manager(
        self, identity: bytes | str, *, api_key: str | None = None, **kwargs: Any
    ) -> SvcChannelManager:
        """A manager for ``identity`` on this stack (data in the stack's temporary
        directory, the stack's account unless ``api_key`` is given). Closed by stop()."""
        manager = SvcChannelManager(
            identity,
            endpoint=kwargs.pop("endpoint", self.relay_url),
            data_dir=kwargs.pop("data_dir", self.agent_dir(identity)),
            api_key=api_key or self.api_key,
            api_url=self.api_url,
            **kwargs,
        )
        with self._lock:
            self._managers.append(manager)
        return manager

    def kill(self) -> None:
        """Kills the servers with SIGKILL (for failure tests); ``restart`` brings them back."""
        assert self._proc is not None
        self._proc.kill()
        self._proc.wait()

    def restart(self) -> None:
        """Starts the servers again on the same ports with the same data."""
        if self._proc is not None and self._proc.poll() is None:
            self.kill()
        api_port = int(self.api_url.rsplit(":", 1)[1])
        relay_port = int(self.relay_url.rsplit(":", 1)[1])
        self._launch(api_port, relay_port)


def _drain(stream: Any) -> None:
    # Reads a child's pipe to the end so the child never blocks on a full pipe.
    for _ in stream:
        pass


class LocalIssuer:
    """Agent credentials signed in this process, standing in for the account API where
    only the MLS engine is under test (engine tests, engine benchmarks). Agents that go
    through a relay get theirs from a real API (``LocalStack``).

    >>> issuer = LocalIssuer()
    >>> alice = issuer.certify(Engine("/tmp/alice", b"alice"))    # doctest: +SKIP
    >>> alice.member_id == issuer.account.bytes + b"alice"         # doctest: +SKIP
    True
    """

    def __init__(self, kid: str = "local-issuer", account: uuid.UUID | None = None) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self.kid = kid
        #: The account the credentials name unless told otherwise.
        self.account = account or uuid.uuid4()
        self._key = Ed25519PrivateKey.generate()
        self.public_key = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def anchors(self) -> dict[str, bytes]:
        """What ``Engine.set_trust_anchors`` takes to trust this issuer."""
        return {self.kid: self.public_key}

    def credential(
        self,
        engine: Engine,
        *,
        account: uuid.UUID | None = None,
        identity: bytes | None = None,
        signature_key: bytes | None = None,
        not_before: int | None = None,
        not_after: int | None = None,
    ) -> bytes:
        """A credential for ``engine`` (its identity and key, valid for an hour from now);
        each field can be overridden to make a bad one."""
        now = int(time.time())
        content = CredentialContent(
            issuer=self.kid,
            account=(account or self.account).bytes,
            identity=engine.identity if identity is None else identity,
            cipher_suite=engine.cipher_suite,
            signature_key=engine.signature_key if signature_key is None else signature_key,
            not_before=now if not_before is None else not_before,
            not_after=now + 3600 if not_after is None else not_after,
        )
        return content.signed(self._key.sign(CREDENTIAL_LABEL + content.encode()))

    def certify(self, engine: Engine, account: uuid.UUID | None = None) -> Engine:
        """Trusts this issuer in ``engine`` and installs a credential for it."""
        engine.set_trust_anchors(self.anchors)
        engine.install_credential(self.credential(engine, account=account))
        return engine


def certify_with_api(engine: Engine, api_url: str, api_key: str) -> Engine:
    """Trusts the account API's credential keys in ``engine`` and installs an agent
    credential the API issued for it, as ``SvcClient`` does: what an engine driven
    without a client needs before the relay takes its key packages and groups."""
    from svc_sdk.api_client import ApiClient

    client = ApiClient(api_url, api_key)
    try:
        engine.set_trust_anchors(client.credential_keys())
        engine.install_credential(client.agent_credential(engine))
    finally:
        client.close()
    return engine
