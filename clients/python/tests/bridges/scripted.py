"""A chat model for the LangChain bridge's tests: `langchain_core`'s `GenericFakeChatModel` answering its scripted
messages in turn, streamed the way a provider streams them (reasoning, text tokens, tool-call chunks split in
two, usage in a last chunk), with a `bind_tools` so LangGraph's tool loop can use it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

#: The usage each scripted answer reports.
USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}


class ScriptedChatModel(GenericFakeChatModel):
    """Answers with `messages` in turn; see the module doc."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _stream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        message = next(self.messages)
        reasoning = message.additional_kwargs.get("reasoning_content")
        if reasoning:
            thought = AIMessageChunk(content="", additional_kwargs={"reasoning_content": reasoning})
            yield ChatGenerationChunk(message=thought)
        for token in re.split(r"(\s)", message.content):
            if token:
                yield ChatGenerationChunk(message=AIMessageChunk(content=token))
        for index, call in enumerate(message.tool_calls):
            arguments = json.dumps(call["args"])
            half = len(arguments) // 2
            first = {"name": call["name"], "id": call["id"], "args": arguments[:half], "index": index}
            rest = {"name": None, "id": None, "args": arguments[half:], "index": index}
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[first]))
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[rest]))
        usage = AIMessageChunk(content="", usage_metadata=dict(USAGE))  # type: ignore[arg-type]
        yield ChatGenerationChunk(message=usage)
