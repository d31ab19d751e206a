// The client against a real agentmux: a watcher whose connection is cut mid-stream resumes exactly once (no
// message twice, none missing); a read token reads and cannot write; a cancel and an end are seen; an abort
// stops the connection; a chat run is started and watched to its end.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { AgentmuxError, createClient } from '../dist/index.js';
import { startServer } from './server.mjs';

let server;
before(async () => {
  server = await startServer();
});
after(async () => server?.stop());

const text = (content, id = 'm') => ({ type: 'text', props: { content }, message_id: id, delta: true });

test('a watcher cut mid-stream resumes exactly once', async () => {
  // A fetch whose first event stream breaks after a few hundred bytes, as a dropped connection does.
  let cut = false;
  const cutting = async (url, init) => {
    const response = await fetch(url, init);
    if (cut || !String(url).endsWith('/events')) return response;
    cut = true;
    let sent = 0;
    const body = response.body.pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          sent += chunk.length;
          if (sent > 400) controller.error(new Error('connection reset'));
          else controller.enqueue(chunk);
        },
      }),
    );
    return new Response(body, { status: response.status, headers: response.headers });
  };
  const client = createClient({ baseUrl: server.baseUrl, fetch: cutting });
  const stream = await client.createStream();
  const words = Array.from({ length: 40 }, (_, i) => `word${i} `);
  await client.append(stream.id, words.map((w) => text(w)), { writeToken: stream.write_token });
  await client.end(stream.id, undefined, { writeToken: stream.write_token });
  const sequences = [];
  let state;
  for await (const update of client.watch(stream.id, { token: stream.read_token })) {
    sequences.push(update.message.metadata.sequence);
    state = update.state;
  }
  assert.ok(cut, 'the connection was cut');
  const expected = Array.from({ length: sequences.at(-1) }, (_, i) => i + 1);
  assert.deepEqual(sequences, expected, 'every sequence once, in order');
  const reduced = state.messages.find((m) => m.message_id === 'm');
  assert.equal(reduced.props.content, words.join(''));
  assert.equal(state.status, 'completed');
});

test('with keys: a read token reads, and a write through it is refused', async () => {
  const keyed = await startServer(['--api-key', 'sk-typescript-test']);
  try {
    const owner = createClient({ baseUrl: keyed.baseUrl, apiKey: 'sk-typescript-test' });
    const stream = await owner.createStream();
    await owner.append(stream.id, [text('hi')], { writeToken: stream.write_token });
    // A watcher with nothing but the read token.
    const reader = createClient({ baseUrl: keyed.baseUrl });
    const seen = await reader.snapshot(stream.id, { token: stream.read_token });
    assert.equal(seen.messages.at(-1).props.content, 'hi');
    await assert.rejects(reader.append(stream.id, [text('no')], { writeToken: stream.read_token }), (error) => {
      assert.ok(error instanceof AgentmuxError);
      assert.equal(error.status, 403);
      return true;
    });
    await assert.rejects(reader.createStream(), (error) => error instanceof AgentmuxError && error.status === 401);
    await owner.end(stream.id, undefined, { writeToken: stream.write_token });
    let state;
    for await (const update of reader.watch(stream.id, { token: stream.read_token })) state = update.state;
    assert.equal(state.status, 'completed');
  } finally {
    await keyed.stop();
  }
});

test('a cancel and an end are seen', async () => {
  const client = createClient({ baseUrl: server.baseUrl });
  for (const ending of ['cancel', 'end']) {
    const stream = await client.createStream();
    await client.append(stream.id, [text('before ')], { writeToken: stream.write_token });
    const watching = (async () => {
      let last;
      for await (const update of client.watch(stream.id, { token: stream.read_token })) last = update.state;
      return last;
    })();
    await new Promise((resolve) => setTimeout(resolve, 50));
    if (ending === 'cancel') await client.cancel(stream.id, { writeToken: stream.write_token });
    else await client.end(stream.id, { status: 'error', error: { message: 'it broke', code: 'broken' } }, { writeToken: stream.write_token });
    const state = await watching;
    assert.equal(state.status, ending === 'cancel' ? 'cancelled' : 'error');
  }
});

test('an abort stops the connection', async () => {
  const client = createClient({ baseUrl: server.baseUrl });
  const stream = await client.createStream();
  const controller = new AbortController();
  const seen = [];
  const watching = (async () => {
    for await (const update of client.watch(stream.id, { token: stream.read_token, signal: controller.signal })) {
      seen.push(update.message.type);
      controller.abort();
    }
  })();
  await assert.rejects(watching, (error) => error.name === 'AbortError');
  assert.deepEqual(seen, ['event'], 'stream_start, then nothing');
});

test('a chat run started and watched to its end', async () => {
  const client = createClient({ baseUrl: server.baseUrl });
  const run = await client.chat({ model: 'echo', messages: [{ role: 'user', content: 'hello there' }] });
  let state;
  for await (const update of run.updates) state = update.state;
  assert.equal(state.status, 'completed');
  const answer = state.messages.filter((m) => m.type === 'text').map((m) => m.props.content).join('');
  assert.equal(answer, 'hello there');
  assert.equal(state.id, run.streamId);
});
