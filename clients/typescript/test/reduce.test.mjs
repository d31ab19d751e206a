// Every fixture case, posted to a real agentmux and watched with the client: the state `reduce` builds from
// what the stream sent serialises to exactly the JSON of the service's snapshot.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import { after, before, test } from 'node:test';

import { createClient, DeltaError, initialState, reduce } from '../dist/index.js';
import { repository, startServer } from './server.mjs';

let server;
before(async () => {
  server = await startServer();
});
after(async () => server?.stop());

const fixtures = `${repository}fixtures`;
const cases = readdirSync(fixtures).filter((name) => existsSync(`${fixtures}/${name}/input.jsonl`));

test('there are fixture cases', () => assert.ok(cases.length >= 15, `${cases.length}`));

for (const name of cases) {
  test(`${name}: reduced as the service reduces it`, async () => {
    const client = createClient({ baseUrl: server.baseUrl });
    const stream = await client.createStream({ model: 'fixture' });
    const input = readFileSync(`${fixtures}/${name}/input.jsonl`, 'utf8');
    const messages = input.split('\n').filter((line) => line.trim()).map((line) => JSON.parse(line));
    await client.append(stream.id, messages, { writeToken: stream.write_token });
    const outcome = existsSync(`${fixtures}/${name}/outcome.json`)
      ? JSON.parse(readFileSync(`${fixtures}/${name}/outcome.json`, 'utf8'))
      : undefined;
    await client.end(stream.id, outcome, { writeToken: stream.write_token });
    let state;
    for await (const update of client.watch(stream.id, { token: stream.read_token })) state = update.state;
    const snapshot = await client.snapshot(stream.id, { token: stream.read_token });
    assert.equal(JSON.stringify(state), JSON.stringify(snapshot));
  });
}

test('a delta of another type without type_change is refused, and changes nothing', () => {
  const state = initialState();
  reduce(state, { type: 'text', props: { content: 'a' }, message_id: 'm' });
  assert.throws(() => reduce(state, { type: 'loading', props: { message: 'x' }, message_id: 'm', delta: true }), DeltaError);
  assert.throws(() => reduce(state, { type: 'text', props: { content: 1 }, message_id: 'm', delta: true }), DeltaError);
  assert.deepEqual(state.messages, [{ type: 'text', props: { content: 'a' }, message_id: 'm' }]);
});

test('set creates the way; merge, replace and append on arrays', () => {
  const state = initialState();
  reduce(state, { type: 'card', props: { list: [1] }, message_id: 'c' });
  reduce(state, { type: 'card', props: { a: { b: 2 } }, message_id: 'c', delta: true, delta_path: 'a.b', delta_action: 'set' });
  reduce(state, { type: 'card', props: { list: [2, 3] }, message_id: 'c', delta: true, delta_path: 'list' });
  reduce(state, { type: 'card', props: { x: 1 }, message_id: 'c', delta: true, delta_path: '' });
  reduce(state, { type: 'card', props: { list: { 0: 9 } }, message_id: 'c', delta: true, delta_path: 'list.0', delta_action: 'replace' });
  assert.deepEqual(state.messages[0].props, { list: [9, 2, 3], a: { b: 2 }, x: 1 });
});
