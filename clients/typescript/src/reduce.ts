// The delta reducer, exactly as agentmux applies it (src/output/reducer.rs and path.rs): a message without a
// known `message_id` is a new message; a whole message with a known id replaces it; a delta changes the value
// at its `delta_path` (the type's main field when absent, the whole props when empty) by `append`, `replace`,
// `merge` or `set`. The state also follows the stream's lifecycle events, so it serialises to the same JSON
// as the service's snapshot (`GET /v1/streams/{id}`): `{id, status, epoch, last_sequence, messages}`.

import type { DeltaAction, OutputMessage } from './types.js';

/** What a stream amounts to: the same fields, in the same order, as the service's snapshot. */
export interface StreamState {
  id: string;
  status: 'open' | 'completed' | 'cancelled' | 'error';
  epoch: string;
  last_sequence: number;
  messages: OutputMessage[];
}

/** A delta that cannot apply to the state (the service refuses these, so a client never meets one). */
export class DeltaError extends Error {
  constructor(
    message: string,
    readonly field: string,
  ) {
    super(`${field}: ${message}`);
    this.name = 'DeltaError';
  }
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };

const SLOTS = Symbol('slots');
type Indexed = StreamState & { [SLOTS]?: Map<string, number> };

/** An empty stream's state. */
export function initialState(): StreamState {
  return { id: '', status: 'open', epoch: '', last_sequence: 0, messages: [] };
}

/** The field a delta without `delta_path` changes. */
export function mainField(type: string): string | undefined {
  switch (type) {
    case 'text':
    case 'thinking':
      return 'content';
    case 'loading':
      return 'message';
    case 'tool_call':
      return 'arguments';
    default:
      return undefined;
  }
}

/**
 * Applies `message` to `state` (in place) and returns it.
 *
 * ```ts
 * let state = initialState();
 * reduce(state, { type: 'text', props: { content: 'Hel' }, message_id: 'm' });
 * reduce(state, { type: 'text', props: { content: 'lo' }, message_id: 'm', delta: true });
 * state.messages[0].props.content; // 'Hello'
 * ```
 */
export function reduce(state: StreamState, message: OutputMessage): StreamState {
  const indexed = state as Indexed;
  let slots = indexed[SLOTS];
  if (!slots) {
    slots = new Map(state.messages.flatMap((m, i) => (m.message_id ? [[m.message_id, i] as const] : [])));
    Object.defineProperty(indexed, SLOTS, { value: slots, enumerable: false, writable: true });
  }
  follow(state, message);
  const id = message.message_id ?? undefined;
  const slot = id === undefined ? undefined : slots.get(id);
  if (slot === undefined) {
    if (id !== undefined) slots.set(id, state.messages.length);
    state.messages.push(toState(message));
  } else if (message.delta) {
    state.messages[slot] = applyDelta(state.messages[slot] as OutputMessage, message);
  } else {
    state.messages[slot] = toState(message);
  }
  return state;
}

/** What the lifecycle says of the stream: its id and epoch, its status once it ends, its last sequence. */
function follow(state: StreamState, message: OutputMessage): void {
  const sequence = message.metadata?.sequence;
  if (typeof sequence === 'number' && sequence > state.last_sequence) state.last_sequence = sequence;
  if (message.type !== 'event' || message.delta) return;
  const props = (message.props ?? {}) as JsonObject;
  const data = (props.data ?? {}) as JsonObject;
  if (props.event === 'stream_start') {
    if (typeof data.stream_id === 'string') state.id = data.stream_id;
    if (typeof data.epoch === 'string') state.epoch = data.epoch;
  } else if (props.event === 'stream_end' && typeof data.status === 'string') {
    state.status = data.status as StreamState['status'];
  }
}

/** A message as state: no chunk id and no delta fields; its fields in the service's order. */
function toState(message: OutputMessage): OutputMessage {
  return canonical({
    type: message.type ?? '',
    props: structuredClone(message.props ?? {}),
    message_id: message.message_id,
    block_id: message.block_id,
    thread_id: message.thread_id,
    metadata: message.metadata == null ? undefined : structuredClone(message.metadata),
  });
}

/** The fields that are there, in the order the service writes them. */
function canonical(message: OutputMessage): OutputMessage {
  const out: OutputMessage = { type: message.type ?? '', props: message.props ?? {} };
  for (const key of ['message_id', 'block_id', 'thread_id', 'metadata'] as const) {
    const value = message[key];
    if (value !== undefined && value !== null) (out as Record<string, unknown>)[key] = value;
  }
  return out;
}

function segmentsOf(delta: OutputMessage): string[] {
  const path = delta.delta_path;
  if (path === '') return [];
  if (path !== undefined && path !== null) return path.split('.');
  const main = mainField(delta.type ?? '');
  return main === undefined ? [] : [main];
}

function applyDelta(state: OutputMessage, delta: OutputMessage): OutputMessage {
  const type = delta.type ?? '';
  if (type !== state.type && !delta.type_change) {
    throw new DeltaError(
      `delta of type ${JSON.stringify(type)} for message ${JSON.stringify(state.message_id ?? '')} of type ` +
        `${JSON.stringify(state.type)} (set type_change to change it)`,
      'type',
    );
  }
  const segments = segmentsOf(delta);
  const field = segments.length === 0 ? 'props' : `props.${segments.join('.')}`;
  const action: DeltaAction = delta.delta_action ?? (segments.length === 0 ? 'merge' : 'append');
  const props = (delta.props ?? {}) as JsonObject;
  let value: Json | undefined;
  if (segments.length === 0) {
    value = props;
  } else {
    const [first, ...rest] = segments as [string, ...string[]];
    const start = props[first];
    value = start === undefined ? undefined : get(start, rest);
    if (value === undefined) throw new DeltaError('the delta carries no value at its delta_path', field);
  }
  // On a copy: a delta that cannot apply changes nothing.
  const root = structuredClone(state.props ?? {}) as JsonObject;
  try {
    apply(root, segments, action, value);
  } catch (error) {
    if (error instanceof PathError) {
      throw new DeltaError(
        error.conflict ? `cannot ${action} ${error.conflict.value} to ${error.conflict.target}` : `no object or array at ${JSON.stringify(error.segment)} (only set creates the way)`,
        field,
      );
    }
    throw error;
  }
  return canonical({
    type,
    props: root,
    message_id: state.message_id,
    block_id: delta.block_id ?? state.block_id,
    thread_id: delta.thread_id ?? state.thread_id,
    metadata: delta.metadata != null ? structuredClone(delta.metadata) : state.metadata,
  });
}

class PathError extends Error {
  constructor(
    readonly segment: string,
    readonly conflict?: { target: string; value: string },
  ) {
    super(segment);
  }
}

function kindName(value: Json | undefined): string {
  if (value === null || value === undefined) return 'null';
  if (Array.isArray(value)) return 'an array';
  switch (typeof value) {
    case 'boolean':
      return 'a boolean';
    case 'number':
      return 'a number';
    case 'string':
      return 'a string';
    default:
      return 'an object';
  }
}

const isObject = (value: Json | undefined): value is JsonObject =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

function index(segment: string): number | undefined {
  return /^[0-9]+$/.test(segment) ? Number(segment) : undefined;
}

function get(root: Json, path: string[]): Json | undefined {
  let node: Json | undefined = root;
  for (const segment of path) {
    if (isObject(node)) node = Object.hasOwn(node, segment) ? node[segment] : undefined;
    else if (Array.isArray(node)) {
      const i = index(segment);
      node = i === undefined ? undefined : node[i];
    } else return undefined;
    if (node === undefined) return undefined;
  }
  return node;
}

function arrayIndex(segment: string, length: number): number {
  const i = index(segment);
  if (i === undefined || i > length) throw new PathError(segment);
  return i;
}

function child(node: Json, segment: string, create: boolean): Json {
  if (isObject(node)) {
    const present = Object.hasOwn(node, segment) && node[segment] !== null;
    if (!present) {
      if (!create) throw new PathError(segment);
      node[segment] = {};
    }
    return node[segment] as Json;
  }
  if (Array.isArray(node)) {
    const i = arrayIndex(segment, node.length);
    if (i >= node.length) throw new PathError(segment);
    return node[i] as Json;
  }
  throw new PathError(segment);
}

function check(target: Json | undefined, action: DeltaAction, value: Json): void {
  const present = target === undefined || target === null ? undefined : target;
  let ok: boolean;
  switch (action) {
    case 'replace':
    case 'set':
      ok = true;
      break;
    case 'append':
      ok =
        present === undefined ||
        (typeof present === 'string' ? typeof value === 'string' : Array.isArray(present));
      break;
    case 'merge':
      ok = (present === undefined || isObject(present)) && isObject(value);
      break;
  }
  if (!ok) {
    throw new PathError('', { target: present === undefined ? 'nothing' : kindName(present), value: kindName(value) });
  }
}

/** The new value of `target` after `action` with `value`. */
function written(target: Json, action: DeltaAction, value: Json): Json {
  if (action === 'append' && typeof target === 'string' && typeof value === 'string') return target + value;
  if (action === 'append' && Array.isArray(target)) {
    return Array.isArray(value) ? [...target, ...structuredClone(value)] : [...target, structuredClone(value)];
  }
  if (action === 'merge' && isObject(target) && isObject(value)) {
    for (const [key, v] of Object.entries(value)) target[key] = structuredClone(v);
    return target;
  }
  return structuredClone(value);
}

function apply(root: JsonObject, path: string[], action: DeltaAction, value: Json): void {
  if (path.length === 0) {
    check(root, action, value);
    const next = written(root, action, value);
    if (next !== root && isObject(next)) {
      for (const key of Object.keys(root)) delete root[key];
      Object.assign(root, next);
    } else if (next !== root) {
      // Only a merge or a replace reaches the whole props; a replace with a non-object leaves them as they
      // were in the service too (its props stay an object).
      for (const key of Object.keys(root)) delete root[key];
    }
    return;
  }
  const leaf = path[path.length - 1] as string;
  let node: Json = root;
  for (const segment of path.slice(0, -1)) node = child(node, segment, action === 'set');
  if (isObject(node)) {
    const current = Object.hasOwn(node, leaf) ? node[leaf] : undefined;
    check(current, action, value);
    node[leaf] = current === undefined ? structuredClone(value) : written(current, action, value);
  } else if (Array.isArray(node)) {
    const i = arrayIndex(leaf, node.length);
    const current = node[i];
    check(current, action, value);
    if (i < node.length) node[i] = written(current as Json, action, value);
    else node.push(structuredClone(value));
  } else {
    throw new PathError(leaf);
  }
}
