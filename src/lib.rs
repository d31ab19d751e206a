//! agentmux carries the output of LLM agents to every client that wants to watch it.
//!
//! # Layout
//!
//! - [`output`]: the typed output message agents emit (text, thinking, loading, tool_call, error, media,
//!   action, event, custom types), its validation, and the delta reducer that says what each message looks
//!   like after its deltas.
//! - [`adapter`]: deterministic renderers from a stream's messages to frames that know no transport:
//!   [`adapter::CuiAdapter`] (the typed messages) and [`adapter::OpenAiAdapter`] (`chat.completion.chunk`
//!   deltas), plus [`adapter::OpenAiCompletion`] for non-streaming responses.
//! - [`hub`]: streams, the log seam their readers read, renditions shared by every subscriber, retention.
//! - [`store`]: the embedded SQLite store that keeps streams, threads and the audit log across restarts.
//! - [`cluster`]: several nodes serving the same streams through Redis.
//! - [`render`]: a format and a transport's encoding (SSE, WebSocket) together, as the hub renders them.
//! - [`agent`]: the agent API and the built-in agents; [`conversation`]: what agents receive;
//!   [`thread`]: server-side threads, their audit log and replay; [`http`]: the service; [`logs`]: where
//!   its log lines go.
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
    not(all(feature = "server", feature = "store", feature = "redis", feature = "upstream")),
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
#[cfg(feature = "server")]
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
