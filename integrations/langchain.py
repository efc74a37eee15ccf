"""Encrypted channels as LangChain tools (``pip install 'svc-sdk[langchain]'``).

>>> from svc_integrations.langchain import SvcToolkit              # doctest: +SKIP
>>> tools = SvcToolkit(manager=SvcChannelManager("planner")).get_tools()
>>> agent = create_agent(model, tools)

Every tool has a pydantic argument schema, a synchronous ``_run`` and an asynchronous
``_arun`` (``ainvoke``) that runs on the event loop through :mod:`svc_sdk.aio`: sending
and receiving take no worker thread, and a receive cancelled while it waits loses no
message (docs/client.md); only membership changes (create, invite, join) run in a
worker thread, as aio runs them.
Library errors become ``ToolException`` with the library's message, and the tools
return that message to the model by default (``handle_tool_error=True``), so an agent
reads "invalid channel name: …" and can correct itself instead of crashing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ConfigDict, Field

from svc_sdk import AsyncSvcChannelManager, SvcChannelManager
from svc_sdk.extras import require

require("langchain_core", "langchain", "SvcToolkit")

from langchain_core.tools import BaseTool, BaseToolkit, ToolException  # noqa: E402

from .operations import OPERATIONS, Operation, OperationError, describe  # noqa: E402


class SvcTool(BaseTool):
    """One svc operation as a LangChain tool. ``aio`` is the manager's asyncio face that
    ``ainvoke`` awaits; the toolkit gives its tools one between them, and a tool made
    without one wraps ``manager`` itself."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    manager: SvcChannelManager
    operation: Operation
    aio: AsyncSvcChannelManager | None = None
    handle_tool_error: bool = True
    # One line naming each wrong argument, as the MCP tools answer (LangChain validates
    # the arguments itself, before _run).
    handle_validation_error: Any = Field(default=lambda exc: f"invalid arguments: {describe(exc)}")

    def model_post_init(self, context: Any) -> None:
        """Wraps ``manager`` in an :class:`~svc_sdk.AsyncSvcChannelManager` when no
        ``aio`` was given; refuses an ``aio`` around another manager."""
        super().model_post_init(context)
        if self.aio is None:
            self.aio = AsyncSvcChannelManager(self.manager)
        elif self.aio.manager is not self.manager:
            raise ValueError("aio must wrap the tool's own manager")

    def _run(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> str:
        with _tool_errors():
            return self.operation.reply(self.manager, kwargs).text

    async def _arun(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> str:
        assert self.aio is not None  # model_post_init made it
        with _tool_errors():
            return (await self.operation.areply(self.aio, kwargs)).text


@contextmanager
def _tool_errors() -> Iterator[None]:
    try:
        yield
    except OperationError as exc:
        raise ToolException(str(exc)) from exc


def make_tool(
    manager: SvcChannelManager, operation: Operation, aio: AsyncSvcChannelManager | None = None
) -> SvcTool:
    return SvcTool(
        name=operation.name,
        description=operation.description,
        args_schema=operation.args,
        manager=manager,
        operation=operation,
        aio=aio,
    )


class SvcToolkit(BaseToolkit):
    """Tools for one agent's encrypted channels: ``svc_create_channel``, ``svc_invite``,
    ``svc_join``, ``svc_send``, ``svc_receive``, ``svc_list_channels``,
    ``svc_send_envelope`` and ``svc_receive_envelopes``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    manager: SvcChannelManager

    def get_tools(self) -> list[BaseTool]:
        aio = AsyncSvcChannelManager(self.manager)  # one asyncio face for all the tools
        return [make_tool(self.manager, operation, aio) for operation in OPERATIONS]


__all__ = ["SvcTool", "SvcToolkit"]
