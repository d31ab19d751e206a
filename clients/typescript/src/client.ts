// A client of agentmux's HTTP API for browsers and Node 20+: watch a stream (typed messages and the reduced
// state, resuming after a dropped connection exactly once), start a chat run and watch it, and the producer
// calls. SSE is parsed by `eventsource-parser`; everything else is `fetch`. An append carries an
// `Idempotency-Key` (a fresh one unless the caller gives one), so it is retried after a lost answer without
// being appended twice: the service answers a repeat with the first answer.

import { createParser } from 'eventsource-parser';

import { initialState, reduce, type StreamState } from './reduce.js';
import type { Outcome, OutputMessage } from './types.js';

export interface ClientOptions {
  /** Where agentmux answers, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** An API key, where the service has keys. */
  apiKey?: string;
  /** The `fetch` to use (the global one by default). */
  fetch?: typeof fetch;
}

export interface WatchOptions {
  /** Start after this sequence (0: from the start). */
  from?: number;
  /** A read token for this stream, instead of the key. */
  token?: string;
  /** Stops watching (and closes the connection). */
  signal?: AbortSignal;
  /** Reconnects after a dropped connection before giving up (default 8), waiting 100 ms, doubling, at most 5 s. */
  retries?: number;
}

/** One message as it arrived, and the stream's state with it applied. */
export interface Update {
  message: OutputMessage;
  state: StreamState;
}

/** An answer that was not a success: the service's error envelope. */
export class AgentmuxError extends Error {
  constructor(
    readonly status: number,
    readonly code: string | null,
    message: string,
    readonly param: string | null = null,
    /** The stream's last sequence, on an append refused for its condition (`sequence_conflict`, `idempotency_key_reused`). */
    readonly lastSequence: number | null = null,
  ) {
    super(message);
    this.name = 'AgentmuxError';
  }
}

/** The history this watcher needs is no longer kept; it may start again from `resumeFrom`. */
export class LaggedError extends Error {
  constructor(readonly resumeFrom: number) {
    super(`the stream's history after the last message seen is no longer kept; it resumes from ${resumeFrom}`);
    this.name = 'LaggedError';
  }
}

/** The stream is another history than the one being watched (its epoch changed): start over. */
export class EpochChangedError extends Error {
  constructor(
    readonly was: string,
    readonly now: string,
  ) {
    super(`the stream's epoch changed from ${was} to ${now}: its history is not the one watched`);
    this.name = 'EpochChangedError';
  }
}

export interface Created {
  id: string;
  epoch: string;
  read_token: string;
  write_token: string;
  token_expires_at?: number;
}

export interface AppendOptions {
  /** The stream's write token, instead of the key. */
  writeToken?: string;
  /** The batch must follow this sequence: appended only when it is the stream's last (else 409 `sequence_conflict`). */
  after?: number;
  /** The batch's idempotency key (1 to 256 visible ASCII characters); a fresh one is made when none is given. */
  idempotencyKey?: string;
  /** Attempts after the first when one fails for a reason a retry may fix (default 3). */
  retries?: number;
  signal?: AbortSignal;
}

export interface WriteOptions {
  /** The stream's write token, instead of the key. */
  writeToken?: string;
  /** Attempts after the first when one fails for a reason a retry may fix (default 3). */
  retries?: number;
  signal?: AbortSignal;
}

/** What an append (or the end of a message or block) answers. */
export interface Appended {
  /** The sequence of each message of the batch (of each closing event, for an end). */
  sequences: number[];
  /** The stream's last sequence right after it: what the next append follows (`after`). */
  lastSequence: number;
  /** True when the service answered a repeat of an append that had landed: nothing was appended again. */
  replayed: boolean;
}

export interface ChatRun {
  /** The run's stream. */
  streamId: string;
  /** A token to watch it with. */
  readToken: string | null;
  /** The run's messages and state, to its end. */
  updates: AsyncGenerator<Update, StreamState>;
}

export interface Client {
  watch(streamId: string, options?: WatchOptions): AsyncGenerator<Update, StreamState>;
  chat(request: { model?: string; messages: unknown[]; [field: string]: unknown }, options?: { signal?: AbortSignal }): Promise<ChatRun>;
  createStream(body?: { model?: string; token_ttl?: number }): Promise<Created>;
  append(streamId: string, messages: OutputMessage | OutputMessage[], options?: AppendOptions): Promise<Appended>;
  endMessage(streamId: string, messageId: string, options?: WriteOptions): Promise<Appended>;
  endBlock(streamId: string, blockId: string, options?: WriteOptions): Promise<Appended>;
  end(streamId: string, outcome?: Outcome, options?: { writeToken?: string }): Promise<void>;
  cancel(streamId: string, options?: { writeToken?: string }): Promise<void>;
  snapshot(streamId: string, options?: { token?: string }): Promise<StreamState>;
}

/** A new idempotency key: 128 random bits in hex (`crypto.getRandomValues`, which every context has). */
function freshKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
  });

/**
 * A client of the service at `baseUrl`.
 *
 * ```ts
 * const client = createClient({ baseUrl: 'http://127.0.0.1:8080' });
 * const run = await client.chat({ model: 'demo', messages: [{ role: 'user', content: 'hi' }] });
 * for await (const { message, state } of run.updates) render(state);
 * ```
 */
export function createClient(options: ClientOptions): Client {
  const base = options.baseUrl.replace(/\/+$/, '');
  const doFetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  const headers = (credential?: string, extra: Record<string, string> = {}) => {
    const key = credential ?? options.apiKey;
    return key ? { authorization: `Bearer ${key}`, ...extra } : extra;
  };
  const path = (id: string, rest = '') => `${base}/v1/streams/${encodeURIComponent(id)}${rest}`;

  async function failed(response: Response): Promise<AgentmuxError> {
    const body = await response.json().catch(() => null);
    const error = body?.error ?? {};
    const message = error.message ?? response.statusText;
    return new AgentmuxError(response.status, error.code ?? null, message, error.param ?? null, error.last_sequence ?? null);
  }

  /**
   * POSTs a write, again (the same request: for an append, the same key) when an attempt fails for a reason
   * a retry may fix: no answer (a network error, a connection cut before the whole answer), a 5xx the
   * service does not mark `x-should-retry: false` (503 `writer_unreachable`, say), a 429 with `retry-after`.
   * Waits 100 ms, doubling, at most 2 s between attempts, or the `retry-after` the service gave (at most 10 s).
   */
  async function write(url: string, init: RequestInit, retries = 3): Promise<Appended> {
    for (let attempt = 0; ; attempt++) {
      let wait = Math.min(2000, 100 * 2 ** attempt);
      try {
        const response = await doFetch(url, init);
        if (response.ok) {
          const answer = (await response.json()) as { sequences: number[]; last_sequence: number };
          const replayed = response.headers.get('idempotent-replayed') === 'true';
          return { sequences: answer.sequences, lastSequence: answer.last_sequence, replayed };
        }
        const error = await failed(response);
        const after = Number(response.headers.get('retry-after'));
        const retryable =
          response.headers.get('x-should-retry') !== 'false' &&
          (response.status >= 500 || (response.status === 429 && after > 0));
        if (!retryable || attempt >= retries) throw error;
        if (after > 0) wait = Math.min(10_000, after * 1000);
      } catch (error) {
        if (error instanceof AgentmuxError || init.signal?.aborted || attempt >= retries) throw error;
      }
      await sleep(wait, init.signal ?? undefined);
    }
  }

  async function json<T>(url: string, init: RequestInit): Promise<T> {
    const response = await doFetch(url, init);
    if (!response.ok) throw await failed(response);
    return (await response.json()) as T;
  }

  async function snapshot(streamId: string, opts: { token?: string } = {}): Promise<StreamState> {
    return json<StreamState>(path(streamId), { headers: headers(opts.token) });
  }

  async function* read(response: Response, onMessage: (message: OutputMessage, id: string | undefined) => boolean) {
    const body = response.body;
    if (!body) return;
    const queue: { data: string; id: string | undefined }[] = [];
    const parser = createParser({ onEvent: (event) => queue.push({ data: event.data, id: event.id }) });
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        parser.feed(value);
        while (queue.length > 0) {
          const event = queue.shift() as { data: string; id: string | undefined };
          const message = JSON.parse(event.data) as OutputMessage;
          if (!onMessage(message, event.id)) return;
          yield message;
        }
      }
    } finally {
      await reader.cancel().catch(() => {});
    }
  }

  async function* watch(streamId: string, opts: WatchOptions = {}): AsyncGenerator<Update, StreamState> {
    const state = initialState();
    let last = opts.from ?? 0;
    let epoch: string | undefined;
    let ended = false;
    let failures = 0;
    const retries = opts.retries ?? 8;
    while (!ended && !opts.signal?.aborted) {
      let response: Response;
      try {
        const extra: Record<string, string> = { accept: 'text/event-stream' };
        if (last > 0) extra['last-event-id'] = String(last);
        response = await doFetch(path(streamId, '/events'), { headers: headers(opts.token, extra), signal: opts.signal });
      } catch (error) {
        if (opts.signal?.aborted || ++failures > retries) throw error;
        await sleep(Math.min(5000, 100 * 2 ** (failures - 1)), opts.signal);
        continue;
      }
      // Every answer names the stream's epoch (a resumed subscription starts after the stream_start that
      // carries it): another than the first answer's is another history.
      const named = response.headers.get('x-agentmux-epoch');
      if (named) {
        if (epoch === undefined) epoch = named;
        else if (named !== epoch) throw new EpochChangedError(epoch, named);
      }
      if (response.status === 204) break;
      if (!response.ok) throw await failed(response);
      try {
        const messages = read(response, (message, id) => {
          const sequence = id === undefined || id === '' ? undefined : Number(id);
          if (sequence === undefined) {
            const props = (message.props ?? {}) as Record<string, unknown>;
            if (message.type === 'error' && props.code === 'lagged') {
              const details = (props.details ?? {}) as Record<string, unknown>;
              throw new LaggedError(Number(details.resume_from ?? 0));
            }
          }
          return true;
        });
        for await (const message of messages) {
          const sequence = message.metadata?.sequence ?? 0;
          if (sequence !== 0 && sequence <= last) continue;
          last = Math.max(last, sequence);
          failures = 0;
          reduce(state, message);
          yield { message, state };
          const props = (message.props ?? {}) as Record<string, unknown>;
          if (message.type === 'event' && props.event === 'stream_end') ended = true;
        }
      } catch (error) {
        if (error instanceof LaggedError || opts.signal?.aborted) throw error;
        if (++failures > retries) throw error;
        await sleep(Math.min(5000, 100 * 2 ** (failures - 1)), opts.signal);
        continue;
      }
      if (!ended) {
        // The connection closed before the end: resume.
        if (++failures > retries) throw new Error(`the stream ${streamId} closed before its end ${retries} times`);
        await sleep(Math.min(5000, 100 * 2 ** (failures - 1)), opts.signal);
      }
    }
    return state;
  }

  async function chat(
    request: { model?: string; messages: unknown[]; [field: string]: unknown },
    opts: { signal?: AbortSignal } = {},
  ): Promise<ChatRun> {
    // The run's answer names its stream; it is then watched like any other, resumable.
    const response = await doFetch(`${base}/v1/chat/completions?accept=cui`, {
      method: 'POST',
      headers: headers(undefined, { 'content-type': 'application/json' }),
      body: JSON.stringify({ ...request, stream: true }),
      signal: opts.signal,
    });
    if (!response.ok) throw await failed(response);
    const streamId = response.headers.get('x-agentmux-stream-id');
    if (!streamId) throw new Error('the answer named no stream (x-agentmux-stream-id)');
    const readToken = response.headers.get('x-agentmux-read-token');
    await response.body?.cancel().catch(() => {});
    const token = options.apiKey ? undefined : (readToken ?? undefined);
    return { streamId, readToken, updates: watch(streamId, { token, signal: opts.signal }) };
  }

  return {
    watch,
    chat,
    snapshot,
    createStream: (body = {}) =>
      json<Created>(`${base}/v1/streams`, {
        method: 'POST',
        headers: headers(undefined, { 'content-type': 'application/json' }),
        body: JSON.stringify(body),
      }),
    append: (streamId, messages, opts = {}) => {
      const query = opts.after === undefined ? '' : `?after=${opts.after}`;
      const key = opts.idempotencyKey ?? freshKey();
      return write(
        path(streamId, `/messages${query}`),
        {
          method: 'POST',
          headers: headers(opts.writeToken, { 'content-type': 'application/json', 'idempotency-key': key }),
          body: JSON.stringify(messages),
          signal: opts.signal,
        },
        opts.retries,
      );
    },
    // Ending what is not open ends nothing, so these are retried as they are.
    endMessage: (streamId, messageId, opts = {}) =>
      write(
        path(streamId, `/messages/${encodeURIComponent(messageId)}/end`),
        { method: 'POST', headers: headers(opts.writeToken), signal: opts.signal },
        opts.retries,
      ),
    endBlock: (streamId, blockId, opts = {}) =>
      write(
        path(streamId, `/blocks/${encodeURIComponent(blockId)}/end`),
        { method: 'POST', headers: headers(opts.writeToken), signal: opts.signal },
        opts.retries,
      ),
    end: async (streamId, outcome, opts = {}) => {
      await json(path(streamId, '/end'), {
        method: 'POST',
        headers: headers(opts.writeToken, { 'content-type': 'application/json' }),
        body: outcome === undefined ? '' : JSON.stringify(outcome),
      });
    },
    cancel: async (streamId, opts = {}) => {
      await json(path(streamId, '/cancel'), { method: 'POST', headers: headers(opts.writeToken) });
    },
  };
}
