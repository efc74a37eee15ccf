"""A scripted chat model, for running LangChain agents in tests and notebooks without a
model provider or network.

>>> def step(messages):                                           # doctest: +SKIP
...     return ("svc_create_channel", {"channel": "acme/demo/chat"})
>>> agent = create_agent(ScriptedChatModel(script=[step, "done"]), tools)

Each script entry produces the model's next turn: a ``(tool_name, args)`` pair is a
tool call, a str is a final answer, and a callable receives the conversation so far
and returns either (so a step can use what an earlier tool returned).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from svc_sdk.extras import require

require("langchain_core", "langchain", "ScriptedChatModel")

from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from pydantic import Field  # noqa: E402

Turn = tuple[str, dict[str, Any]] | str
Step = Turn | Callable[[list[BaseMessage]], Turn]

_ids = itertools.count()


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model that plays ``script`` instead of calling a provider.

    ``script`` is a list of turns, one per model call: ``(tool_name, args)`` asks for a
    tool call, a str is the final answer, and a callable gets the messages so far and
    returns either (so a step can use what an earlier tool returned). The turn is chosen
    by how many model turns the conversation already holds; once the script is used up
    the model answers "done". Tools bound with ``bind_tools`` are accepted and ignored.

    >>> model = ScriptedChatModel(script=[("svc_list_channels", {}), "no channels yet"])
    """

    script: list[Any] = Field(default_factory=list)
    """Turns, in order (see the module docstring); once used up, the model says "done"."""

    @property
    def _llm_type(self) -> str:
        return "svc-scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        """Returns the model unchanged: the script, not the tools, decides each call."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        turns = sum(isinstance(m, AIMessage) for m in messages)
        step: Step = self.script[turns] if turns < len(self.script) else "done"
        turn = step(messages) if callable(step) else step
        if isinstance(turn, str):
            message = AIMessage(content=turn)
        else:
            name, args = turn
            call = {"name": name, "args": args, "id": f"call_{next(_ids)}", "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])
