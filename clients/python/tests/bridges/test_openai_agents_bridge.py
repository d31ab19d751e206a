"""`agentmux.bridges.openai_agents` against the real service: what a stream holds after an OpenAI Agents SDK run
published through the bridge. The agents' models are agentmux's own built-in ones (`replay/<fixture>`),
reached over its `/v1/chat/completions` with the SDK's `OpenAIChatCompletionsModel`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import APIError, AsyncOpenAI

from agentmux import AsyncClient
from agentmux.bridges.openai_agents import publish_events, publish_run

from server import Server
from snapshot import blocks, published, snapshot, stream_end


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    yield


def agent(base_url: str, model: str) -> Agent:
    chat = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="not-checked-on-loopback", max_retries=0)
    return Agent(
        name="Poet",
        model=OpenAIChatCompletionsModel(model=model, openai_client=chat),
        model_settings=ModelSettings(include_usage=True),
    )


async def test_the_events_pass_through_unchanged_while_reasoning_and_text_are_published(server: Server) -> None:
    result = Runner.run_streamed(agent(server.base_url, "replay/thinking-then-text"), "A haiku, please.")
    seen = []
    async with AsyncClient(server.base_url) as client, client.stream(model="poet") as run:
        async for event in publish_events(result, run):
            seen.append(event)
    state = snapshot(server.base_url, run.stream_id)

    assert any(e.type == "raw_response_event" and e.data.type == "response.output_text.delta" for e in seen)
    assert result.final_output == "Crisp leaves drift and fall,\nthe maple lets go of red,\nwind keeps what it finds."
    assert published(state) == [
        ("event", "Poet:1", {"event": "agent_updated", "data": {"agent": "Poet"}}),
        ("thinking", "Poet:1", {"content": "The user wants a haiku about autumn: 5, 7, 5 syllables."}),
        ("text", "Poet:1", {"content": result.final_output}),
    ]
    assert blocks(state) == [("block_start", "Poet:1"), ("block_end", "Poet:1")]
    assert state["status"] == "completed"


async def test_publish_run_makes_a_stream_and_ends_it_with_the_runs_usage(server: Server) -> None:
    result = Runner.run_streamed(agent(server.base_url, "replay/usage"), "How many?")
    async with AsyncClient(server.base_url) as client:
        run = await publish_run(result, client, model="counter")
    state = snapshot(server.base_url, run.stream_id)

    assert result.final_output == "Four."
    assert [props for kind, _, props in published(state) if kind == "text"] == [{"content": "Four."}]
    assert state["status"] == "completed"
    assert stream_end(state)["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    assert state["messages"][0]["props"]["data"]["model"] == "counter"


async def test_a_run_that_raises_ends_the_stream_error_and_the_error_goes_on(server: Server) -> None:
    result = Runner.run_streamed(agent(server.base_url, "replay/failed"), "Go.")
    async with AsyncClient(server.base_url) as client:
        async with client.stream() as run:
            with pytest.raises(APIError, match="overloaded"):
                await publish_run(result, run)
    state = snapshot(server.base_url, run.stream_id)

    assert [props for kind, _, props in published(state) if kind == "text"] == [{"content": "Working on it"}]
    assert state["status"] == "error"
    error = stream_end(state)["error"]
    assert error["code"] == "APIError" and "overloaded" in error["message"], error
    assert blocks(state) == [("block_start", "Poet:1"), ("block_end", "Poet:1")], "the turn's block is ended"
