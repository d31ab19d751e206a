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
//! `sent.rs` holds the rule the adapters that only ever add share: what of a message's text is new.

mod ag_ui;
mod anthropic;
mod cui;
mod frame;
mod openai;
mod responses;
mod sent;
mod ui;

use bytes::Bytes;

use crate::output::{ErrorProps, Outcome, OutputMessage};

pub use ag_ui::{AgUiAdapter, AgUiOptions};
pub use anthropic::{AnthropicAdapter, AnthropicOptions};
pub use cui::CuiAdapter;
pub use frame::{Frame, Payload};
pub(crate) use openai::Envelope;
pub use openai::{AgentTools, ApiError, OpenAiAdapter, OpenAiCompletion, OpenAiOptions, ReasoningField};
pub use responses::{ResponsesAdapter, ResponsesOptions};
pub use ui::{UiMessageAdapter, UiMessageOptions};

/// A renderer from messages to frames; see the module doc.
pub trait Adapter {
    /// Renders one message of the stream, appending its frames to `frames`.
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>);

    /// The same, for a message whose compact JSON is at hand (a logged message carries it, see
    /// [`crate::hub::Entry`]): a format that sends the message as it is sends these bytes rather than
    /// serialising it again. Any other format renders it as [`Adapter::push`] does.
    fn push_logged(&mut self, message: &OutputMessage, _json: &Bytes, frames: &mut Vec<Frame>) {
        self.push(message, frames);
    }

    /// Renders the end of the stream, appending the last frames to `frames`.
    fn finish(&mut self, outcome: &Outcome, frames: &mut Vec<Frame>);

    /// True once it will render nothing more, whatever comes (the OpenAI adapter after an error): a reader
    /// that took every frame so far has its whole view of the stream.
    fn ended(&self) -> bool {
        false
    }

    /// Renders an error that is not part of the stream but ends one subscriber's view of it (a subscriber
    /// whose next message is no longer kept): the last frames that subscriber receives. Changes no state.
    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>);
}
