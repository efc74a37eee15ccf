"""Encrypted channels as LangChain tools (``pip install 'svc-sdk[langchain]'``).

>>> from svc_integrations.langchain import SvcToolkit              # doctest: +SKIP
>>> tools = SvcToolkit(manager=SvcChannelManager("planner")).get_tools()
>>> agent = create_agent(model, tools)

Every tool has a pydantic argument schema, a synchronous ``_run`` and an asynchronous
``_arun`` that runs the blocking call in a worker thread (the event loop never blocks).
Library errors become ``ToolException`` with the library's message, and the tools
return that message to the model by default (``handle_tool_error=True``), so an agent
reads "invalid channel name: …" and can correct itself instead of crashing.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from pydantic import ConfigDict, Field

from svc_sdk import SvcChannelManager
from svc_sdk.adapters._extras import require

require("langchain_core", "langchain", "SvcToolkit")

from langchain_core.tools import BaseTool, BaseToolkit, ToolException  # noqa: E402

from .operations import OPERATIONS, Operation, OperationError, describe  # noqa: E402


class SvcTool(BaseTool):
    """One svc operation as a LangChain tool."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    manager: SvcChannelManager
    operation: Operation
    handle_tool_error: bool = True
    # One line naming each wrong argument, as the MCP tools answer (LangChain validates
    # the arguments itself, before _run).
    handle_validation_error: Any = Field(default=lambda exc: f"invalid arguments: {describe(exc)}")

    def _call(self, arguments: dict[str, Any]) -> str:
        try:
            result: str = self.operation(self.manager, arguments)
            return result
        except OperationError as exc:
            raise ToolException(str(exc)) from exc

    def _run(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> str:
        return self._call(kwargs)

    async def _arun(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> str:
        return await anyio.to_thread.run_sync(self._call, kwargs)


def make_tool(manager: SvcChannelManager, operation: Operation) -> SvcTool:
    return SvcTool(
        name=operation.name,
        description=operation.description,
        args_schema=operation.args,
        manager=manager,
        operation=operation,
    )


class SvcToolkit(BaseToolkit):
    """Tools for one agent's encrypted channels: ``svc_create_channel``, ``svc_invite``,
    ``svc_join``, ``svc_send``, ``svc_receive``, ``svc_list_channels``,
    ``svc_send_envelope`` and ``svc_receive_envelopes``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    manager: SvcChannelManager

    def get_tools(self) -> list[BaseTool]:
        return [make_tool(self.manager, operation) for operation in OPERATIONS]


__all__ = ["SvcTool", "SvcToolkit"]
