// Reads OpenAI Responses streams with the official `openai` Node package: `responses.stream(...)` parses the
// events (it throws on an event type it does not know, and checks each delta's `item_id` against its item)
// and `finalResponse()` needs `response.completed`.
//
// Usage: node responses.mjs CONFIG.json, CONFIG = {"base": URL ending in /v1, "runs": [{"name", "model"} |
// {"name", "file"}]}: a file is served in place of the response (a golden file). Prints one JSON array: for
// each run, the event types, the final response and its text, or the error thrown.

import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const results = [];

for (const run of config.runs) {
  const result = { name: run.name, events: [] };
  const fixture = run.file
    ? async () => new Response(readFileSync(run.file), { headers: { 'content-type': 'text/event-stream' } })
    : undefined;
  const client = new OpenAI({
    baseURL: config.base ?? 'http://127.0.0.1:9/v1',
    apiKey: 'not-checked-on-loopback',
    maxRetries: 0,
    ...(fixture ? { fetch: fixture } : {}),
  });
  try {
    const stream = client.responses.stream({ model: run.model ?? 'replay', input: 'hello from node' });
    for await (const event of stream) result.events.push(event.type);
    const response = await stream.finalResponse();
    result.response = response;
    result.outputText = response.output_text;
  } catch (error) {
    result.error = String(error?.message ?? error);
  }
  results.push(result);
}
process.stdout.write(JSON.stringify(results));
