// The client's behaviour against a real agentmux, written once and run in Node (client.test.mjs) and in
// headless Chromium (browser.test.mjs). Each scenario takes the environment (environment.mjs: the servers'
// addresses) and `lib`, the client module under test (the package's build in Node, the module the service
// serves at /ui/assets/client.js in the browser). Only what both platforms have is used here.

/** Throws `message` (and what was found) unless `ok`. */
function check(ok, message, found) {
  if (!ok) throw new Error(found === undefined ? message : `${message}: ${JSON.stringify(found)}`);
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (content, id = 'm') => ({ type: 'text', props: { content }, message_id: id, delta: true });

/** A `fetch` that counts the event streams it opens. */
function counting() {
  const counter = { events: 0 };
  counter.fetch = (url, init) => {
    if (new URL(String(url)).pathname.endsWith('/events')) counter.events += 1;
    return fetch(url, init);
  };
  return counter;
}

/** The value of the subscribers gauge for CUI over SSE on the service at `baseUrl`. */
async function subscribers(baseUrl) {
  const metrics = await (await fetch(`${baseUrl}/metrics`)).text();
  const line = metrics.split('\n').find((l) => l.startsWith('agentmux_subscribers{') && l.includes('format="cui"') && l.includes('transport="sse"'));
  return line ? Number(line.split(' ').at(-1)) : 0;
}

async function watchAll(updates) {
  const sequences = [];
  let state;
  for await (const update of updates) {
    sequences.push(update.message.metadata.sequence);
    state = update.state;
  }
  return { sequences, state };
}

/**
 * Scenarios Node runs but Chromium does not, and why. A page cannot fall behind a stream the way a Node
 * reader does: Chromium's network service reads a response ahead of the page into its own buffers (and the
 * kernel's receive window grows with it), past the 64 MiB a stream holds at most, so a page that stops
 * reading still receives the whole stream before its retention passes.
 */
export const nodeOnly = new Set(['a watcher left behind past the retention gets a LaggedError']);

export const scenarios = {
  // The connection drops in the middle of the tenth event (a real TCP close, by the proxy): the watcher
  // reconnects with Last-Event-ID and every sequence arrives exactly once, in order.
  async 'a watcher cut mid-stream resumes exactly once'({ lib, plain, cut }) {
    const producer = lib.createClient({ baseUrl: plain });
    const stream = await producer.createStream();
    const words = Array.from({ length: 40 }, (_, i) => `word${i} `);
    await producer.append(stream.id, words.map((w) => text(w)), { writeToken: stream.write_token });
    await producer.end(stream.id, undefined, { writeToken: stream.write_token });
    const connections = counting();
    const watcher = lib.createClient({ baseUrl: cut, fetch: connections.fetch });
    const { sequences, state } = await watchAll(watcher.watch(stream.id, { token: stream.read_token }));
    check(connections.events === 2, 'one event stream cut, one resumed', connections.events);
    const expected = Array.from({ length: sequences.at(-1) }, (_, i) => i + 1);
    check(sequences.length === 44 && same(sequences, expected), 'every sequence once, in order', sequences);
    const reduced = state.messages.find((m) => m.message_id === 'm');
    check(reduced.props.content === words.join(''), 'the text whole', reduced.props.content);
    check(state.status === 'completed', 'completed', state.status);
  },

  // A watcher asked to start after a sequence gets what follows it, and nothing before.
  async 'a watcher from a sequence gets what follows it'({ lib, plain }) {
    const client = lib.createClient({ baseUrl: plain });
    const stream = await client.createStream();
    await client.append(stream.id, ['a ', 'b ', 'c '].map((w) => text(w)), { writeToken: stream.write_token });
    await client.end(stream.id, undefined, { writeToken: stream.write_token });
    const { sequences } = await watchAll(client.watch(stream.id, { token: stream.read_token, from: 3 }));
    check(same(sequences, [4, 5, 6, 7]), 'sequences 4 to the end', sequences);
  },

  // With keys: the owner writes with the key; a watcher with nothing but a read token reads, and cannot write.
  async 'a read token reads, and a write through it is refused'({ lib, keyed }) {
    const owner = lib.createClient({ baseUrl: keyed.baseUrl, apiKey: keyed.key });
    const stream = await owner.createStream();
    await owner.append(stream.id, [text('hi')], { writeToken: stream.write_token });
    const reader = lib.createClient({ baseUrl: keyed.baseUrl });
    const seen = await reader.snapshot(stream.id, { token: stream.read_token });
    check(seen.messages.at(-1).props.content === 'hi', 'the snapshot through the read token', seen);
    let refused;
    await reader.append(stream.id, [text('no')], { writeToken: stream.read_token }).catch((e) => (refused = e));
    check(refused instanceof lib.AgentmuxError && refused.status === 403, 'a write with a read token: 403', String(refused));
    let anonymous;
    await reader.createStream().catch((e) => (anonymous = e));
    check(anonymous instanceof lib.AgentmuxError && anonymous.status === 401, 'no key: 401', String(anonymous));
    await owner.end(stream.id, undefined, { writeToken: stream.write_token });
    const { state } = await watchAll(reader.watch(stream.id, { token: stream.read_token }));
    const said = state.messages.filter((m) => m.type === 'text').map((m) => m.props.content);
    check(state.status === 'completed' && same(said, ['hi']), 'watched to its end', state);
  },

  // A watcher of an open stream sees a cancel, and an end with an error, as the stream's outcome.
  async 'a cancel and an end are seen'({ lib, plain }) {
    const client = lib.createClient({ baseUrl: plain });
    for (const ending of ['cancel', 'end']) {
      const stream = await client.createStream();
      await client.append(stream.id, [text('before ')], { writeToken: stream.write_token });
      const updates = client.watch(stream.id, { token: stream.read_token });
      const seen = [];
      for (;;) {
        const { value } = await updates.next();
        seen.push(value.message.type);
        if (value.message.type === 'text') break;
      }
      if (ending === 'cancel') await client.cancel(stream.id, { writeToken: stream.write_token });
      else {
        const outcome = { status: 'error', error: { message: 'it broke', code: 'broken' } };
        await client.end(stream.id, outcome, { writeToken: stream.write_token });
      }
      const { state } = await watchAll(updates);
      check(state.status === (ending === 'cancel' ? 'cancelled' : 'error'), `${ending}: the outcome`, state.status);
      const end = state.messages.find((m) => m.type === 'event' && m.props.event === 'stream_end');
      if (ending === 'end') check(end?.props.data?.error?.code === 'broken', 'the error in stream_end', end);
    }
  },

  // Aborting the signal ends the watch with an AbortError and closes the connection: the service counts one
  // subscriber fewer.
  async 'an abort stops the connection'({ lib, plain }) {
    const client = lib.createClient({ baseUrl: plain });
    const stream = await client.createStream();
    const before = await subscribers(plain);
    const controller = new AbortController();
    const seen = [];
    let during;
    let error;
    try {
      for await (const update of client.watch(stream.id, { token: stream.read_token, signal: controller.signal })) {
        seen.push(update.message.type);
        during = await subscribers(plain);
        controller.abort();
      }
    } catch (e) {
      error = e;
    }
    check(error?.name === 'AbortError', 'an AbortError', String(error));
    check(same(seen, ['event']), 'stream_start, then nothing', seen);
    check(during === before + 1, 'one more subscriber while watching', { before, during });
    let after = during;
    for (let i = 0; i < 100 && after !== before; i++) {
      await sleep(50);
      after = await subscribers(plain);
    }
    check(after === before, 'the connection closed', { before, during, after });
    await client.end(stream.id, undefined, { writeToken: stream.write_token });
  },

  // chat() starts a run on the chat endpoint and watches its stream to the end.
  async 'a chat run started and watched to its end'({ lib, plain }) {
    const client = lib.createClient({ baseUrl: plain });
    const run = await client.chat({ model: 'echo', messages: [{ role: 'user', content: 'hello there' }] });
    const { state } = await watchAll(run.updates);
    check(state.status === 'completed', 'completed', state.status);
    const answer = state.messages.filter((m) => m.type === 'text').map((m) => m.props.content).join('');
    check(answer === 'hello there', 'the echo', answer);
    check(state.id === run.streamId, 'the run named its stream', { id: state.id, streamId: run.streamId });
  },

  // A watcher that stops reading far behind while its stream is evicted (its retention passed) gets the
  // service's lagged notice once it reads on: a LaggedError, never a silent gap.
  async 'a watcher left behind past the retention gets a LaggedError'({ lib, retention }) {
    const client = lib.createClient({ baseUrl: retention.baseUrl });
    const stream = await client.createStream();
    // 35 MB: more than the sockets and the client's buffers hold for a reader that does not read.
    const big = 'x'.repeat(1_000_000);
    for (let post = 0; post < 5; post++) {
      const messages = Array.from({ length: 7 }, (_, i) => ({ type: 'text', props: { content: big }, message_id: `big${post}-${i}` }));
      await client.append(stream.id, messages, { writeToken: stream.write_token });
    }
    await client.end(stream.id, undefined, { writeToken: stream.write_token });
    const updates = client.watch(stream.id, { token: stream.read_token });
    const first = await updates.next();
    check(first.value.message.props.event === 'stream_start', 'stream_start first', first.value.message);
    await sleep(retention.ms + 2000);
    let read = 1;
    let error;
    try {
      for await (const update of updates) read += 1;
    } catch (e) {
      error = e;
    }
    check(error instanceof lib.LaggedError, 'a LaggedError', { error: String(error), read });
    check(Number.isInteger(error.resumeFrom), 'where the kept history starts', error.resumeFrom);
    // stream_start, 35 whole texts, stream_end: 37 in all.
    check(read < 37, 'not every message was read', read);
  },

  // The service keeps a stream's epoch across restarts; a history replaced under the same id (a store
  // restored from an older copy, a stream made again elsewhere) has another one. Here the answer to the
  // resume is made to name another epoch (`x-agentmux-epoch`): the watcher stops with an EpochChangedError
  // rather than mix two histories.
  async 'a changed epoch at a resume is an EpochChangedError'({ lib, plain }) {
    const producer = lib.createClient({ baseUrl: plain });
    const stream = await producer.createStream();
    await producer.append(stream.id, [text('one '), text('two ')], { writeToken: stream.write_token });
    let cut = false;
    const replaced = async (url, init) => {
      const response = await fetch(url, init);
      const path = new URL(String(url)).pathname;
      if (path.endsWith('/events') && !cut) {
        // The first event stream drops after its first bytes.
        cut = true;
        const reader = response.body.getReader();
        const body = new ReadableStream({
          async pull(controller) {
            const { value, done } = await reader.read();
            if (done) return controller.close();
            controller.enqueue(value);
            controller.error(new TypeError('network error'));
            reader.cancel().catch(() => {});
          },
        });
        return new Response(body, { status: response.status, headers: response.headers });
      }
      if (path.endsWith('/events')) {
        const headers = new Headers(response.headers);
        headers.set('x-agentmux-epoch', 'another-history');
        return new Response(response.body, { status: response.status, headers });
      }
      return response;
    };
    const watcher = lib.createClient({ baseUrl: plain, fetch: replaced });
    // The stream ends soon, so a watcher that does not check the epoch ends too (rather than wait forever).
    const ending = new Promise((resolve) => setTimeout(resolve, 2000)).then(() =>
      producer.end(stream.id, undefined, { writeToken: stream.write_token }),
    );
    let error;
    try {
      for await (const update of watcher.watch(stream.id, { token: stream.read_token })) void update;
    } catch (e) {
      error = e;
    }
    await ending;
    check(error instanceof lib.EpochChangedError, 'an EpochChangedError', String(error));
    check(error.was === stream.epoch && error.now === 'another-history', 'both epochs named', { was: error.was, now: error.now });
  },

  // The first answer to an append is cut after the append landed (a real TCP close, by the proxy): the
  // client sends it again with the same Idempotency-Key, and the service answers the first answer without
  // appending it twice.
  async 'an append whose answer was lost is retried and lands once'({ lib, plain, lostAnswer }) {
    const producer = lib.createClient({ baseUrl: plain });
    const stream = await producer.createStream();
    const flaky = lib.createClient({ baseUrl: lostAnswer });
    const batch = [text('once ', 'r1'), text('only ', 'r2')];
    const appended = await flaky.append(stream.id, batch, { writeToken: stream.write_token });
    check(appended.replayed === true, 'the retry was answered as a repeat', appended);
    const seen = await producer.snapshot(stream.id, { token: stream.read_token });
    const texts = seen.messages.filter((m) => m.type === 'text').map((m) => m.props.content);
    check(same(texts, ['once ', 'only ']), 'each message once', texts);
    check(appended.lastSequence === seen.last_sequence, 'the last sequence', { appended, last: seen.last_sequence });
    check(appended.sequences.length === 2 && appended.sequences.at(-1) <= seen.last_sequence, 'its sequences', appended);
    await producer.end(stream.id, undefined, { writeToken: stream.write_token });
  },

  // `after` chains appends; one that does not follow the last is refused naming it, and a repeat with the
  // same key answers the first answer.
  async 'after chains appends and a conflict names the last sequence'({ lib, plain }) {
    const client = lib.createClient({ baseUrl: plain });
    const stream = await client.createStream();
    const write = { writeToken: stream.write_token };
    const first = await client.append(stream.id, [text('a ')], { ...write, after: 1, idempotencyKey: 'k-1' });
    check(first.replayed === false && first.lastSequence === 3, 'message_start and the delta', first);
    const second = await client.append(stream.id, [text('b ')], { ...write, after: first.lastSequence });
    check(second.lastSequence === 4, 'the next follows', second);
    let refused;
    await client.append(stream.id, [text('c ')], { ...write, after: first.lastSequence }).catch((e) => (refused = e));
    check(refused instanceof lib.AgentmuxError && refused.status === 409, 'a conflict: 409', String(refused));
    check(refused.code === 'sequence_conflict' && refused.param === 'after' && refused.lastSequence === 4, 'named', refused);
    const again = await client.append(stream.id, [text('a ')], { ...write, after: 1, idempotencyKey: 'k-1' });
    check(again.replayed === true && same(again.sequences, first.sequences) && again.lastSequence === 3, 'the first answer', again);
    await client.end(stream.id, undefined, write);
  },

  // A tool call streamed in deltas is ended with endMessage (its message_end reaches the watcher before the
  // stream ends) and its block with endBlock; an end of what is no longer open ends nothing.
  async 'endMessage and endBlock close what a producer streamed'({ lib, plain }) {
    const client = lib.createClient({ baseUrl: plain });
    const stream = await client.createStream();
    const write = { writeToken: stream.write_token };
    const call = (props) => ({ type: 'tool_call', message_id: 'tc', delta: true, block_id: 'b', props });
    await client.append(stream.id, [call({ id: 'c1', name: 'lookup', arguments: '{"q":' }), call({ arguments: ' 1}' })], write);
    const updates = client.watch(stream.id, { token: stream.read_token });
    const ended = await client.endMessage(stream.id, 'tc', write);
    check(ended.sequences.length === 1 && ended.lastSequence === ended.sequences[0], 'its message_end', ended);
    for (;;) {
      const { value } = await updates.next();
      if (value.message.metadata.sequence !== ended.sequences[0]) continue;
      check(value.message.props.event === 'message_end' && value.state.status === 'open', 'seen while open', value.message);
      break;
    }
    const again = await client.endMessage(stream.id, 'tc', write);
    check(same(again.sequences, []) && again.lastSequence === ended.lastSequence, 'a second end ends nothing', again);
    const block = await client.endBlock(stream.id, 'b', write);
    check(block.sequences.length === 1 && block.lastSequence === ended.lastSequence + 1, 'its block_end', block);
    await client.end(stream.id, undefined, write);
    const { state } = await watchAll(updates);
    check(state.status === 'completed', 'completed', state.status);
  },
};
