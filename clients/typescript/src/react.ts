// `@agentmux/client/react`: a React hook over the client's `watch`, in an entry point of its own so that
// the main one needs no React.

import { useEffect, useReducer, useRef } from 'react';

import type { Client, WatchOptions } from './client.js';
import type { StreamState } from './reduce.js';
import type { OutputMessage } from './types.js';

/** What `useStream` gives a component. */
export interface StreamView {
  /** The stream's reduced state, `null` before its first message. Updated in place: read it when rendering. */
  state: StreamState | null;
  /** The last message received. */
  message: OutputMessage | null;
  /** Why watching stopped early (`AgentmuxError`, `LaggedError`, `EpochChangedError`, a network error). */
  error: Error | null;
  /** The stream reached its end (`stream_end`). */
  done: boolean;
}

/**
 * Watches a stream while the component is mounted: re-renders on each message with the reduced state,
 * resumes after a dropped connection as `watch` does, and closes the connection when the component
 * unmounts or `streamId` changes. `streamId` null: nothing is watched.
 *
 * ```tsx
 * import { createClient } from '@agentmux/client';
 * import { useStream } from '@agentmux/client/react';
 *
 * const client = createClient({ baseUrl: 'http://127.0.0.1:8080' });
 *
 * function Run({ id, token }: { id: string; token?: string }) {
 *   const { state, error, done } = useStream(client, id, { token });
 *   if (error) return <p>{error.message}</p>;
 *   const text = state?.messages.filter((m) => m.type === 'text').map((m) => m.props?.content).join('');
 *   return <p>{text}{done ? '' : '…'}</p>;
 * }
 * ```
 */
export function useStream(
  client: Client,
  streamId: string | null | undefined,
  options: Omit<WatchOptions, 'signal'> = {},
): StreamView {
  const view = useRef<StreamView>({ state: null, message: null, error: null, done: false });
  const [, rendered] = useReducer((n: number) => n + 1, 0);
  const { from, token, retries } = options;
  useEffect(() => {
    view.current = { state: null, message: null, error: null, done: false };
    rendered();
    if (!streamId) return undefined;
    const controller = new AbortController();
    (async () => {
      try {
        const updates = client.watch(streamId, { from, token, retries, signal: controller.signal });
        for (;;) {
          const next = await updates.next();
          if (controller.signal.aborted) return;
          if (next.done) {
            view.current = { ...view.current, state: next.value, done: true };
            rendered();
            return;
          }
          view.current = { ...view.current, state: next.value.state, message: next.value.message };
          rendered();
        }
      } catch (error) {
        if (controller.signal.aborted) return;
        view.current = { ...view.current, error: error instanceof Error ? error : new Error(String(error)) };
        rendered();
      }
    })();
    return () => controller.abort();
  }, [client, streamId, from, token, retries]);
  return view.current;
}
