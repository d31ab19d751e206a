//! The conversation a client sends: OpenAI chat requests and their messages, and what an agent receives.
//!
//! - [`ChatRequest`], [`ChatMessage`] and [`ToolCall`] (`request.rs`): what `POST /v1/chat/completions`
//!   carries, parsed leniently where OpenAI clients vary (unknown fields kept aside, content as a string or
//!   parts, arguments as text or an object) and typed where it matters (roles, tool calls).
//! - [`Conversation`] (`input.rs`): what an agent receives: validated messages, the model, the request's
//!   options and the thread.
//! - [`Messages`] (`messages.rs`): a conversation as a chain, with constructors, a fluent builder, filters,
//!   a token estimate and a pretty printer.
//! - [`validate`] and [`validate_user_input`] (`validate.rs`): what makes a conversation well formed, and
//!   what a client may add to a history the server owns; errors name the message and the field.
//! - [`UiMessage`] and [`to_chat`] (`ui.rs`): what a `useChat` page sends, as chat messages;
//!   [`AgUiMessage`] and [`ag_ui_to_chat`] (`ag_ui.rs`): AG-UI's messages, as chat messages;
//!   [`AnthropicMessage`] and [`anthropic_to_chat`] (`anthropic.rs`): an Anthropic Messages request's;
//!   [`responses_to_chat`] (`responses.rs`): an OpenAI Responses request's input, and what its
//!   `item_reference` items name ([`response_of_item`]).
//!
//! This file only declares the modules and re-exports; each file imports its siblings directly
//! (`super::request::ChatMessage`), never through here, so no file imports a circle back to itself.

mod ag_ui;
mod anthropic;
mod input;
mod messages;
mod request;
mod responses;
mod ui;
mod validate;

pub use ag_ui::{AgUiMessage, ag_ui_to_chat};
pub use anthropic::{AnthropicMessage, anthropic_to_chat};
pub use input::Conversation;
pub use messages::Messages;
pub use request::{ChatMessage, ChatRequest, Content, FunctionCall, Role, StreamOptions, ToolCall};
pub use responses::{KeptItems, item_references, response_of_item, responses_to_chat, responses_to_chat_with};
pub use ui::{UiMessage, to_chat};
pub use validate::{ConversationError, validate, validate_thread_input, validate_user_input};
