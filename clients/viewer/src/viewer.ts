// The viewer agentmux serves: `/ui` lists the streams, `/ui/streams/{id}` shows one run live (the
// conversation, a timeline of events and actions, the outcome) beside the same run's frames in any other
// format. Where the service has keys the page asks for one and keeps it in this tab's session storage, never
// in a URL; a read token comes as `?token=`. Watching resumes after a dropped connection (the client's
// `watch`), so nothing shows twice.

import { AgentmuxError, createClient, type OutputMessage, type StreamState } from '../../typescript/src/index.js';
import { render, result, timeline } from './render.js';
import { el, json } from './safe.js';

const KEY = 'agentmux-key';
const app = document.getElementById('app') as HTMLElement;
const base = window.location.origin;

function key(): string | undefined {
  return sessionStorage.getItem(KEY) ?? undefined;
}

/** Asks for a key, then starts `then` again with it. */
function askForKey(then: () => void, why: string): void {
  app.replaceChildren();
  const form = el('form', 'key-form');
  const input = el('input');
  input.type = 'password';
  input.placeholder = 'API key';
  input.autocomplete = 'off';
  input.name = 'key';
  form.append(el('p', undefined, why), input, Object.assign(el('button', undefined, 'Use this key'), { type: 'submit' }));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    then();
  });
  app.append(form);
}

function failed(error: unknown, retry: () => void): void {
  const status = app.querySelector('header .status');
  if (status) status.textContent = 'failed';
  const token = new URLSearchParams(window.location.search).get('token');
  if (error instanceof AgentmuxError && (error.status === 401 || error.status === 403)) {
    if (token) {
      // The token in the address is what was refused: a key typed here would not be used while it is there.
      const note = el('p', 'failure', `This read token does not open the stream (${error.message}). `);
      const without = el('a', undefined, 'Open it with an API key instead');
      without.href = window.location.pathname;
      note.append(without);
      app.append(note);
      return;
    }
    if (error.status === 403) {
      askForKey(retry, 'That key may not read this.');
    } else if (key()) {
      // The key kept in the session was refused: forget it, and say so, so a wrong key is told from the first ask.
      sessionStorage.removeItem(KEY);
      askForKey(retry, 'That key was not accepted. This service needs an API key.');
    } else {
      askForKey(retry, 'This service needs an API key.');
    }
    return;
  }
  app.append(el('p', 'failure', `Could not read it: ${error instanceof Error ? error.message : String(error)}`));
}

async function list(after?: string): Promise<void> {
  const query = new URLSearchParams({ limit: '50' });
  if (after) query.set('after', after);
  const headers: Record<string, string> = {};
  const apiKey = key();
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  const response = await fetch(`${base}/v1/streams?${query}`, { headers });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new AgentmuxError(response.status, body?.error?.code ?? null, body?.error?.message ?? response.statusText);
  }
  const page = (await response.json()) as {
    data: { id: string; status: string; model: string; created_ms: number; last_sequence: number }[];
    next: string | null;
  };
  if (!after) {
    app.replaceChildren(el('h1', undefined, 'Streams'));
    const table = el('table', 'streams');
    const head = el('tr');
    for (const title of ['stream', 'status', 'model', 'created', 'messages']) head.append(el('th', undefined, title));
    table.append(head);
    app.append(table);
  }
  const table = app.querySelector('table.streams') as HTMLTableElement;
  for (const stream of page.data) {
    const row = el('tr', `stream ${stream.status}`);
    const link = el('a', undefined, stream.id);
    link.href = `/ui/streams/${encodeURIComponent(stream.id)}`;
    const cell = el('td');
    cell.append(link);
    row.append(
      cell,
      el('td', 'status', stream.status),
      el('td', undefined, stream.model),
      el('td', undefined, new Date(stream.created_ms).toLocaleString()),
      el('td', undefined, String(stream.last_sequence)),
    );
    table.append(row);
  }
  app.querySelector('button.more')?.remove();
  if (page.next) {
    const more = el('button', 'more', 'More');
    const next = page.next;
    more.addEventListener('click', () => void list(next).catch((error) => failed(error, () => void list())));
    app.append(more);
  }
  if (page.data.length === 0 && !after) app.append(el('p', 'empty', 'No streams yet.'));
}

/** The run's view: the conversation (blocks grouped), the timeline, the outcome, and the other format's frames. */
async function run(id: string): Promise<void> {
  const token = new URLSearchParams(window.location.search).get('token') ?? undefined;
  const client = createClient({ baseUrl: base, apiKey: token ? undefined : key() });
  app.replaceChildren();
  const header = el('header');
  header.append(el('h1', undefined, `Stream ${id}`), el('span', 'status', 'connecting…'));
  const conversation = el('section', 'conversation');
  const side = el('aside', 'side');
  const events = el('ol', 'timeline');
  side.append(el('h2', undefined, 'Timeline'), events);
  const frames = framesPane(id, token);
  const layout = el('div', 'layout');
  layout.append(conversation, side, frames);
  app.append(header, layout);
  const status = header.querySelector('.status') as HTMLElement;

  const nodes = new Map<number, HTMLElement>();
  const items = new Map<number, HTMLElement>();
  const blocks = new Map<string, HTMLElement>();
  const calls = new Map<string, HTMLElement>();
  const place = (message: OutputMessage): HTMLElement => {
    if (!message.block_id) return conversation;
    let block = blocks.get(message.block_id);
    if (!block) {
      block = el('div', 'block');
      block.dataset.blockId = message.block_id;
      conversation.append(block);
      blocks.set(message.block_id, block);
    }
    return block;
  };
  const resolveLoading = (within: ParentNode) => within.querySelectorAll('.message.loading').forEach((n) => n.classList.add('done'));

  let state: StreamState | undefined;
  for await (const update of client.watch(id, { token })) {
    state = update.state;
    status.textContent = `${state.status} · ${state.last_sequence} messages`;
    const message = update.message;
    const props = (message.props ?? {}) as Record<string, unknown>;
    // The message's state: the reduced one, where later deltas add to it.
    const slot = message.message_id ? state.messages.findIndex((m) => m.message_id === message.message_id) : state.messages.length - 1;
    const current = state.messages[slot] ?? message;
    if (message.type === 'event' || message.type === 'action') {
      // One entry per message: an action's deltas update its entry.
      const item = timeline(current);
      const previous = items.get(slot);
      if (previous) previous.replaceWith(item);
      else events.append(item);
      items.set(slot, item);
      if (message.type === 'event' && (props.event === 'block_end' || props.event === 'message_end')) {
        const data = (props.data ?? {}) as Record<string, unknown>;
        const block = typeof data.block_id === 'string' ? blocks.get(data.block_id) : undefined;
        if (block) resolveLoading(block);
        const loading = typeof data.message_id === 'string' ? conversation.querySelector(`[data-message-id="${CSS.escape(data.message_id)}"].loading`) : null;
        loading?.classList.add('done');
      }
      continue;
    }
    if (current.type === 'tool_result') {
      const call = calls.get(String(((current.props ?? {}) as Record<string, unknown>).call_id));
      if (call) {
        call.querySelector('.tool-result')?.replaceWith(result((current.props ?? {}) as Record<string, unknown>));
        continue;
      }
    }
    const node = render(current);
    if (!node) continue;
    const previous = nodes.get(slot);
    if (previous) {
      // A thinking block stays as the reader left it.
      const open = previous.querySelector('details')?.open;
      if (open) node.querySelector('details')?.setAttribute('open', '');
      const oldResult = previous.querySelector('.tool-result:not(.pending)');
      if (oldResult) node.querySelector('.tool-result')?.replaceWith(oldResult);
      previous.replaceWith(node);
    } else {
      place(current).append(node);
    }
    nodes.set(slot, node);
    if (current.type === 'tool_call') calls.set(String(((current.props ?? {}) as Record<string, unknown>).id), node);
  }
  resolveLoading(conversation);
  // A call the run ended without answering (one handed to the caller, or cut short) is not running any more.
  conversation.querySelectorAll('.tool-result.pending').forEach((n) => {
    n.classList.replace('pending', 'unanswered');
    n.textContent = 'no result in this run';
  });
  if (state) conversation.append(outcome(state));
}

/** The end of the run: its status, and its error or usage. */
function outcome(state: StreamState): HTMLElement {
  const node = el('div', `outcome ${state.status}`);
  node.append(el('strong', undefined, `Run ${state.status}`));
  const end = [...state.messages].reverse().find((m) => m.type === 'event' && (m.props as Record<string, unknown>)?.event === 'stream_end');
  const data = ((end?.props as Record<string, unknown>)?.data ?? {}) as Record<string, unknown>;
  if (data.error) node.append(el('span', 'outcome-error', ` ${String((data.error as Record<string, unknown>).message ?? '')}`));
  if (data.usage) node.append(json(data.usage));
  return node;
}

/** The same run in another format, frame by frame, as its clients receive it. */
function framesPane(id: string, token: string | undefined): HTMLElement {
  const pane = el('section', 'frames');
  const select = el('select');
  for (const format of ['openai', 'ui-message', 'ag-ui', 'anthropic', 'responses', 'cui']) {
    const option = el('option', undefined, format);
    option.value = format;
    select.append(option);
  }
  const out = el('pre', 'frames-text');
  pane.append(el('h2', undefined, 'Frames'), select, out);
  let controller: AbortController | undefined;
  const show = async () => {
    controller?.abort();
    controller = new AbortController();
    out.textContent = '';
    const query = new URLSearchParams({ format: select.value });
    if (token) query.set('token', token);
    const headers: Record<string, string> = {};
    const apiKey = key();
    if (!token && apiKey) headers.authorization = `Bearer ${apiKey}`;
    try {
      const response = await fetch(`${base}/v1/streams/${encodeURIComponent(id)}/events?${query}`, { headers, signal: controller.signal });
      if (!response.body) return;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        out.append(document.createTextNode(value));
      }
    } catch (error) {
      if (!(error instanceof DOMException && error.name === 'AbortError')) out.append(document.createTextNode(`\n(${String(error)})`));
    }
  };
  select.addEventListener('change', () => void show());
  void show();
  return pane;
}

function start(): void {
  const path = window.location.pathname;
  const match = path.match(/^\/ui\/streams\/([^/]+)$/);
  if (match) {
    const id = decodeURIComponent(match[1] as string);
    run(id).catch((error) => failed(error, start));
  } else {
    list().catch((error) => failed(error, start));
  }
}

start();
