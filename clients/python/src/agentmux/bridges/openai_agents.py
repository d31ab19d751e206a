"""The OpenAI Agents SDK's streamed run, published to an agentmux stream.

``Runner.run_streamed`` gives a ``RunResultStreaming`` whose ``stream_events()`` yields three kinds of event:
the model's raw Responses stream events (text, reasoning and function-call argument deltas), run items (a tool
was called, a tool returned, a handoff was asked for and happened) and agent changes. This module maps them to
agentmux's typed messages as they come, so every client protocol agentmux serves shows the run live:

- each model turn (one ``response.created`` … the tool outputs that follow it) is one block, with the id
  ``<agent name>:<turn>`` (AG-UI shows it as the step's name);
- text deltas are one streaming ``text`` per output message, reasoning deltas one streaming ``thinking``;
- a function call is one streaming ``tool_call`` (``server_side``: the SDK runs it), its arguments as they
  stream, ended when the model has sent them; its output is the call's ``tool_result``;
- a handoff is a tool call too (the model calls ``transfer_to_…``), answered by the handoff's output, plus
  ``event`` messages ``handoff_requested`` and ``handoff``; an agent change is an ``event`` ``agent_updated``
  at the start of the new agent's first turn (in its block);
- the stream ends ``completed`` with the run's usage, or ``error`` when the run raises (re-raised).

Items the model did not stream (a model that answers whole) are published whole from their run item.

Two ways in, both reading the run's events once: :func:`publish_events` passes every event through unchanged
while publishing it (for code that already loops over ``stream_events()``), and :func:`publish_run` consumes
them (one line when nothing else reads them). The module reads the events by their ``type`` and never imports
the SDK at run time (only its types, for type checkers), so ``import agentmux`` never needs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..async_producer import AsyncProducer
from ..errors import AgentmuxError
from ._json import json_safe

if TYPE_CHECKING:
    from agents import RunResultStreaming
    from agents.stream_events import StreamEvent

    from ..async_client import AsyncClient

__all__ = ["publish_events", "publish_run"]


async def publish_events(
    result: RunResultStreaming, run: AsyncProducer, *, end: bool = True
) -> AsyncIterator[StreamEvent]:
    """Yields ``result.stream_events()`` unchanged, publishing each to ``run`` first.

    With ``end`` (the default) the stream ends when the run does: ``completed`` with the run's usage, or
    ``error`` when the run raises (the exception goes on to the caller). A loop that stops early leaves the
    stream open for the caller to end.
    """
    turns = _Turns(run)
    try:
        async for event in result.stream_events():
            turns.publish(event)
            yield event
    except BaseException as exc:
        if isinstance(exc, GeneratorExit):  # the caller stopped reading: the run and the stream are its own
            _quietly(turns.close)
            raise
        result.cancel()  # over already when the run raised; stopped when publishing did
        _quietly(turns.close)
        if end:
            await _end_failed(run, exc)
        raise
    turns.close()
    if end:
        await run.end(status="completed", usage=_usage(result))


async def publish_run(
    result: RunResultStreaming, target: AsyncClient | AsyncProducer, *, model: str | None = None
) -> AsyncProducer:
    """Publishes the whole run to ``target`` and returns the producer it wrote to, ended, once the run is over
    (``result`` then holds the run's final output as usual).

    ``target`` is a producer the caller opened (``async with client.stream() as run``: its ``stream_id`` can go
    to the watchers before the run starts), or an :class:`~agentmux.AsyncClient`, for which a new stream is
    made, named ``model``.
    """
    if isinstance(target, AsyncProducer):
        async for _ in publish_events(result, target):
            pass
        return target
    async with target.stream(model=model) as run:
        async for _ in publish_events(result, run):
            pass
    return run


async def _end_failed(run: AsyncProducer, exc: BaseException) -> None:
    """Ends the stream for a run that raised: ``cancelled`` for a cancelled task, else ``error`` with the
    exception's message and type; a refusal here (the stream had ended) must not hide the run's own error."""
    status = "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
    try:
        await run.end(status=status, error=exc if status == "error" else None)
    except AgentmuxError:
        pass


def _quietly(close: Any) -> None:
    """Ends what is open on the way out of a failure; a refusal there (the producer had failed) must not
    hide the failure that is on its way to the caller."""
    try:
        close()
    except AgentmuxError:
        pass


def _usage(result: RunResultStreaming) -> dict[str, int] | None:
    usage = getattr(getattr(result, "context_wrapper", None), "usage", None)
    if usage is None:
        return None
    prompt, completion = int(usage.input_tokens or 0), int(usage.output_tokens or 0)
    if not prompt and not completion:
        return None  # the model reported none (chat completions without `include_usage`): unknown, not zero
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Turns:
    """The mapping's state across one run: the open block (the current model turn), the open streaming
    messages of that turn by their output index, and the tool calls already published by call id."""

    def __init__(self, run: AsyncProducer) -> None:
        self._run = run
        self._block: Any = None
        self._agent = "agent"
        self._agent_changed = False
        self._turn = 0
        self._texts: dict[int, Any] = {}
        self._thinking: dict[int, Any] = {}
        self._calls: dict[int, Any] = {}
        self._names: dict[str, str] = {}
        self._streamed_text = False
        self._streamed_reasoning = False

    def publish(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "raw_response_event":
            self._raw(event.data)
        elif kind == "run_item_stream_event":
            self._item(event.name, event.item)
        elif kind == "agent_updated_stream_event":
            # Told at the start of the new agent's first turn, in its block: an event outside any block
            # would be a step of its own in the UI message stream and AG-UI.
            self._agent = event.new_agent.name
            self._agent_changed = True

    def close(self) -> None:
        self._end_messages()
        self._close_block()
        self._tell_agent()

    def _tell_agent(self) -> None:
        if self._agent_changed:
            self._agent_changed = False
            self._run.event("agent_updated", {"agent": self._agent})

    # The model's stream: one turn per response.

    def _raw(self, data: Any) -> None:
        kind = getattr(data, "type", "")
        index = getattr(data, "output_index", 0)
        if kind == "response.created":
            self._end_messages()
            self._close_block()
            self._turn += 1
            self._block = self._run.block(f"{self._agent}:{self._turn}")
            self._block.__enter__()
            self._tell_agent()
            self._streamed_text = self._streamed_reasoning = False
        elif kind == "response.output_item.added":
            self._item_added(index, data.item)
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            self._streamed_text = True
            self._handle(self._texts, index, self._run.text_stream).append(data.delta)
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            self._streamed_reasoning = True
            self._handle(self._thinking, index, self._run.thinking_stream).append(data.delta)
        elif kind == "response.function_call_arguments.delta":
            call = self._calls.get(index)
            if call is not None:
                call.append(data.delta)
        elif kind == "response.output_item.done":
            for handles in (self._texts, self._thinking, self._calls):
                handle = handles.pop(index, None)
                if handle is not None:
                    handle.end()
        elif kind == "response.completed":
            self._end_messages()

    def _item_added(self, index: int, item: Any) -> None:
        if getattr(item, "type", None) != "function_call":
            return
        self._names[item.call_id] = item.name
        call = self._run.tool_call_stream(item.name, call_id=item.call_id)
        self._calls[index] = call
        if item.arguments:
            call.append(item.arguments)

    @staticmethod
    def _handle(handles: dict[int, Any], index: int, open_one: Any) -> Any:
        handle = handles.get(index)
        if handle is None:
            handle = handles[index] = open_one()
        return handle

    def _end_messages(self) -> None:
        for handles in (self._texts, self._thinking, self._calls):
            for handle in handles.values():
                handle.end()
            handles.clear()

    def _close_block(self) -> None:
        block, self._block = self._block, None
        if block is not None:
            block.end()

    # Run items: what the SDK did with the model's output.

    def _item(self, name: str, item: Any) -> None:
        run = self._run
        if name == "tool_called":
            call_id = getattr(item, "call_id", None)
            if call_id not in self._names:
                tool = getattr(item, "tool_name", None) or "tool"
                self._names[call_id or ""] = tool
                arguments = getattr(item.raw_item, "arguments", None)
                run.tool_call(tool, arguments if arguments is not None else "", call_id=call_id)
        elif name == "tool_output":
            call_id = str(getattr(item, "call_id", "") or "")
            run.tool_result(call_id, result=json_safe(item.output), name=self._names.get(call_id))
        elif name == "handoff_requested":
            raw = item.raw_item
            run.event("handoff_requested", {"tool": raw.name, "call_id": raw.call_id})
        elif name == "handoff_occured":
            self._handoff(item)
        elif name == "message_output_created" and not self._streamed_text:
            text = "".join(getattr(part, "text", "") or getattr(part, "refusal", "") for part in item.raw_item.content)
            if text:
                run.text(text)
        elif name == "reasoning_item_created" and not self._streamed_reasoning:
            raw = item.raw_item
            parts = [*(getattr(raw, "summary", None) or []), *(getattr(raw, "content", None) or [])]
            thought = "".join(getattr(part, "text", "") for part in parts)
            if thought:
                run.thinking(thought)
        elif name.startswith("mcp_"):
            run.event(name, {"type": getattr(item, "type", None)})

    def _handoff(self, item: Any) -> None:
        raw = item.raw_item
        call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
        output = raw.get("output") if isinstance(raw, dict) else getattr(raw, "output", None)
        if call_id:
            self._run.tool_result(call_id, result=json_safe(output), name=self._names.get(call_id))
        self._run.event("handoff", {"from": item.source_agent.name, "to": item.target_agent.name})
