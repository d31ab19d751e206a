"""`agentmux.bridges.langchain` against the real service: what a stream holds after a LangChain or LangGraph run
published through the callback handler (tokens, reasoning, tool calls and results, node blocks, the end)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentmux import AsyncClient, Client
from agentmux.bridges.langchain import AgentmuxCallbackHandler, AsyncAgentmuxCallbackHandler

from scripted import ScriptedChatModel
from server import Server
from snapshot import blocks, published, snapshot, stream_end


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    if city == "Atlantis":
        raise ValueError("no weather under the sea")
    return f"Sunny in {city}"


def tool_loop(*answers: AIMessage) -> Any:
    """LangGraph's tool loop: an "agent" node calling the scripted model, a "tools" node running the tool."""
    model = ScriptedChatModel(messages=iter(answers)).bind_tools([get_weather])
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def calling(city: str) -> AIMessage:
    return AIMessage(content="Checking.", tool_calls=[{"name": "get_weather", "args": {"city": city}, "id": "call_1"}])


def test_a_graph_run_is_tokens_tool_calls_and_results_in_one_block_per_node_run(server: Server) -> None:
    answer = AIMessage(content="Sunny, go out.", additional_kwargs={"reasoning_content": "Easy."})
    graph = tool_loop(calling("Oslo"), answer)
    with Client(server.base_url) as client, client.stream(model="graph") as run:
        graph.invoke({"messages": [("user", "Oslo?")]}, config={"callbacks": [AgentmuxCallbackHandler(run)]})
    state = snapshot(server.base_url, run.stream_id)

    call = {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}', "server_side": True}
    assert published(state) == [
        ("text", "agent:1", {"content": "Checking."}),
        ("tool_call", "agent:1", call),
        ("tool_result", "tools:2", {"call_id": "call_1", "name": "get_weather", "result": "Sunny in Oslo"}),
        ("thinking", "agent:3", {"content": "Easy."}),
        ("text", "agent:3", {"content": "Sunny, go out."}),
    ]
    assert blocks(state) == [
        (event, block) for block in ("agent:1", "tools:2", "agent:3") for event in ("block_start", "block_end")
    ]
    assert state["status"] == "completed"
    assert stream_end(state)["usage"] == {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}


def test_tools_the_graph_runs_in_threads_each_answer_their_own_call(server: Server) -> None:
    both = AIMessage(
        content="",
        tool_calls=[
            {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_oslo"},
            {"name": "get_weather", "args": {"city": "Bergen"}, "id": "call_bergen"},
        ],
    )
    graph = tool_loop(both, AIMessage(content="Both sunny."))
    with Client(server.base_url) as client, client.stream(model="graph") as run:
        handler = AgentmuxCallbackHandler(run)
        graph.invoke({"messages": [("user", "Oslo and Bergen?")]}, config={"callbacks": [handler]})
    state = snapshot(server.base_url, run.stream_id)

    calls = [(props["id"], props["arguments"]) for kind, _, props in published(state) if kind == "tool_call"]
    assert calls == [("call_oslo", '{"city": "Oslo"}'), ("call_bergen", '{"city": "Bergen"}')]
    results = {p["call_id"]: (block, p["result"]) for kind, block, p in published(state) if kind == "tool_result"}
    assert results == {"call_oslo": ("tools:2", "Sunny in Oslo"), "call_bergen": ("tools:2", "Sunny in Bergen")}
    assert state["status"] == "completed"


def test_a_failing_tool_is_an_error_result_and_the_failed_run_ends_the_stream_error(server: Server) -> None:
    graph = tool_loop(calling("Atlantis"))
    with Client(server.base_url) as client:
        with pytest.raises(ValueError, match="no weather under the sea"):
            with client.stream(model="graph") as run:
                handler = AgentmuxCallbackHandler(run)
                graph.invoke({"messages": [("user", "Atlantis?")]}, config={"callbacks": [handler]})
    state = snapshot(server.base_url, run.stream_id)

    failure = {"message": "no weather under the sea", "code": "ValueError"}
    result = [props for kind, _, props in published(state) if kind == "tool_result"]
    assert result == [{"call_id": "call_1", "name": "get_weather", "error": failure}]
    assert state["status"] == "error"
    assert stream_end(state)["error"] == failure


def test_a_chat_model_invoked_alone_streams_its_tokens_and_ends_the_stream(server: Server) -> None:
    model = ScriptedChatModel(messages=iter([AIMessage(content="one two three")]))
    with Client(server.base_url) as client, client.stream() as run:
        answer = model.invoke("count", config={"callbacks": [AgentmuxCallbackHandler(run)]})
        assert run._ended, "the model call was the top-level run: its end ended the stream"
    state = snapshot(server.base_url, run.stream_id)

    assert answer.content == "one two three"
    assert published(state) == [("text", None, {"content": "one two three"})]
    text = next(m for m in state["messages"] if m["type"] == "text")
    start = next(m for m in state["messages"] if m["props"].get("event") == "message_start")
    assert start["props"]["data"]["message_id"] == text["message_id"], "the text was sent in deltas"
    assert stream_end(state)["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_a_model_that_answers_whole_is_published_whole(server: Server) -> None:
    model = ScriptedChatModel(messages=iter([calling("Bergen")]), disable_streaming=True)
    with Client(server.base_url) as client, client.stream() as run:
        model.invoke("Bergen?", config={"callbacks": [AgentmuxCallbackHandler(run)]})
    state = snapshot(server.base_url, run.stream_id)

    call = {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Bergen"}', "server_side": True}
    assert published(state) == [("text", None, {"content": "Checking."}), ("tool_call", None, call)]


async def test_the_async_handler_keeps_nodes_that_run_at_once_in_their_own_blocks(server: Server) -> None:
    async def north(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await get_weather.ainvoke({"city": "Tromsø"})]}

    async def south(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await get_weather.ainvoke({"city": "Kristiansand"})]}

    graph = StateGraph(MessagesState)
    graph.add_node("north", north)
    graph.add_node("south", south)
    graph.add_edge(START, "north")
    graph.add_edge(START, "south")
    async with AsyncClient(server.base_url) as client, client.stream() as run:
        handler = AsyncAgentmuxCallbackHandler(run)
        await graph.compile().ainvoke({"messages": [("user", "both")]}, config={"callbacks": [handler]})
    state = snapshot(server.base_url, run.stream_id)

    results = {props["result"]: block for kind, block, props in published(state) if kind == "tool_result"}
    assert results == {"Sunny in Tromsø": "north:1", "Sunny in Kristiansand": "south:1"}
    calls = {props["arguments"]: block for kind, block, props in published(state) if kind == "tool_call"}
    assert calls == {'{"city": "Tromsø"}': "north:1", '{"city": "Kristiansand"}': "south:1"}
    assert state["status"] == "completed"


def test_the_blocking_handler_refuses_an_async_producer_it_could_not_end() -> None:
    class Ends:
        async def end(self, **outcome: Any) -> None: ...

    with pytest.raises(TypeError, match="AsyncAgentmuxCallbackHandler"):
        AgentmuxCallbackHandler(Ends())  # type: ignore[arg-type]
