"""The whole path against a real model server: agentmux in front of an OpenAI-compatible upstream (a local
llama.cpp `llama-server`, for instance), driven by the official `openai` Python client.

Usage:
    target/py-venv/bin/python tests/python/real_upstream.py --upstream-url http://127.0.0.1:18090/v1 \
        [--model NAME] [--agentmux target/release/agentmux]

It starts agentmux on a free loopback port with `--upstream-url`, then:
1. streams a real answer through agentmux (the client sees text deltas; time to first token printed);
2. asks for a real tool call with a tool the client declares (`get_weather`): the model's call reaches the
   client as `tool_calls` with `finish_reason: "tool_calls"`, as OpenAI sends it;
3. answers that call with a tool message into the same server-side thread, and streams the model's final
   answer;
4. reads the thread's audit log back.
Every step prints one JSON line; a failure exits with status 1. Not part of `cargo test` (it needs a model
server); `tests/upstream.rs` covers the same path against recorded answers.
"""

import argparse
import json
import subprocess
import sys
import threading
import time

import openai


def start_agentmux(binary, upstream_url):
    process = subprocess.Popen(
        [binary, "--addr", "127.0.0.1:0", "--upstream-url", upstream_url, "--upstream-first-byte-timeout", "120s",
         "--upstream-idle-timeout", "120s"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    found = {}
    ready = threading.Event()

    def read():
        for line in process.stderr:
            if "agentmux listening" in line and "address=" in line:
                found["address"] = line.split("address=")[1].split()[0]
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(30) or "address" not in found:
        process.kill()
        sys.exit("agentmux did not start")
    return process, found["address"]


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream-url", required=True)
    parser.add_argument("--model", default=None, help="default: the first model the upstream lists")
    parser.add_argument("--agentmux", default="target/release/agentmux")
    args = parser.parse_args()
    process, address = start_agentmux(args.agentmux, args.upstream_url)
    try:
        client = openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0, timeout=300.0,
                               http_client=openai.DefaultHttpxClient(trust_env=False))
        models = [m.id for m in client.models.list().data]
        model = args.model or next(m for m in models if m not in ("demo", "echo") and not m.startswith("replay/"))
        say("models", upstream_models=[m for m in models if m not in ("demo", "echo") and not m.startswith("replay/")],
            model=model)

        # 1. A real answer, streamed.
        started = time.monotonic()
        first = None
        text = ""
        stream = client.chat.completions.create(
            model=model, stream=True, max_tokens=60, temperature=0,
            messages=[{"role": "user", "content": "In one sentence: why is the sky blue?"}])
        finish = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                text += chunk.choices[0].delta.content
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        if not text.strip():
            sys.exit("FAIL: no text streamed")
        say("answer", text=text, finish_reason=finish, ttft_ms=round(((first or started) - started) * 1000),
            total_ms=round((time.monotonic() - started) * 1000))

        # 2. A real tool call, handed to the client.
        thread = f"real-upstream-{int(time.time())}"
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        calls = {}
        finish = None
        stream = client.chat.completions.create(
            model=model, stream=True, temperature=0, max_tokens=120, tools=tools,
            extra_headers={"x-agentmux-thread-id": thread},
            messages=[{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}])
        for chunk in stream:
            if not chunk.choices:
                continue
            for call in chunk.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or call.id
                if call.function and call.function.name:
                    entry["name"] = call.function.name
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
            finish = chunk.choices[0].finish_reason or finish
        if finish != "tool_calls" or not calls:
            sys.exit(f"FAIL: no tool call (finish_reason {finish!r}, calls {calls})")
        call = calls[min(calls)]
        say("tool_call", id=call["id"], name=call["name"], arguments=json.loads(call["arguments"]),
            finish_reason=finish)

        # 3. The result, into the same thread; the model answers from it.
        stream = client.chat.completions.create(
            model=model, stream=True, temperature=0, max_tokens=80, tools=tools, tool_choice="none",
            extra_headers={"x-agentmux-thread-id": thread},
            messages=[{"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 18, "sky": "sunny"})}])
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        if not text.strip():
            sys.exit("FAIL: no answer from the tool's result")
        say("answer_from_tool", text=text)

        # 4. The audit log of the thread.
        audit = client.get(f"/threads/{thread}/audit", cast_to=object)
        say("audit", decisions=[e["decision"] for e in audit["entries"]])
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    main()
