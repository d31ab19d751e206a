//! The conversation a client sends: OpenAI chat requests and their messages.
//!
//! - [`ChatRequest`] and [`ChatMessage`] (`request.rs`): what `POST /v1/chat/completions` carries, parsed
//!   leniently where OpenAI clients vary (unknown fields kept aside, content as a string or parts).

mod request;

pub use request::{ChatMessage, ChatRequest, Content, Role, StreamOptions};
