// Reads UI message streams with the official `ai` package, the way `useChat` does: `DefaultChatTransport`
// fetches the stream and checks every chunk against the package's own schema, and `readUIMessageStream`
// builds the assistant message from the chunks, failing on any out of order.
//
// Usage: node ui_message.mjs CONFIG.json, where CONFIG is
//   {"packages": ["ai5", "ai"], "sources": [{"name": ..., "file": PATH} | {"name": ..., "url": URL}]}
// Each package name is an installed alias of one major version of `ai`. Prints one JSON array: for every
// package and source, the chunk types read, the last message built, or the error that ended the read.
// Run from the directory whose node_modules holds the packages (the test copies it there).

import { readFileSync } from 'node:fs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const results = [];

async function chunkTypes(stream) {
  const types = [];
  const reader = stream.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      types.push(value.type);
    }
  } catch (error) {
    types.push(`!${error?.message ?? error}`);
  }
  return types;
}

for (const name of config.packages) {
  const ai = await import(name);
  const version = JSON.parse(readFileSync(`node_modules/${name}/package.json`, 'utf8')).version;
  for (const source of config.sources) {
    const result = { package: name, version, source: source.name };
    try {
      const fixture = source.file
        ? async () => new Response(readFileSync(source.file), { headers: { 'content-type': 'text/event-stream' } })
        : undefined;
      const transport = new ai.DefaultChatTransport({
        api: 'http://127.0.0.1:9/not-used',
        fetch: fixture,
        prepareReconnectToStreamRequest: () => ({ api: source.url ?? 'http://127.0.0.1:9/fixture' }),
      });
      const chunks = await transport.reconnectToStream({ chatId: source.name });
      if (chunks === null) throw new Error('204: nothing to resume');
      const [forMessage, forTypes] = chunks.tee();
      const types = chunkTypes(forTypes);
      try {
        for await (const message of ai.readUIMessageStream({ stream: forMessage, terminateOnError: true })) {
          result.message = message;
        }
      } finally {
        result.chunks = await types;
      }
    } catch (error) {
      result.error = String(error?.message ?? error);
    }
    results.push(result);
  }
}
process.stdout.write(JSON.stringify(results));
