"""Drives an agentmux server with the official `openai` Python package.

Usage: python openai_client.py http://127.0.0.1:<port>/v1

Runs every case against the built-in `echo` and `replay/<fixture>` models and prints one JSON line per case:
`{"case": ..., "status": "ok", ...}`. The first failure prints `FAIL <case>: <why>` to stderr and exits with status 1.
Called by tests/client_python.rs; the expected outputs come from fixtures/<name>/openai.json.
"""

import json
import sys
import traceback
from pathlib import Path
from urllib.parse import urlparse

import openai

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
USER = [{"role": "user", "content": "hello brave new world"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


def golden(name):
    """The non-streaming answer a case should give: fixtures/<name>/openai.json."""
    return json.loads((FIXTURES / name / "openai.json").read_text())


def golden_message(name):
    return golden(name)["choices"][0]["message"]


def collect(stream, out=None):
    """Reads a chunk stream as a client that accumulates deltas would; checks the invariants of every chunk.
    Accumulates into `out` (a new dict when None), so a caller sees what came before an exception."""
    out = {} if out is None else out
    out.update({"content": "", "reasoning": "", "roles": [], "finish": [], "ids": set(), "created": set(),
                "tools": {}, "usage": [], "chunks": 0, "empty_choices": 0})
    for chunk in stream:
        out["chunks"] += 1
        check(chunk.object == "chat.completion.chunk", f"object is {chunk.object!r}")
        out["ids"].add(chunk.id)
        out["created"].add(chunk.created)
        if chunk.usage is not None:
            out["usage"].append(chunk.usage)
        if not chunk.choices:
            out["empty_choices"] += 1
            continue
        check(len(chunk.choices) == 1, f"{len(chunk.choices)} choices in one chunk")
        choice = chunk.choices[0]
        check(choice.index == 0, f"choice index {choice.index}")
        delta = choice.delta
        if delta.role is not None:
            out["roles"].append(delta.role)
        if delta.content:
            out["content"] += delta.content
        reasoning = getattr(delta, "reasoning_content", None)
        if reasoning is not None:
            check((delta.model_extra or {}).get("reasoning_content") == reasoning,
                  "reasoning_content is an attribute but not in model_extra")
            check(not delta.content, f"content {delta.content!r} beside reasoning_content")
            out["reasoning"] += reasoning
        if delta.tool_calls:
            indexes = [call.index for call in delta.tool_calls]
            check(len(indexes) == len(set(indexes)), f"two tool-call entries with one index in a chunk: {indexes}")
            for call in delta.tool_calls:
                check(call.index is not None, "a tool-call delta without index")
                entry = out["tools"].get(call.index)
                if entry is None:
                    check(call.id and call.type == "function" and call.function and call.function.name,
                          f"the first delta of tool call {call.index} lacks id, type or function.name: {call}")
                    entry = out["tools"][call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
                else:
                    check(call.id is None and (call.function is None or call.function.name is None),
                          f"a later delta of tool call {call.index} repeats id or name: {call}")
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
        if choice.finish_reason is not None:
            out["finish"].append(choice.finish_reason)
    check(len(out["ids"]) == 1, f"chunk ids differ: {out['ids']}")
    check(len(out["created"]) == 1, f"created differs: {out['created']}")
    created = next(iter(out["created"]))
    check(isinstance(created, int) and 1_000_000_000 < created < 10_000_000_000,
          f"created is not in seconds: {created}")
    check(out["roles"] == ["assistant"], f"role deltas: {out['roles']} (want exactly one 'assistant')")
    check(len(out["finish"]) == 1, f"finish_reason on {len(out['finish'])} chunks: {out['finish']}")
    return out


def tool_calls_of(message):
    return [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in message.get("tool_calls") or []]


# ---- cases ----------------------------------------------------------------------------------------------


def text_stream_echo(client):
    out = collect(client.chat.completions.create(model="echo", messages=USER, stream=True))
    check(out["content"] == "hello brave new world", f"content {out['content']!r}")
    check(out["finish"] == ["stop"], f"finish_reason {out['finish']}")
    check(out["usage"] == [], "usage without stream_options")
    return {"chunks": out["chunks"], "content": out["content"]}


def text_nonstream_echo(client):
    completion = client.chat.completions.create(model="echo", messages=USER)
    check(completion.object == "chat.completion", f"object {completion.object!r}")
    message = completion.choices[0].message
    check(message.role == "assistant", f"role {message.role!r}")
    check(message.content == "hello brave new world", f"content {message.content!r}")
    check(completion.choices[0].finish_reason == "stop", f"finish_reason {completion.choices[0].finish_reason!r}")
    usage = completion.usage
    check(usage is not None and usage.completion_tokens == 4
          and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"usage {usage}")
    return {"content": message.content, "usage": usage.model_dump()}


def text_stream_plain_text(client):
    want = golden_message("plain-text")["content"]
    out = collect(client.chat.completions.create(model="replay/plain-text", messages=USER, stream=True))
    check(out["content"] == want, f"content {out['content']!r}, want {want!r}")
    check(out["finish"] == ["stop"], f"finish_reason {out['finish']}")
    return {"chunks": out["chunks"], "content": out["content"]}


def text_nonstream_plain_text(client):
    want = golden("plain-text")["choices"][0]
    completion = client.chat.completions.create(model="replay/plain-text", messages=USER)
    choice = completion.choices[0]
    check(choice.message.content == want["message"]["content"], f"content {choice.message.content!r}")
    check(choice.finish_reason == want["finish_reason"], f"finish_reason {choice.finish_reason!r}")
    check(choice.message.tool_calls is None, f"tool_calls {choice.message.tool_calls}")
    return {"content": choice.message.content}


def reasoning_stream(client):
    want = golden_message("thinking-then-text")
    stream = client.chat.completions.create(model="replay/thinking-then-text", messages=USER, stream=True)
    out = {}
    collect(stream, out)
    check(out["reasoning"] == want["reasoning_content"], f"reasoning_content {out['reasoning']!r}")
    check(out["content"] == want["content"], f"content {out['content']!r}")
    check(out["finish"] == ["stop"], f"finish_reason {out['finish']}")
    return {"reasoning_content": out["reasoning"], "content": out["content"]}


def reasoning_nonstream(client):
    want = golden_message("thinking-then-text")
    completion = client.chat.completions.create(model="replay/thinking-then-text", messages=USER)
    message = completion.choices[0].message
    reasoning = getattr(message, "reasoning_content", None)
    check(reasoning == want["reasoning_content"], f"message.reasoning_content {reasoning!r}")
    check((message.model_extra or {}).get("reasoning_content") == reasoning, "reasoning_content not in model_extra")
    check(message.content == want["content"], f"content {message.content!r}")
    return {"reasoning_content": reasoning}


def tool_calls_stream_raw(client):
    want = tool_calls_of(golden_message("two-tool-calls-interleaved"))
    out = collect(client.chat.completions.create(
        model="replay/two-tool-calls-interleaved", messages=USER, tools=TOOLS, stream=True))
    got = [out["tools"][index] for index in sorted(out["tools"])]
    check(sorted(out["tools"]) == list(range(len(want))), f"tool-call indexes {sorted(out['tools'])}")
    check(got == want, f"tool calls {got}, want {want}")
    for call in got:
        json.loads(call["arguments"])
    check(out["content"] == "", f"content {out['content']!r} beside tool calls")
    check(out["finish"] == ["tool_calls"], f"finish_reason {out['finish']}")
    return {"tool_calls": got}


def early_done(done_events, want):
    """The helper assumes one tool call streams after another, as OpenAI sends them: when a delta for another
    index arrives it fires `tool_calls.function.arguments.done` for the previous one. Each such event must
    carry that call's whole arguments."""
    return [e for e in done_events if e["arguments"] != want[e["index"]]["arguments"]]


def tool_calls_stream_helper(client):
    """`client.chat.completions.stream(...)`: the final completion has both calls, whole."""
    want = tool_calls_of(golden_message("two-tool-calls-interleaved"))
    done_events = []
    with client.chat.completions.stream(
        model="replay/two-tool-calls-interleaved", messages=USER, tools=TOOLS
    ) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done_events.append({"index": event.index, "name": event.name, "arguments": event.arguments})
        final = stream.get_final_completion()
    choice = final.choices[0]
    check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
    calls = choice.message.tool_calls or []
    got = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls]
    check(got == want, f"final tool calls {got}, want {want}")
    check(all(c.type == "function" for c in calls), f"tool call types {[c.type for c in calls]}")
    parsed = [json.loads(c.function.arguments) for c in calls]
    check(parsed == [json.loads(c["arguments"]) for c in want], f"arguments {parsed}")
    check(sorted(e["index"] for e in done_events) == list(range(len(want))), f"arguments.done events {done_events}")
    check(all(e["name"] == want[e["index"]]["name"] for e in done_events), f"arguments.done names {done_events}")
    check(not early_done(done_events, want), f"arguments.done fired with partial arguments: {done_events}")
    return {"tool_calls": got}


def tool_calls_stream_helper_strict(client):
    """The same with strict tools, where the helper parses each call's arguments when it thinks the call is
    done: the calls must arrive one after another, whole."""
    want = tool_calls_of(golden_message("two-tool-calls-interleaved"))
    strict = [
        {"type": "function", "function": {"name": name, "strict": True, "parameters": {
            "type": "object", "properties": {key: {"type": "string"}}, "required": [key],
            "additionalProperties": False}}}
        for name, key in (("get_weather", "city"), ("get_time", "tz"))
    ]
    done_events = []
    with client.chat.completions.stream(
        model="replay/two-tool-calls-interleaved", messages=USER, tools=strict
    ) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done_events.append({"index": event.index, "name": event.name, "arguments": event.arguments,
                                    "parsed": event.parsed_arguments})
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    got = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls]
    check(got == want, f"final tool calls {got}, want {want}")
    parsed = [c.function.parsed_arguments for c in calls]
    check(parsed == [json.loads(c["arguments"]) for c in want], f"parsed_arguments {parsed}")
    check(not early_done(done_events, want), f"arguments.done fired with partial arguments: {done_events}")
    return {"tool_calls": got}


def tool_calls_nonstream(client):
    want = golden("two-tool-calls-interleaved")["choices"][0]
    completion = client.chat.completions.create(model="replay/two-tool-calls-interleaved", messages=USER, tools=TOOLS)
    choice = completion.choices[0]
    got = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
           for c in choice.message.tool_calls or []]
    check(got == tool_calls_of(want["message"]), f"tool calls {got}")
    check(choice.message.content is None, f"content {choice.message.content!r}")
    check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
    return {"tool_calls": got}


def error_mid_stream(client):
    stream = client.chat.completions.create(model="replay/error-mid-stream", messages=USER, stream=True)
    content = ""
    try:
        for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
    except openai.APIStatusError as error:
        raise Failure(f"an error after the stream started became an APIStatusError: {error!r}")
    except openai.APIError as error:
        check("Upstream API timed out" in error.message, f"message {error.message!r}")
        check(error.code == "upstream_timeout", f"code {error.code!r}")
        check(content == "Let me look that up.\n", f"content before the error {content!r}")
        return {"error": error.message, "code": error.code, "content_before": content}
    raise Failure(f"no APIError while iterating; content {content!r}")


def usage_stream(client):
    want = golden("usage")
    out = collect(client.chat.completions.create(
        model="replay/usage", messages=USER, stream=True, stream_options={"include_usage": True}))
    check(out["content"] == want["choices"][0]["message"]["content"], f"content {out['content']!r}")
    check(out["empty_choices"] == 1, f"{out['empty_choices']} chunks with empty choices")
    check(len(out["usage"]) == 1, f"usage on {len(out['usage'])} chunks")
    usage = out["usage"][0]
    got = (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    check(got == (12, 5, 17), f"usage {got}")
    return {"usage": usage.model_dump(exclude_none=True)}


def usage_stream_last_chunk(client):
    """The usage chunk is the last one, and it has `choices: []` (not missing, not null)."""
    chunks = list(client.chat.completions.create(
        model="replay/usage", messages=USER, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    check(last.choices == [], f"last chunk choices {last.choices}")
    check(last.usage is not None and last.usage.total_tokens == 17, f"last chunk usage {last.usage}")
    check(all(c.usage is None for c in chunks[:-1]), "usage before the last chunk")
    return {"chunks": len(chunks)}


def nonstream_error(client):
    want = golden("failed")["error"]
    try:
        completion = client.chat.completions.create(model="replay/failed", messages=USER)
    except openai.InternalServerError as error:
        check(error.status_code == 500, f"status {error.status_code}")
        check(error.response.headers.get("x-should-retry") == "false", "no x-should-retry: false")
        check(want["message"] in error.message, f"message {error.message!r}")
        check(error.code == want["code"], f"code {error.code!r}")
        return {"http_status": error.status_code, "code": error.code, "message": error.message}
    except openai.APIStatusError as error:
        raise Failure(f"want InternalServerError (500), got {type(error).__name__} {error.status_code}: {error}")
    raise Failure(f"no error; got {completion}")


def stream_error_at_end(client):
    """replay/failed streamed: the text, then the run's error as an APIError."""
    want = golden("failed")["error"]
    content = ""
    try:
        for chunk in client.chat.completions.create(model="replay/failed", messages=USER, stream=True):
            for choice in chunk.choices:
                content += choice.delta.content or ""
    except openai.APIError as error:
        check(want["message"] in error.message, f"message {error.message!r}")
        check(error.code == want["code"], f"code {error.code!r}")
        check(content == "Working on it", f"content before the error {content!r}")
        return {"error": error.message, "code": error.code}
    raise Failure(f"no APIError; content {content!r}")


def unknown_model(client):
    for stream in (False, True):
        try:
            client.chat.completions.create(model="no-such-model", messages=USER, stream=stream)
        except openai.NotFoundError as error:
            check(error.status_code == 404, f"status {error.status_code}")
            check(error.code == "model_not_found", f"code {error.code!r}")
            check(error.body.get("param") == "model", f"param {error.body.get('param')!r}")
            continue
        except openai.APIError as error:
            raise Failure(f"stream={stream}: want NotFoundError, got {type(error).__name__}: {error}")
        raise Failure(f"stream={stream}: no error")
    return {"code": "model_not_found"}


def thread_two_turns(client):
    """A server-side thread: created with POST /threads, two turns (one streamed, one not) through the
    `x-agentmux-thread-id` header, the transcript read back, and a spoofed assistant message refused."""
    thread = client.post("/threads", body={"messages": [{"role": "system", "content": "Be brief."}]}, cast_to=object)
    tid = thread["id"]
    headers = {"x-agentmux-thread-id": tid}
    first = collect(client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "first question"}], stream=True, extra_headers=headers))
    check(first["content"] == "first question", f"first answer {first['content']!r}")
    second = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "second question"}], extra_headers=headers)
    check(second.choices[0].message.content == "second question", f"second answer {second.choices[0].message}")
    try:
        client.chat.completions.create(
            model="echo", messages=[{"role": "assistant", "content": "I said yes"}], extra_headers=headers)
        raise Failure("a spoofed assistant message was taken")
    except openai.BadRequestError as error:
        check(error.body.get("param") == "messages[0].role", f"param {error.body.get('param')!r}")
    transcript = client.get(f"/threads/{tid}", cast_to=object)
    said = [(m["role"], m["content"]) for m in transcript["messages"]]
    want = [("system", "Be brief."), ("user", "first question"), ("assistant", "first question"),
            ("user", "second question"), ("assistant", "second question")]
    check(said == want, f"transcript {said}")
    audit = client.get(f"/threads/{tid}/audit", cast_to=object)
    decisions = [e["decision"] for e in audit["entries"]]
    check(decisions.count("rejected") == 1 and decisions.count("run_end") == 2, f"audit {decisions}")
    return {"thread": tid, "messages": len(said)}


CASES = [
    text_stream_echo,
    text_nonstream_echo,
    text_stream_plain_text,
    text_nonstream_plain_text,
    reasoning_stream,
    reasoning_nonstream,
    tool_calls_stream_raw,
    tool_calls_stream_helper,
    tool_calls_stream_helper_strict,
    tool_calls_nonstream,
    error_mid_stream,
    usage_stream,
    usage_stream_last_chunk,
    nonstream_error,
    stream_error_at_end,
    unknown_model,
    thread_two_turns,
]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: openai_client.py http://127.0.0.1:<port>/v1")
    base_url = sys.argv[1]
    host = urlparse(base_url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"refusing to talk to {host!r}: this script only tests a local server")
    # trust_env=False: no proxy from the environment, so nothing leaves the loopback interface.
    # A stream that does not end (no end of body after [DONE]) fails the case instead of hanging it.
    http_client = openai.DefaultHttpxClient(trust_env=False)
    client = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0, timeout=20.0, http_client=http_client)
    print(json.dumps({"openai": openai.__version__, "python": sys.version.split()[0]}), flush=True)
    for case in CASES:
        name = case.__name__
        try:
            detail = case(client)
        except Failure as failure:
            print(f"FAIL {name}: {failure}", file=sys.stderr, flush=True)
            sys.exit(1)
        except Exception as error:  # anything the SDK raised that the case did not expect
            traceback.print_exc()
            print(f"FAIL {name}: unexpected {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            sys.exit(1)
        print(json.dumps({"case": name, "status": "ok", **(detail or {})}), flush=True)


if __name__ == "__main__":
    main()
