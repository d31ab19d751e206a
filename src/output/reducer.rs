//! The delta reducer: what every message looks like after the deltas that arrived for it.
//!
//! Messages are applied in stream order. A message whose `message_id` is new (or that has none) starts a
//! message, its delta fields cleared. A delta (`delta: true`) for a known id updates that message: it takes
//! the value at `delta_path` (relative to `props`; the type's main field when absent, the whole props for
//! types without one) from its own props and applies its `delta_action` there (see `path.rs`). A message that
//! is not a delta but reuses a known id replaces that message whole. `type_change` lets a delta change the
//! message's type; without it a delta of another type is refused, since it is almost always a producer bug.
//!
//! A refused delta is a typed [`DeltaError`] and leaves the state untouched, so the stream can reject it and
//! carry on. States are kept in order of first appearance, which is the order clients show them in.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::path::{self, PathError};
use super::{DeltaAction, OutputMessage, main_field};

/// Why a delta could not apply. [`DeltaError::field`] names the field as `props.<path>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeltaError {
    /// The delta's type differs from the message's and `type_change` is not set.
    #[error(
        "type: delta of type {delta:?} for message {message_id:?} of type {state:?} (set type_change to change it)"
    )]
    TypeMismatch {
        /// The message.
        message_id: String,
        /// Its current type.
        state: String,
        /// The delta's type.
        delta: String,
    },
    /// The delta's props hold nothing at its path.
    #[error("{field}: the delta carries no value at its delta_path")]
    MissingValue {
        /// `props.<path>`
        field: String,
    },
    /// The action cannot apply to what is there, e.g. append to a number.
    #[error("{field}: cannot {action} {value} to {target}")]
    Conflict {
        /// `props.<path>`
        field: String,
        /// The action's name.
        action: &'static str,
        /// What the message holds there.
        target: &'static str,
        /// What the delta carries.
        value: &'static str,
    },
    /// A segment of the path is missing or not an object or array.
    #[error("{field}: no object or array at {segment:?} (only set creates the way)")]
    NoParent {
        /// `props.<path>`
        field: String,
        /// The segment that failed.
        segment: String,
    },
}

impl DeltaError {
    /// The field the error is about (`type`, `props.content`).
    pub fn field(&self) -> &str {
        match self {
            DeltaError::TypeMismatch { .. } => "type",
            DeltaError::MissingValue { field }
            | DeltaError::Conflict { field, .. }
            | DeltaError::NoParent { field, .. } => field,
        }
    }
}

/// How to take back one logged apply.
#[derive(Debug, Clone)]
pub(crate) enum Undo {
    /// A message was started: remove it.
    Created { message_id: Option<String> },
    /// A message was changed: restore it.
    Changed { slot: usize, previous: Box<OutputMessage> },
}

/// The current state of every message of a stream.
///
/// ```
/// use agentmux::output::{DeltaAction, OutputMessage, Reducer};
///
/// let mut reducer = Reducer::default();
/// reducer.apply(&OutputMessage::text("Hello").with_message_id("m")).unwrap();
/// let more = OutputMessage::text(", world").with_message_id("m").as_delta(DeltaAction::Append, None);
/// reducer.apply(&more).unwrap();
/// assert_eq!(reducer.text(), "Hello, world");
///
/// let bad = OutputMessage::text("x").with_message_id("m").as_delta(DeltaAction::Merge, None);
/// assert_eq!(reducer.apply(&bad).unwrap_err().field(), "props.content");
/// assert_eq!(reducer.text(), "Hello, world");
/// ```
#[derive(Debug, Clone, Default)]
pub struct Reducer {
    messages: Vec<OutputMessage>,
    slots: HashMap<String, usize>,
}

impl Reducer {
    /// Applies one message; returns the position of the message it started or updated.
    pub fn apply(&mut self, message: &OutputMessage) -> Result<usize, DeltaError> {
        let Some(slot) = self.slot_of(message) else {
            let slot = self.messages.len();
            if let Some(id) = &message.message_id {
                self.slots.insert(id.clone(), slot);
            }
            self.messages.push(message.to_state());
            return Ok(slot);
        };
        let state = &mut self.messages[slot];
        if message.delta {
            apply_delta(state, message)?;
        } else {
            *state = message.to_state();
        }
        Ok(slot)
    }

    /// Like [`Reducer::apply`], recording in `undo` how to take it back with [`Reducer::rollback`].
    pub(crate) fn apply_logged(&mut self, message: &OutputMessage, undo: &mut Vec<Undo>) -> Result<usize, DeltaError> {
        match self.slot_of(message) {
            None => {
                let slot = self.apply(message)?;
                undo.push(Undo::Created { message_id: message.message_id.clone() });
                Ok(slot)
            }
            Some(slot) => {
                let previous = Box::new(self.messages[slot].clone());
                self.apply(message)?;
                undo.push(Undo::Changed { slot, previous });
                Ok(slot)
            }
        }
    }

    /// Takes back logged applies, newest first.
    pub(crate) fn rollback(&mut self, undo: Vec<Undo>) {
        for step in undo.into_iter().rev() {
            match step {
                Undo::Created { message_id } => {
                    self.messages.pop();
                    if let Some(id) = message_id {
                        self.slots.remove(&id);
                    }
                }
                Undo::Changed { slot, previous } => self.messages[slot] = *previous,
            }
        }
    }

    /// The position of the message `message` would update, if it continues a known one.
    pub fn slot_of(&self, message: &OutputMessage) -> Option<usize> {
        message.message_id.as_ref().and_then(|id| self.slots.get(id).copied())
    }

    /// Every message's current state, in order of first appearance.
    pub fn messages(&self) -> &[OutputMessage] {
        &self.messages
    }

    /// The position of the message with this id.
    pub fn slot(&self, message_id: &str) -> Option<usize> {
        self.slots.get(message_id).copied()
    }

    /// The current state of one message.
    pub fn get(&self, message_id: &str) -> Option<&OutputMessage> {
        self.slots.get(message_id).map(|&slot| &self.messages[slot])
    }

    /// The final text: the content of every `text` message, in order.
    pub fn text(&self) -> String {
        self.messages.iter().filter(|m| m.kind == "text").filter_map(|m| m.prop_str("content")).collect()
    }
}

/// The segments of a delta's path: its `delta_path`, or the main field of the type it will have.
pub(crate) fn delta_segments(message: &OutputMessage) -> Vec<&str> {
    match message.delta_path.as_deref() {
        Some("") => Vec::new(),
        Some(path) => path.split('.').collect(),
        None => main_field(&message.kind).into_iter().collect(),
    }
}

/// The value a delta carries at `segments` of its own props.
pub(crate) fn delta_value<'a>(props: &'a Map<String, Value>, segments: &[&str]) -> Option<&'a Value> {
    let (first, rest) = segments.split_first()?;
    path::get(props.get(*first)?, rest)
}

fn apply_delta(state: &mut OutputMessage, delta: &OutputMessage) -> Result<(), DeltaError> {
    if delta.kind != state.kind && !delta.type_change {
        return Err(DeltaError::TypeMismatch {
            message_id: state.message_id.clone().unwrap_or_default(),
            state: state.kind.clone(),
            delta: delta.kind.clone(),
        });
    }
    let segments = delta_segments(delta);
    let field = || if segments.is_empty() { "props".to_owned() } else { format!("props.{}", segments.join(".")) };
    // Without an action a delta appends, except to the whole props, where appending means nothing: merge.
    let action =
        delta.delta_action.unwrap_or(if segments.is_empty() { DeltaAction::Merge } else { DeltaAction::Append });
    let whole;
    let value = if segments.is_empty() {
        whole = Value::Object(delta.props.clone());
        &whole
    } else {
        delta_value(&delta.props, &segments).ok_or_else(|| DeltaError::MissingValue { field: field() })?
    };
    let mut root = Value::Object(std::mem::take(&mut state.props));
    let result = path::apply(&mut root, &segments, action, value);
    if let Value::Object(props) = root {
        state.props = props;
    }
    result.map_err(|e| match e {
        PathError::Conflict { target, value } => {
            DeltaError::Conflict { field: field(), action: action.as_str(), target, value }
        }
        PathError::NoParent { segment } => DeltaError::NoParent { field: field(), segment },
    })?;
    state.kind.clone_from(&delta.kind);
    if delta.metadata.is_some() {
        state.metadata.clone_from(&delta.metadata);
    }
    if delta.block_id.is_some() {
        state.block_id.clone_from(&delta.block_id);
    }
    if delta.thread_id.is_some() {
        state.thread_id.clone_from(&delta.thread_id);
    }
    Ok(())
}
