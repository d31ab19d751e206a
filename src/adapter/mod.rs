//! Adapters: deterministic state machines that turn a stream's messages into wire frames.
//!
//! An adapter is fed a stream's messages one at a time ([`Adapter::push`]) and then how the stream ended
//! ([`Adapter::finish`]); each step appends zero or more [`Frame`]s: events that know no transport (`frame.rs`);
//! SSE and WebSocket each encode them (`crate::render`). The frames for message N depend only on messages 1..N and on options fixed when
//! the adapter was made (ids, clock, model name), never on when or by whom they are read. That is what lets a
//! stream render each message once per format and hand the same bytes to every subscriber of that format,
//! and lets tests pin the output with golden files.
//!
//! - [`CuiAdapter`] (`cui.rs`): the typed messages themselves, one SSE event each, with `id:` lines.
//! - [`OpenAiAdapter`] (`openai/`): `chat.completion.chunk` deltas, and [`OpenAiCompletion`], the same
//!   messages aggregated into one non-streaming `chat.completion`.
//! - [`UiMessageAdapter`] (`ui/`): the Vercel AI SDK's UI message stream, the chunks `useChat` reads.
//! - [`AgUiAdapter`] (`ag_ui/`): AG-UI events, what `@ag-ui/client` reads.
//! - [`AnthropicAdapter`] (`anthropic.rs`) and [`ResponsesAdapter`] (`responses.rs`): an Anthropic Messages
//!   stream and an OpenAI Responses stream, both on the OpenAI adapters' state machine.
//!
//! [`Adapter`] itself is in `machine.rs`; `sent.rs` holds the rule the adapters that only ever add share:
//! what of a message's text is new.
//!
//! This file only declares the modules and re-exports; each file imports its siblings directly
//! (`super::machine::Adapter`), never through here, so no file imports a circle back to itself.

mod ag_ui;
mod anthropic;
mod cui;
mod frame;
mod machine;
mod openai;
mod responses;
mod sent;
mod ui;

pub use ag_ui::{AgUiAdapter, AgUiOptions};
pub use anthropic::{AnthropicAdapter, AnthropicOptions};
pub use cui::CuiAdapter;
pub use frame::{Frame, Payload};
pub use machine::Adapter;
pub(crate) use openai::Envelope;
pub use openai::{AgentTools, ApiError, OpenAiAdapter, OpenAiCompletion, OpenAiOptions, ReasoningField};
pub use responses::{ResponsesAdapter, ResponsesOptions};
pub use ui::{UiMessageAdapter, UiMessageOptions};
