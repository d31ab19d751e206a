// What the watching scripts (`watch_all.mjs`, `watch_bridge.mjs`) share: each library's `fetch` pointed at the
// stream's events in the library's format, and the AI SDK's reading of the UI message stream, so the two read a
// stream the same way. Not a script of its own: the runner (`tests/common/node.rs`) copies every file of
// `tests/node/` next to the packages, so scripts import it as `./watching.mjs`.

import { readFileSync } from 'node:fs';
import { DefaultChatTransport, readUIMessageStream } from 'ai';

// The config a watching script got as its argument: `{"events": URL of /v1/streams/{id}/events}`.
export const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));

// The stream's events in `format`.
export const events = (format) => `${config.events}?format=${format}`;

// A `fetch` for a library that posts to its own endpoint: it reads the stream's events in `format` instead.
export const reading = (format) => async () => fetch(events(format));

// The last UI message the `ai` package assembled from the stream's `ui-message` events, read as `useChat`
// reads a resumed stream (`DefaultChatTransport.reconnectToStream`, then `readUIMessageStream`).
export async function lastUiMessage() {
  const transport = new DefaultChatTransport({
    api: 'http://127.0.0.1:9/not-used',
    prepareReconnectToStreamRequest: () => ({ api: events('ui-message') }),
  });
  let message;
  const chunks = await transport.reconnectToStream({ chatId: 'watch' });
  for await (const m of readUIMessageStream({ stream: chunks, terminateOnError: true })) message = m;
  return message;
}

// Runs every watcher at once; prints one JSON object with each one's result (or the error it threw).
export async function report(watchers) {
  const results = {};
  await Promise.all(
    Object.entries(watchers).map(async ([format, watch]) => {
      try {
        results[format] = await watch();
      } catch (error) {
        results[format] = { error: String(error?.stack ?? error) };
      }
    }),
  );
  process.stdout.write(JSON.stringify([results]));
}
