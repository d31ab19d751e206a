"""LangChain and LangGraph runs, published to an agentmux stream by a callback handler.

``config={"callbacks": [AgentmuxCallbackHandler(run)]}`` on any runnable (a LangGraph graph, an agent, a
chat model) publishes what its callbacks report, so every client protocol agentmux serves shows the run live:

- a chat model's tokens are one streaming ``text`` per model call, its reasoning one streaming ``thinking``,
  and each tool-call chunk sequence (by its ``index``) one streaming ``tool_call`` (``server_side``: the
  framework runs it), ended when the model call ends; a model that answers whole is published whole;
- a tool's start publishes its call when no model streamed it (a tool run by hand); its end is the call's
  ``tool_result``, its error (or a ``ToolMessage`` with status ``error``) a ``tool_result`` with ``error``;
- each LangGraph node run (a chain run whose name is its ``langgraph_node`` metadata, outside any other node
  run) is a block with the id ``<node>:<step>``, which AG-UI shows as the step's name; everything the node
  runs goes in its block, so nodes that run at once keep their messages apart;
- the stream ends when the top-level run ends: ``completed`` with the model calls' summed usage, or
  ``error`` with the run's exception (``end_stream=False`` leaves it to the caller).

The chunks are read through ``AIMessageChunk.content_blocks``, LangChain's provider-neutral view (text,
reasoning, tool-call chunks), so every integration's reasoning fields map alike. The handler has the
``tap_output_iter``/``tap_output_aiter`` pair LangChain looks for on a streaming handler (what LangGraph's
``stream_mode="messages"`` uses), so a chat model called with ``invoke`` streams its tokens while the
handler is attached.

Two classes share one mapping (:class:`_RunTree`): :class:`AgentmuxCallbackHandler` for blocking code with a
``Producer`` (it runs inline and is thread-safe, for tools LangGraph runs in threads), and
:class:`AsyncAgentmuxCallbackHandler` for ``ainvoke``/``astream`` with an ``AsyncProducer``, whose end is
awaited. The emit methods only enqueue, so no callback waits on the network until the stream's end.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional
from uuid import UUID

from ..errors import AgentmuxError
from ._json import json_safe

if TYPE_CHECKING:
    from ..async_producer import AsyncProducer
    from ..emitter import Emitter
    from ..producer import Producer

try:  # The handlers subclass LangChain's bases; without LangChain only the import of this module fails.
    from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
except ImportError as missing:  # pragma: no cover - exercised only without the framework
    raise ImportError("agentmux.bridges.langchain needs langchain-core: pip install langchain-core") from missing

__all__ = ["AgentmuxCallbackHandler", "AsyncAgentmuxCallbackHandler"]

#: Exceptions by which LangGraph pauses or redirects a graph: a node's end, not a failed run.
_GRAPH_CONTROL = frozenset({"GraphInterrupt", "NodeInterrupt", "ParentCommand", "GraphBubbleUp"})


@dataclass
class _ModelCall:
    """One chat model call's open messages: its text, its reasoning and its tool calls by chunk index."""

    block_id: Optional[str]
    text: Any = None
    thinking: Any = None
    calls: dict[int, Any] = field(default_factory=dict)
    #: Argument fragments of a call whose name has not come yet, by index.
    pending: dict[int, list[str]] = field(default_factory=dict)
    streamed: bool = False


@dataclass
class _Ending:
    """The outcome the top-level run asks the stream to end with."""

    status: str
    usage: Optional[dict[str, int]] = None
    error: Optional[BaseException] = None


class _RunTree:
    """The mapping: LangChain's callbacks in, the producer's emit calls out. Knows each run's parent, the
    block of each node run, the open model calls and the tools running; returns an :class:`_Ending` when the
    top-level run ends, which the handler carries out (blocking or awaited)."""

    def __init__(self, run: Emitter) -> None:
        self._run = run
        self._lock = threading.RLock()
        self._parents: dict[UUID, Optional[UUID]] = {}
        self._blocks: dict[UUID, Any] = {}
        self._block_ids: set[str] = set()
        self._models: dict[UUID, _ModelCall] = {}
        self._tools: dict[UUID, tuple[str, str, Optional[str]]] = {}
        self._published_calls: set[str] = set()
        self._root: Optional[UUID] = None
        self._usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self._usage_known = False

    # Runs and blocks.

    def started(self, run_id: UUID, parent_run_id: Optional[UUID]) -> None:
        self._parents[run_id] = parent_run_id
        if parent_run_id is None and self._root is None:
            self._root = run_id

    def _block_of(self, run_id: Optional[UUID]) -> Optional[str]:
        while run_id is not None:
            block = self._blocks.get(run_id)
            if block is not None:
                return str(block.id)
            run_id = self._parents.get(run_id)
        return None

    def chain_start(self, run_id: UUID, parent_run_id: Optional[UUID], name: Any, metadata: Any) -> None:
        with self._lock:
            self.started(run_id, parent_run_id)
            node = (metadata or {}).get("langgraph_node")
            if node is None or name != node or self._block_of(parent_run_id) is not None:
                return
            base = f"{node}:{(metadata or {}).get('langgraph_step', 0)}"
            block_id, n = base, 1
            while block_id in self._block_ids:
                n += 1
                block_id = f"{base}#{n}"
            self._block_ids.add(block_id)
            self._blocks[run_id] = self._run.block(block_id)

    def finished(self, run_id: UUID, error: Optional[BaseException] = None) -> Optional[_Ending]:
        """A run (of any kind) ended: its block ends; the top-level run's end ends the stream."""
        with self._lock:
            block = self._blocks.pop(run_id, None)
            if block is not None:
                block.end()
            self._parents.pop(run_id, None)
            if run_id != self._root:
                return None
            self._root = None
            for open_run in list(self._models):
                self._end_model(open_run)
            if error is not None and type(error).__name__ not in _GRAPH_CONTROL:
                return _Ending("error", error=error)
            return _Ending("completed", usage=dict(self._usage) if self._usage_known else None)

    # Chat models.

    def model_start(self, run_id: UUID, parent_run_id: Optional[UUID]) -> None:
        with self._lock:
            self.started(run_id, parent_run_id)
            self._models[run_id] = _ModelCall(self._block_of(run_id))

    def token(self, run_id: UUID, token: Any, chunk: Any) -> None:
        with self._lock:
            call = self._models.get(run_id)
            if call is None:
                return
            message = getattr(chunk, "message", None)
            if message is None:  # a completion model's token
                if isinstance(token, str) and token:
                    self._text(call, token)
                return
            for block in _content_blocks(message):
                kind = block.get("type")
                if kind == "text" and block.get("text"):
                    self._text(call, block["text"])
                elif kind == "reasoning" and block.get("reasoning"):
                    call.streamed = True
                    if call.thinking is None:
                        call.thinking = self._run.thinking_stream(block_id=call.block_id)
                    call.thinking.append(block["reasoning"])
                elif kind == "tool_call_chunk":
                    self._call_chunk(call, block)

    def _text(self, call: _ModelCall, fragment: str) -> None:
        call.streamed = True
        if call.text is None:
            call.text = self._run.text_stream(block_id=call.block_id)
        call.text.append(fragment)

    def _call_chunk(self, call: _ModelCall, chunk: dict[str, Any]) -> None:
        call.streamed = True
        index = chunk.get("index") or 0
        handle = call.calls.get(index)
        args = chunk.get("args") or ""
        if handle is None:
            if not chunk.get("name"):
                call.pending.setdefault(index, []).append(args)
                return
            call_id = chunk.get("id")
            handle = self._run.tool_call_stream(chunk["name"], call_id=call_id, block_id=call.block_id)
            call.calls[index] = handle
            self._published_calls.add(handle.call_id)
            args = "".join(call.pending.pop(index, [])) + args
        if args:
            handle.append(args)

    def model_end(self, run_id: UUID, response: Any) -> None:
        with self._lock:
            call = self._models.get(run_id)
            if call is not None and not call.streamed:
                for generation in _generations(response):
                    self._whole(call, getattr(generation, "message", None), getattr(generation, "text", ""))
            self._end_model(run_id)
            self._count(response)

    def _whole(self, call: _ModelCall, message: Any, text: str) -> None:
        """A model call that streamed nothing: its answer, published whole."""
        block_id = call.block_id
        if message is None:
            if text:
                self._run.text(text, block_id=block_id)
            return
        for block in _content_blocks(message):
            if block.get("type") == "text" and block.get("text"):
                self._run.text(block["text"], block_id=block_id)
            elif block.get("type") == "reasoning" and block.get("reasoning"):
                self._run.thinking(block["reasoning"], block_id=block_id)
        for tool_call in getattr(message, "tool_calls", None) or []:
            arguments = _json_text(tool_call.get("args") or {})
            call_id = self._run.tool_call(tool_call["name"], arguments, call_id=tool_call.get("id"), block_id=block_id)
            self._published_calls.add(tool_call.get("id") or call_id)

    def _end_model(self, run_id: UUID) -> None:
        call = self._models.pop(run_id, None)
        self._parents.pop(run_id, None)
        if call is None:
            return
        for handle in [call.text, call.thinking, *call.calls.values()]:
            if handle is not None:
                handle.end()

    def _count(self, response: Any) -> None:
        for generation in _generations(response):
            usage = getattr(getattr(generation, "message", None), "usage_metadata", None)
            if usage:
                self._add_usage(usage.get("input_tokens", 0), usage.get("output_tokens", 0))
                return
        token_usage = (getattr(response, "llm_output", None) or {}).get("token_usage") or {}
        if token_usage:
            self._add_usage(token_usage.get("prompt_tokens", 0), token_usage.get("completion_tokens", 0))

    def _add_usage(self, prompt: Any, completion: Any) -> None:
        prompt, completion = int(prompt or 0), int(completion or 0)
        self._usage["prompt_tokens"] += prompt
        self._usage["completion_tokens"] += completion
        self._usage["total_tokens"] += prompt + completion
        self._usage_known = True

    # Tools.

    def tool_start(
        self, run_id: UUID, parent_run_id: Optional[UUID], name: str, inputs: Any, tool_call_id: Any
    ) -> None:
        with self._lock:
            self.started(run_id, parent_run_id)
            block_id = self._block_of(run_id)
            call_id = str(tool_call_id) if tool_call_id else None
            if call_id is None or call_id not in self._published_calls:
                arguments = inputs if isinstance(inputs, dict) else {"input": inputs}
                call_id = self._run.tool_call(name, _json_text(arguments), call_id=call_id, block_id=block_id)
                self._published_calls.add(call_id)
            self._tools[run_id] = (call_id, name, block_id)

    def tool_end(self, run_id: UUID, output: Any) -> None:
        with self._lock:
            tool = self._tools.pop(run_id, None)
            if tool is None:
                return
            call_id, name, block_id = tool
            content = getattr(output, "content", output)
            if getattr(output, "status", None) == "error":
                message = content if isinstance(content, str) else str(json_safe(content))
                self._run.tool_result(call_id, error=message, name=name, block_id=block_id)
            else:
                self._run.tool_result(call_id, result=json_safe(content), name=name, block_id=block_id)

    def tool_error(self, run_id: UUID, error: BaseException) -> None:
        with self._lock:
            tool = self._tools.pop(run_id, None)
            if tool is not None:
                call_id, name, block_id = tool
                failure = {"message": str(error) or type(error).__name__, "code": type(error).__name__}
                self._run.tool_result(call_id, error=failure, name=name, block_id=block_id)


def _json_text(value: Any) -> str:
    """A tool's arguments as the JSON text a ``tool_call`` carries, non-ASCII kept as it is."""
    return json.dumps(json_safe(value), ensure_ascii=False)


def _content_blocks(message: Any) -> list[dict[str, Any]]:
    """A message's content as LangChain's standard blocks; plain text when a message cannot say."""
    try:
        return list(message.content_blocks)
    except Exception:  # an integration's content LangChain cannot translate: its text still goes out
        content = getattr(message, "content", "")
        return [{"type": "text", "text": content}] if isinstance(content, str) else []


def _generations(response: Any) -> list[Any]:
    return [generation for batch in getattr(response, "generations", None) or [] for generation in batch]


class _Callbacks:
    """The callbacks both handlers share, each feeding the mapping; ``_ended`` carries out an ending."""

    _tree: _RunTree

    def tap_output_iter(self, run_id: UUID, output: Iterator[Any]) -> Iterator[Any]:
        """Passes a run's output through: with this method (and ``tap_output_aiter``) LangChain counts the
        handler as a streaming one, and a chat model called with ``invoke`` streams its tokens to it."""
        return output

    def tap_output_aiter(self, run_id: UUID, output: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The async twin of :meth:`tap_output_iter`."""
        return output

    def _chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        metadata: Any = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name")
        self._tree.chain_start(run_id, parent_run_id, name, metadata)

    def _model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, parent_run_id: Optional[UUID] = None, **kwargs: Any
    ) -> None:
        self._tree.model_start(run_id, parent_run_id)

    def _token(self, token: Any, *, chunk: Any = None, run_id: UUID, **kwargs: Any) -> None:
        self._tree.token(run_id, token, chunk)

    def _model_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> Optional[_Ending]:
        self._tree.model_end(run_id, response)
        return self._tree.finished(run_id)

    def _tool_start(
        self,
        serialized: Any,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        inputs: Any = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        arguments = inputs if inputs is not None else input_str
        self._tree.tool_start(run_id, parent_run_id, name, arguments, kwargs.get("tool_call_id"))

    def _tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> Optional[_Ending]:
        self._tree.tool_end(run_id, output)
        return self._tree.finished(run_id)

    def _tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> Optional[_Ending]:
        self._tree.tool_error(run_id, error)
        return self._tree.finished(run_id, error)


class AgentmuxCallbackHandler(_Callbacks, BaseCallbackHandler):
    """Publishes a LangChain/LangGraph run to ``run`` (a ``Producer``, or an ``AsyncProducer`` when the
    stream's end is left to the caller); see the module doc. ``end_stream``: end the stream when the
    top-level run ends (the default)."""

    run_inline = True
    raise_error = True

    def __init__(self, run: Producer | AsyncProducer, *, end_stream: bool = True) -> None:
        if end_stream and inspect.iscoroutinefunction(run.end):
            raise TypeError("an AsyncProducer's end is awaited: use AsyncAgentmuxCallbackHandler, or end_stream=False")
        super().__init__()
        self._tree = _RunTree(run)
        self._run = run
        self._end_stream = end_stream

    def _ended(self, ending: Optional[_Ending]) -> None:
        if ending is None or not self._end_stream:
            return
        try:
            self._run.end(status=ending.status, usage=ending.usage, error=ending.error)
        except AgentmuxError:
            if ending.error is None:
                raise  # a completed run whose stream could not end: the caller must hear of it
            # Otherwise the run's own error is on its way to the caller; it must not be replaced.

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self._chain_start(serialized, inputs, **kwargs)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(self._tree.finished(run_id))

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(self._tree.finished(run_id, error))

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self._model_start(serialized, messages, **kwargs)

    def on_llm_start(self, serialized: Any, prompts: Any, **kwargs: Any) -> None:
        self._model_start(serialized, prompts, **kwargs)

    def on_llm_new_token(self, token: str | list[str | dict[str, Any]], **kwargs: Any) -> None:
        self._token(token, **kwargs)

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self._ended(self._model_end(response, **kwargs))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.model_end(run_id, None)
        self._ended(self._tree.finished(run_id, error))

    def on_tool_start(self, serialized: Any, input_str: str, **kwargs: Any) -> None:
        self._tool_start(serialized, input_str, **kwargs)

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        self._ended(self._tool_end(output, **kwargs))

    def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        self._ended(self._tool_error(error, **kwargs))


class AsyncAgentmuxCallbackHandler(_Callbacks, AsyncCallbackHandler):
    """:class:`AgentmuxCallbackHandler` for async code: ``run`` is an ``AsyncProducer``, and the stream's end
    at the top-level run's end is awaited before ``ainvoke`` returns."""

    raise_error = True

    def __init__(self, run: AsyncProducer, *, end_stream: bool = True) -> None:
        super().__init__()
        self._tree = _RunTree(run)
        self._run = run
        self._end_stream = end_stream

    async def _ended(self, ending: Optional[_Ending]) -> None:
        if ending is None or not self._end_stream:
            return
        try:
            await self._run.end(status=ending.status, usage=ending.usage, error=ending.error)
        except AgentmuxError:
            if ending.error is None:
                raise
            # As in AgentmuxCallbackHandler: the run's own error goes on to the caller.

    async def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self._chain_start(serialized, inputs, **kwargs)

    async def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        await self._ended(self._tree.finished(run_id))

    async def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        await self._ended(self._tree.finished(run_id, error))

    async def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self._model_start(serialized, messages, **kwargs)

    async def on_llm_start(self, serialized: Any, prompts: Any, **kwargs: Any) -> None:
        self._model_start(serialized, prompts, **kwargs)

    async def on_llm_new_token(self, token: str | list[str | dict[str, Any]], **kwargs: Any) -> None:
        self._token(token, **kwargs)

    async def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        await self._ended(self._model_end(response, **kwargs))

    async def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tree.model_end(run_id, None)
        await self._ended(self._tree.finished(run_id, error))

    async def on_tool_start(self, serialized: Any, input_str: str, **kwargs: Any) -> None:
        self._tool_start(serialized, input_str, **kwargs)

    async def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        await self._ended(self._tool_end(output, **kwargs))

    async def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        await self._ended(self._tool_error(error, **kwargs))
