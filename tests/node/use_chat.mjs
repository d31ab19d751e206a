// Drives agentmux's `/v1/ui/chat` endpoints with the official `ai` package as a `useChat` page does: a
// headless `Chat` (the package's `AbstractChat` over a plain in-memory state, which is all `useChat` adds)
// with the default transport, picking the agent through the transport's `body` option.
//
// Usage: node use_chat.mjs CONFIG.json, CONFIG = {"packages": [...], "base": "http://127.0.0.1:PORT"}.
// Prints one JSON array of cases: for each package and case, the chat's messages and status at the end, its
// error, the chunk types its `onData` saw, and every request the transport made (method, path, status,
// the stream id header).

import { readFileSync } from 'node:fs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const results = [];

/** The state `useChat` keeps in React, kept in plain fields. */
class PlainState {
  constructor() {
    this.status = 'ready';
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

function chat(ai, { id, model, requests, data, options = {} }) {
  const state = new PlainState();
  const logged = async (url, init) => {
    const response = await fetch(url, init);
    requests.push({
      method: init?.method ?? 'GET',
      path: new URL(String(url)).pathname,
      status: response.status,
      stream: response.headers.get('x-agentmux-stream-id'),
    });
    return response;
  };
  // `model` may be a function: the transport resolves its body before each request.
  const body = typeof model === 'function' ? () => ({ model: model() }) : { model };
  const transport = new ai.DefaultChatTransport({ api: `${config.base}/v1/ui/chat`, body, fetch: logged });
  const Chat = class extends ai.AbstractChat {};
  const instance = new Chat({ id, transport, state, onData: (part) => data.push(part.type), ...options });
  return { instance, state };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(condition, what) {
  for (let waited = 0; !condition(); waited += 10) {
    if (waited > 10000) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** The server-side thread the chat's id names, as `GET /v1/threads/{id}` shows it, and its audit's decisions. */
async function thread(id) {
  const transcript = await (await fetch(`${config.base}/v1/threads/${id}`)).json();
  const audit = await (await fetch(`${config.base}/v1/threads/${id}/audit`)).json();
  return { transcript, decisions: audit.entries.map((entry) => entry.decision) };
}

function outcome(state, extra) {
  return { status: state.status, error: state.error?.message ?? null, messages: state.messages, ...extra };
}

for (const name of config.packages) {
  const ai = await import(name);
  const run = async (caseName, body) => {
    const requests = [];
    const data = [];
    try {
      results.push({ package: name, case: caseName, ...(await body(requests, data)), requests, data });
    } catch (error) {
      results.push({ package: name, case: caseName, thrown: String(error?.stack ?? error), requests, data });
    }
  };
  // One turn with each agent: the chat's state once `sendMessage` settles.
  for (const [caseName, model] of [
    ['text', 'echo'],
    ['reasoning', 'replay/thinking-then-text'],
    ['tool', 'replay/tool-call-then-text'],
    ['error', 'replay/error-mid-stream'],
  ]) {
    await run(caseName, async (requests, data) => {
      const { instance, state } = chat(ai, { id: `${name}-${caseName}`, model, requests, data });
      await instance.sendMessage({ text: 'hello from a page' });
      return outcome(state);
    });
  }
  // Two turns, then a regenerate of the last answer: the chat's thread holds each message once, and goes
  // back for the regenerate.
  await run('turns', async (requests, data) => {
    const id = `${name}-turns`;
    const { instance, state } = chat(ai, { id, model: 'echo', requests, data });
    await instance.sendMessage({ text: 'first' });
    await instance.sendMessage({ text: 'second' });
    const before = await thread(id);
    await instance.regenerate();
    return outcome(state, { before, after: await thread(id) });
  });
  // A tool the page runs: the run ends on a call nobody on the server runs; the page's `onToolCall` answers
  // it, and the chat sends the result by itself (`sendAutomaticallyWhen`) for the next run, on another agent.
  await run('page-tool', async (requests, data) => {
    const id = `${name}-page-tool`;
    let model = 'replay/tool-call-fragments';
    const calls = [];
    const options = {
      sendAutomaticallyWhen: ai.lastAssistantMessageIsCompleteWithToolCalls,
      onToolCall: ({ toolCall }) => {
        calls.push({ name: toolCall.toolName, id: toolCall.toolCallId, input: toolCall.input });
        model = 'echo';
        const output = { tool: toolCall.toolName, toolCallId: toolCall.toolCallId, output: { temp_c: 18 } };
        // Not awaited, as the package asks of an `onToolCall`.
        (instance.addToolOutput ?? instance.addToolResult).call(instance, output);
      },
    };
    const { instance, state } = chat(ai, { id, model: () => model, requests, data, options });
    await instance.sendMessage({ text: 'weather in Paris?' });
    await until(() => requests.length === 2 && state.status === 'ready', 'the result to go back and be answered');
    return outcome(state, { calls, thread: await thread(id) });
  });
  // A cancel: the page asks agentmux to cancel the run it watches (the id from the response header).
  await run('cancel', async (requests, data) => {
    const { instance, state } = chat(ai, { id: `${name}-cancel`, model: 'demo', requests, data });
    const sent = instance.sendMessage({ text: 'show me everything' });
    await until(() => state.status === 'streaming' && requests[0]?.stream, 'the demo to stream');
    const cancel = await fetch(`${config.base}/v1/streams/${requests[0].stream}/cancel`, { method: 'POST' });
    await sent;
    return outcome(state, { cancelStatus: cancel.status });
  });
  // Resume with nothing running: 204, and the chat stays as it was.
  await run('resume-idle', async (requests, data) => {
    const { instance, state } = chat(ai, { id: `${name}-idle`, model: 'echo', requests, data });
    await instance.resumeStream();
    return outcome(state);
  });
  // Resume mid-answer: a second page of the same chat (a reload) picks up the running turn from its start.
  await run('resume-running', async (requests, data) => {
    const first = chat(ai, { id: `${name}-reload`, model: 'demo', requests, data });
    const sent = first.instance.sendMessage({ text: 'show me everything' });
    await until(() => first.state.messages.length === 2, 'the first page to get the answer started');
    // The reload comes a moment into the answer: the scenario, not synchronisation.
    await sleep(300);
    const second = chat(ai, { id: `${name}-reload`, model: 'demo', requests, data: [] });
    await second.instance.resumeStream();
    await sent;
    return { ...outcome(second.state), first: outcome(first.state) };
  });
}
process.stdout.write(JSON.stringify(results));
