"""The official `anthropic` Python package against agentmux's `POST /v1/messages`.

Usage: anthropic_client.py BASE_URL. Runs each case and prints one JSON line per case: the final message
(`messages.stream(...).get_final_message()` when streaming, `messages.create` otherwise) or the error raised.
"""

import json
import sys

import anthropic

BASE = sys.argv[1]
CLIENT = anthropic.Anthropic(base_url=BASE, api_key="not-checked-on-loopback", max_retries=0)
ASK = [{"role": "user", "content": "hello from python"}]

CASES = [
    ("text", "echo", True),
    ("text_whole", "echo", False),
    ("thinking", "replay/thinking-then-text", True),
    ("tools", "replay/two-tool-calls-interleaved", True),
    ("usage", "replay/usage", True),
    ("error", "replay/error-mid-stream", True),
    ("error_whole", "replay/error-mid-stream", False),
]

for name, model, streaming in CASES:
    result = {"case": name}
    try:
        if streaming:
            with CLIENT.messages.stream(model=model, max_tokens=256, messages=ASK) as stream:
                events = [event.type for event in stream]
                message = stream.get_final_message()
            result["events"] = events
        else:
            message = CLIENT.messages.create(model=model, max_tokens=256, messages=ASK)
        result["message"] = message.model_dump(mode="json")
    except anthropic.APIError as error:
        result["error"] = {"kind": type(error).__name__, "message": str(error), "status": getattr(error, "status_code", None)}
    print(json.dumps(result), flush=True)
