"""A LangGraph graph published through `agentmux.bridges.langchain`'s callback handler.

Usage: bridge_langgraph.py BASE_URL. The graph is LangGraph's usual tool loop: an "agent" node calling a chat
model, a `ToolNode` "tools" running `get_weather`, and `tools_condition` between them. The chat model is
`langchain_core`'s `GenericFakeChatModel` given a `bind_tools` and a `_stream` that streams what a real
provider does (reasoning, text tokens, tool-call chunks, usage): `ScriptedChatModel`, shared with the
package's bridge tests (`clients/python/tests/bridges/scripted.py`). It calls `get_weather`, then answers.
The script creates the stream, prints `{"stream": id}`, waits for a line on stdin (the watchers are connected
then), runs the graph with `ainvoke` and `AsyncAgentmuxCallbackHandler`, and prints `{"answer": ...}`.
"""

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentmux import AsyncClient
from agentmux.bridges.langchain import AsyncAgentmuxCallbackHandler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "tests" / "bridges"))
from scripted import ScriptedChatModel  # noqa: E402

BASE = sys.argv[1]


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}, 21 °C"


def build_graph() -> Any:
    model = ScriptedChatModel(
        messages=iter(
            [
                AIMessage(
                    content="Let me check the weather.",
                    tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_oslo"}],
                ),
                AIMessage(
                    content="It is sunny in Oslo.",
                    additional_kwargs={"reasoning_content": "The tool says sunny."},
                ),
            ]
        )
    ).bind_tools([get_weather])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


async def main() -> None:
    graph = build_graph()
    async with AsyncClient(BASE) as client:
        async with client.stream(model="weather-graph") as run:
            print(json.dumps({"stream": run.stream_id}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            handler = AsyncAgentmuxCallbackHandler(run)
            state = await graph.ainvoke({"messages": [("user", "Weather in Oslo?")]}, config={"callbacks": [handler]})
    print(json.dumps({"answer": state["messages"][-1].content}), flush=True)


asyncio.run(main())
