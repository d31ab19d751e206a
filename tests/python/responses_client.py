"""The official `openai` Python package's Responses API against agentmux's `POST /v1/responses`.

Usage: responses_client.py BASE_URL (ending in /v1). Runs each case and prints one JSON line per case: the final
response (`responses.stream(...).get_final_response()` when streaming, `responses.create` otherwise) with the
event types seen, or the error raised.
"""

import json
import sys

import openai

CLIENT = openai.OpenAI(base_url=sys.argv[1], api_key="not-checked-on-loopback", max_retries=0)

CASES = [
    ("text", "echo", True),
    ("text_whole", "echo", False),
    ("reasoning", "replay/thinking-then-text", True),
    ("function_calls", "replay/two-tool-calls-interleaved", True),
    ("failure", "replay/error-mid-stream", True),
]

for name, model, streaming in CASES:
    result = {"case": name}
    try:
        if streaming:
            with CLIENT.responses.stream(model=model, input="hello from python") as stream:
                result["events"] = [event.type for event in stream]
                response = stream.get_final_response()
        else:
            response = CLIENT.responses.create(model=model, input="hello from python")
        result["response"] = response.model_dump(mode="json")
        result["output_text"] = response.output_text
    except openai.APIError as error:
        result["error"] = {"kind": type(error).__name__, "message": str(error)}
    print(json.dumps(result), flush=True)
