"""The OpenAI Agents SDK (its real package) published through `agentmux.bridges.openai_agents`.

Usage: bridge_openai_agents.py BASE_URL. Two agents whose models are agentmux's own built-in ones, reached over
its `/v1/chat/completions` with `OpenAIChatCompletionsModel`: "Triage" (`replay/client-tool-call-then-text`:
some text and a call of `get_weather`, which here is its handoff to "Weather") and "Weather"
(`replay/tool-call-fragments`: a call of the function tool `get_weather` with streamed arguments, whose output
ends the run). The script creates the stream the run is published to, prints `{"stream": id}`, waits for a
line on stdin (the watchers are connected then), runs the agents through `publish_run`, and prints
`{"final_output": ...}`.
"""

import asyncio
import json
import sys

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, handoff
from agents import set_tracing_disabled
from openai import AsyncOpenAI

from agentmux import AsyncClient
from agentmux.bridges.openai_agents import publish_run

BASE = sys.argv[1]


@function_tool
def get_weather(location: str, unit: str = "celsius") -> str:
    """The weather in a place."""
    return f"Sunny in {location}, 21 °C" if unit == "celsius" else f"Sunny in {location}, 70 °F"


async def main() -> None:
    set_tracing_disabled(True)
    chat = AsyncOpenAI(base_url=f"{BASE}/v1", api_key="not-checked-on-loopback", max_retries=0)
    settings = ModelSettings(include_usage=True)
    weather = Agent(
        name="Weather",
        instructions="Answer with the weather.",
        model=OpenAIChatCompletionsModel(model="replay/tool-call-fragments", openai_client=chat),
        model_settings=settings,
        tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
    )
    triage = Agent(
        name="Triage",
        instructions="Hand weather questions over.",
        model=OpenAIChatCompletionsModel(model="replay/client-tool-call-then-text", openai_client=chat),
        model_settings=settings,
        handoffs=[handoff(weather, tool_name_override="get_weather")],
    )
    async with AsyncClient(BASE) as client:
        async with client.stream(model="weather-agents") as run:
            print(json.dumps({"stream": run.stream_id}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            result = Runner.run_streamed(triage, "What is the weather in Paris?")
            await publish_run(result, run)
    print(json.dumps({"final_output": result.final_output}), flush=True)


asyncio.run(main())
