//! agentmux carries the output of LLM agents to every client that wants to watch it.
//!
//! # Layout
//!
//! The core, which every build has:
//!
//! - [`output`]: the typed output message agents emit (text, thinking, loading, tool_call, tool_result, error,
//!   media, action, event, custom types), its validation, and the delta reducer that says what each message
//!   looks like after its deltas.
//! - [`adapter`]: deterministic renderers from a stream's messages to frames that know no transport, one per
//!   format: [`adapter::CuiAdapter`] (the typed messages), [`adapter::OpenAiAdapter`]
//!   (`chat.completion.chunk` deltas, and [`adapter::OpenAiCompletion`] for a whole response),
//!   [`adapter::UiMessageAdapter`] (the AI SDK's UI message stream), [`adapter::AgUiAdapter`] (AG-UI),
//!   [`adapter::AnthropicAdapter`] (Anthropic Messages events) and [`adapter::ResponsesAdapter`] (OpenAI
//!   Responses events).
//! - [`hub`]: streams (the producer's side in `hub/stream/`), the seams behind them ([`hub::Storage`] and its
//!   [`hub::Log`], [`hub::Render`]), renditions shared by every subscriber, limits and retention.
//! - [`render`]: a format and a transport's encoding (SSE, WebSocket) together, as the hub renders them.
//! - [`agent`]: the agent API ([`agent::Agent`], the [`agent::Output`] emitter), the registry and the built-in
//!   agents; [`conversation`]: what agents receive, from every front door's request shape;
//!   [`thread`]: server-side threads (the registry, a turn, the audit log, replay) over the
//!   `ThreadStorage` seam.
//!
//! Behind features (all on by default):
//!
//! - `store`: [`store`], the embedded SQLite store, which keeps streams, threads and the audit log across
//!   restarts (the hub's storage and the threads').
//! - `redis`: [`cluster`], several nodes serving the same streams and threads through Redis.
//! - `upstream`: [`agent::UpstreamAgent`], any OpenAI-compatible model server behind the chat endpoints.
//! - `server`: [`node`], one service assembled from a [`node::NodeConfig`] and run with its maintenance, over
//!   whichever of the engines and the upstream are built; [`http`], the service on the network (its transport,
//!   its endpoints, its edge).
//! - `cli` (with all of the above): the `agentmux` binary, and [`logs`], where its log lines go.
//!
//! ```
//! use agentmux::adapter::{Adapter, CuiAdapter, OpenAiAdapter, OpenAiOptions};
//! use agentmux::output::{DeltaAction, Outcome, OutputMessage};
//!
//! let messages = [
//!     OutputMessage::text("Hello").with_message_id("m1"),
//!     OutputMessage::text(", world").with_message_id("m1").as_delta(DeltaAction::Append, None),
//! ];
//! let mut openai = OpenAiAdapter::new(OpenAiOptions::new("chatcmpl-1", 1700000000, "demo"));
//! let mut cui = CuiAdapter;
//! let (mut chunks, mut events) = (Vec::new(), Vec::new());
//! for message in &messages {
//!     openai.push(message, &mut chunks);
//!     cui.push(message, &mut events);
//! }
//! openai.finish(&Outcome::completed(), &mut chunks);
//! assert_eq!(events.len(), 2);
//! assert_eq!(chunks.len(), 5); // role, "Hello", ", world", finish, [DONE]
//! ```

// A build without every feature (the core alone, say) leaves some crate-internal items unused: they serve the
// store, Redis, the server or the upstream agent, which that build leaves out.
#![cfg_attr(
    not(all(feature = "cli", feature = "server", feature = "store", feature = "redis", feature = "upstream")),
    allow(dead_code, unused_imports)
)]

pub mod adapter;
pub mod agent;
#[cfg(feature = "redis")]
pub mod cluster;
pub mod conversation;
#[cfg(feature = "server")]
pub mod http;
pub mod hub;
#[cfg(feature = "cli")]
pub mod logs;
#[cfg(feature = "server")]
pub mod node;
pub mod output;
pub mod render;
pub mod schema;
#[cfg(feature = "store")]
pub mod store;
mod sync;
pub mod thread;

/// The README's examples, compiled and run as doc tests so they cannot drift.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
