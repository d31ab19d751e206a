//! The OpenAI adapters: a stream's messages as `chat.completion.chunk` deltas ([`OpenAiAdapter`]) or as one
//! `chat.completion` ([`OpenAiCompletion`]), exactly as `docs/clients.md` ("OpenAI chat") describes.
//!
//! - `projection.rs`: what each message type becomes (text → `content`, thinking and loading → reasoning,
//!   tool calls, media → Markdown, action and event → nothing).
//! - `progress.rs`: the state machine both share: it reduces deltas and tracks what was sent.
//! - `stream.rs` and `completion.rs`: the two adapters; `wire.rs`: the JSON shapes.
//! - `options.rs`: what they are told beyond the messages ([`OpenAiOptions`], [`AgentTools`],
//!   [`ReasoningField`]).
//!
//! # Degradations
//!
//! A chunk stream only ever adds. What agentmux cannot express in it, and what it does instead:
//! - a `replace`, `merge` or `set` (or a resend, or a `type_change`) that leaves a message's content or
//!   reasoning no longer starting with what was sent: its whole corrected text goes out again, on a new line
//!   after what was sent (a client cannot drop the stale text, but it reads the corrected text last), and the
//!   message streams on from there; a correction to the empty text goes out with the message's next text.
//!   The non-streaming response uses the final text only. A tool call's arguments taken back send nothing
//!   until they extend what was sent again;
//! - a loading message that turns `done` sends nothing more; one whose text is replaced sends its new text as
//!   a correction;
//! - a tool call whose `id` or `name` changes after its first delta: the first ones stand;
//! - a tool call the agent runs itself (`server_side`) and its `tool_result` are never `tool_calls`: they are
//!   reasoning lines, or nothing ([`AgentTools`]);
//! - tool calls streaming at once are sent one after another, as OpenAI sends them (openai-python's
//!   `.stream()` helper closes a call's arguments when the next call starts): a call waits until the one
//!   before it has ended (its `message_end`, a call sent whole, or the end of the stream), then sends its
//!   header and its arguments so far;
//! - two text (or reasoning) messages streaming at once interleave in the chunk stream; the non-streaming
//!   response puts each message's text whole, in order of first appearance;
//! - reasoning from different messages, and a media link next to other content, are separated by a line
//!   break when the text before did not end a line (text after text is joined as it is);
//! - an `error` message ends the stream (`{"error": ...}` then `[DONE]`); later messages are not sent;
//! - action, event, and custom types without a `url` are not sent; an error's `details` is not sent.

mod completion;
mod options;
pub(super) mod progress;
mod projection;
mod stream;
mod wire;

pub use completion::OpenAiCompletion;
pub use options::{AgentTools, OpenAiOptions, ReasoningField};
pub use stream::OpenAiAdapter;
pub use wire::ApiError;
pub(crate) use wire::Envelope;
