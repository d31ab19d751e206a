// Reads Anthropic Messages streams with the official `@anthropic-ai/sdk`: `messages.stream(...)` parses the
// events (it skips frames without an `event:` line and raises on `event: error`) and `finalMessage()` builds
// the message from them (it needs `message_stop`); `messages.create` reads a non-streaming answer.
//
// Usage: node anthropic.mjs CONFIG.json, CONFIG = {"base": URL, "runs": [{"name", "model", "stream",
// "headers"?} | {"name", "file"}]}: a file is served in place of the response (a golden file). Prints one
// JSON array: for each run, the event types, the final message, or the error raised (its message, HTTP
// status, the error type and message the SDK read from the body, and the run's names from its headers).

import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const results = [];

for (const run of config.runs) {
  const result = { name: run.name, events: [] };
  const fixture = run.file
    ? async () => new Response(readFileSync(run.file), { headers: { 'content-type': 'text/event-stream' } })
    : undefined;
  const client = new Anthropic({
    baseURL: config.base ?? 'http://127.0.0.1:9',
    apiKey: 'not-checked-on-loopback',
    maxRetries: 0,
    ...(fixture ? { fetch: fixture } : {}),
  });
  const request = {
    model: run.model ?? 'replay',
    max_tokens: 256,
    messages: [{ role: 'user', content: 'hello from a client' }],
  };
  try {
    if (run.stream === false) {
      result.message = await client.messages.create(request, { headers: run.headers ?? {} });
    } else {
      const stream = client.messages.stream(request, { headers: run.headers ?? {} });
      stream.on('streamEvent', (event) => result.events.push(event.type));
      result.message = await stream.finalMessage();
    }
  } catch (error) {
    result.error = {
      message: String(error?.message ?? error),
      status: error?.status ?? null,
      type: error?.type ?? null,
      apiMessage: error?.apiMessage ?? null,
      streamId: error?.headers?.get?.('x-agentmux-stream-id') ?? null,
      readToken: error?.headers?.get?.('x-agentmux-read-token') ?? null,
    };
  }
  results.push(result);
}
process.stdout.write(JSON.stringify(results));
