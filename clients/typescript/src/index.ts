// @agentmux/client: the typed messages (generated from agentmux's schemas), the reducer, and the client.

export * from './types.js';
export { DeltaError, initialState, mainField, reduce, type StreamState } from './reduce.js';
export {
  AgentmuxError,
  createClient,
  EpochChangedError,
  LaggedError,
  type Appended,
  type AppendOptions,
  type ChatRun,
  type Client,
  type ClientOptions,
  type Created,
  type Update,
  type WatchOptions,
  type WriteOptions,
} from './client.js';
