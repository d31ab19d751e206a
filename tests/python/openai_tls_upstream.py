"""The official `openai` client through agentmux to an upstream reached over HTTPS: run by tests/upstream_tls.rs.

Usage: openai_tls_upstream.py http://127.0.0.1:<port>/v1 <model>. agentmux's upstream is a TLS server whose
certificate a test CA signed (`--upstream-ca-file`); the client itself talks plain HTTP to agentmux on
loopback. Cases, one JSON line each: `stream` (a streamed answer's text and finish reason), `tool_call` (the
model's call to a tool the client declared, streamed and assembled), `models` (the catalogue lists the
upstream's model). Exits non-zero on the first failure.
"""

import json
import sys
from urllib.parse import urlparse

import openai

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: openai_tls_upstream.py http://127.0.0.1:<port>/v1 <model>")
    base_url, model = sys.argv[1], sys.argv[2]
    if urlparse(base_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("this script only tests a local server")
    http_client = openai.DefaultHttpxClient(trust_env=False)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=20.0, http_client=http_client)

    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.total_tokens
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    print(json.dumps({"case": "stream", "text": text, "finish_reason": finish, "usage": usage}), flush=True)

    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, stream=True
    )
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["name"] = call.function.name or entry["name"]
                    entry["arguments"] += call.function.arguments or ""
    listed = [calls[i] for i in sorted(calls)]
    print(json.dumps({"case": "tool_call", "calls": listed, "finish_reason": finish}), flush=True)

    models = [m.id for m in client.models.list()]
    print(json.dumps({"case": "models", "models": models}), flush=True)


if __name__ == "__main__":
    main()
