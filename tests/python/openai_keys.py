"""The official `openai` client against an agentmux with API keys: run by tests/client_python.rs.

Usage: openai_keys.py http://127.0.0.1:<port>/v1 <key>. With the key a chat streams and lists models; with a
wrong key, and with none, the client raises AuthenticationError (HTTP 401) before any chunk. Prints one JSON
line per case; exits non-zero on the first failure.
"""

import json
import sys
from urllib.parse import urlparse

import openai
from openai._types import Omit


def client(base_url, api_key):
    http_client = openai.DefaultHttpxClient(trust_env=False)
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20.0, http_client=http_client)


def chat(c, headers=None):
    stream = c.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "keyed hello"}], stream=True, extra_headers=headers
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def refused(c, headers=None):
    try:
        chat(c, headers)
    except openai.AuthenticationError as error:
        return {"status_code": error.status_code, "code": error.code}
    raise SystemExit("FAIL: the chat was not refused")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: openai_keys.py http://127.0.0.1:<port>/v1 <key>")
    base_url, key = sys.argv[1], sys.argv[2]
    if urlparse(base_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("this script only tests a local server")
    good = client(base_url, key)
    text = chat(good)
    if "keyed hello" not in text:
        sys.exit(f"FAIL: the echo came back as {text!r}")
    models = [m.id for m in good.models.list()]
    print(json.dumps({"case": "with_key", "text": text, "models": models}), flush=True)
    print(json.dumps({"case": "wrong_key", **refused(client(base_url, "sk-not-this-one"))}), flush=True)
    # The client insists on a key of its own; `Omit` takes the header out, so the request carries none.
    no_key = refused(client(base_url, "unused"), headers={"Authorization": Omit()})
    print(json.dumps({"case": "no_key", **no_key}), flush=True)


if __name__ == "__main__":
    main()
