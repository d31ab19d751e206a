//! The typed output message an agent emits, and what it looks like after its deltas.
//!
//! This module is the vocabulary every other part of agentmux speaks, so it depends on nothing of ours:
//!
//! - [`OutputMessage`] (`message.rs`): one message as a producer sends it and a CUI client receives it:
//!   a `type`, its `props`, the ids that group chunks into messages, blocks and threads, the delta fields,
//!   and the metadata the stream stamps on it.
//! - The built-in types and their typed props (`props.rs`): [`TextProps`], [`ImageProps`], ... Any other
//!   `type` is a custom type whose props round-trip untouched.
//! - Validation of what a producer sends (`validate.rs`): a [`ValidationError`] names the offending field
//!   (`props.url`, `delta_action`), so the HTTP layer can put it in the error envelope's `param`. Names and
//!   ids (not content) are at most [`NAME_BYTES`] long. It defines the methods that parse a message, so
//!   `message.rs` needs nothing of it.
//! - The delta reducer (`reducer.rs`): [`Reducer`] applies `append | replace | merge | set` deltas in order
//!   and keeps the current state of every message.
//! - How a stream ends (`outcome.rs`): [`Outcome`], with the finish reason and token [`Usage`].
//! - The lifecycle events a stream adds by itself (`lifecycle.rs`): [`StreamStart`], [`StreamEnd`] and the
//!   others, the `data` of their `event` messages.
//!
//! This file only declares the modules and re-exports; each file imports its siblings directly
//! (`super::message::OutputMessage`), never through here, so no file imports a circle back to itself.

mod lifecycle;
mod message;
mod outcome;
mod path;
mod props;
mod reducer;
mod validate;

pub use lifecycle::{BlockEnd, BlockStart, LifecycleEvent, MessageEnd, MessageStart, StreamEnd, StreamStart};
pub use message::{DeltaAction, Metadata, OutputMessage};
pub use outcome::{EndStatus, FinishReason, Outcome, PromptTokensDetails, Usage};
pub(crate) use path::kind_name;
pub use props::{
    ActionProps, AudioProps, BuiltinProps, ErrorProps, EventProps, FileProps, ImageProps, LoadingProps, TextProps,
    ThinkingProps, ToolCallProps, ToolError, ToolResultProps, VideoProps, builtin_types, is_builtin_type, main_field,
};
pub(crate) use reducer::Undo;
pub use reducer::{DeltaError, Reducer};
pub use validate::{NAME_BYTES, ValidationError, check_name};
