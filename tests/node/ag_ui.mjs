// Runs AG-UI event streams through the official `@ag-ui/client`: `HttpAgent.runAgent` posts the input, parses
// the SSE response, checks every event against `@ag-ui/core`'s schemas (stripping unknown fields and dropping
// unknown events with a console warning) and against its verifier (order, everything closed before the run
// finishes, nothing after it), and applies the events to the agent's messages.
//
// Usage: node ag_ui.mjs CONFIG.json, CONFIG = {"runs": [{"name", "file"} | {"name", "url", "model"}]}: a file
// is served in place of the response (a golden file); a url is posted to with the model in
// `forwardedProps`. Prints one JSON array: for each run, the event types, the agent's messages, the run error,
// the failure if the client rejected the stream, and every console warning or error the client printed.

import { readFileSync } from 'node:fs';
import { HttpAgent } from '@ag-ui/client';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const results = [];
const printed = [];
console.warn = (...args) => printed.push(args.map(String).join(' '));
console.error = (...args) => printed.push(args.map(String).join(' '));

for (const run of config.runs) {
  printed.length = 0;
  const result = { name: run.name, events: [] };
  const fixture = run.file
    ? async () => new Response(readFileSync(run.file), { headers: { 'content-type': 'text/event-stream' } })
    : undefined;
  const agent = new HttpAgent({
    url: run.url ?? 'http://127.0.0.1:9/not-used',
    threadId: `thread-${run.name}`,
    initialMessages: [{ id: 'u1', role: 'user', content: 'hello from a frontend' }],
    ...(fixture ? { fetch: fixture } : {}),
  });
  try {
    await agent.runAgent(
      { runId: `run-${run.name}`, forwardedProps: run.model ? { model: run.model } : {} },
      {
        onEvent: ({ event }) => {
          result.events.push(event.type);
        },
        onRunErrorEvent: ({ event }) => {
          result.runError = { message: event.message, code: event.code ?? null };
        },
        onRunFinishedEvent: ({ event }) => {
          result.outcome = event.outcome ?? null;
        },
        onRunFailed: ({ error }) => {
          result.failed = String(error?.message ?? error);
        },
      },
    );
  } catch (error) {
    result.failed = String(error?.message ?? error);
  }
  result.messages = agent.messages;
  result.printed = [...printed];
  results.push(result);
}
process.stdout.write(JSON.stringify(results));
