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

use super::message::{DeltaAction, OutputMessage};
use super::path::{self, PathError};
use super::props::main_field;

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
    /// A message was started: remove it (the last one).
    Created,
    /// A message was changed: restore it.
    Changed { slot: usize, previous: Box<OutputMessage> },
    /// Text or items were appended at the delta's `delta_path` (`None`: the type's main field; the type
    /// is the message's still, an append never changes it): cut back to `len`, restore the small fields.
    /// `block_id` and `thread_id` hold the old value only where the delta changed it.
    Truncate {
        slot: usize,
        delta_path: Option<String>,
        len: usize,
        metadata: Option<crate::output::Metadata>,
        block_id: Option<Option<String>>,
        thread_id: Option<Option<String>>,
    },
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
                undo.push(Undo::Created);
                Ok(slot)
            }
            Some(slot) => {
                let state = &self.messages[slot];
                let step = cheap_undo(slot, state, message)
                    .unwrap_or_else(|| Undo::Changed { slot, previous: Box::new(state.clone()) });
                self.apply(message)?;
                undo.push(step);
                Ok(slot)
            }
        }
    }

    /// Takes back logged applies, newest first.
    pub(crate) fn rollback(&mut self, undo: Vec<Undo>) {
        for step in undo.into_iter().rev() {
            match step {
                Undo::Created => {
                    if let Some(id) = self.messages.pop().and_then(|state| state.message_id) {
                        self.slots.remove(&id);
                    }
                }
                Undo::Changed { slot, previous } => self.messages[slot] = *previous,
                Undo::Truncate { slot, delta_path, len, metadata, block_id, thread_id } => {
                    let state = &mut self.messages[slot];
                    let segments = segments(delta_path.as_deref(), &state.kind);
                    if let Some((first, rest)) = segments.split_first() {
                        match state.props.get_mut(*first).and_then(|v| path::get_mut(v, rest)) {
                            Some(Value::String(text)) => text.truncate(len),
                            Some(Value::Array(items)) => items.truncate(len),
                            _ => {}
                        }
                    }
                    state.metadata = metadata;
                    if let Some(block_id) = block_id {
                        state.block_id = block_id;
                    }
                    if let Some(thread_id) = thread_id {
                        state.thread_id = thread_id;
                    }
                }
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
pub(crate) fn delta_segments(message: &OutputMessage) -> Segments<'_> {
    segments(message.delta_path.as_deref(), &message.kind)
}

/// The segments of `delta_path`, or of the main field of `kind` when there is none.
fn segments<'a>(delta_path: Option<&'a str>, kind: &str) -> Segments<'a> {
    match delta_path {
        Some("") => Segments::Many(Vec::new()),
        Some(path) if !path.contains('.') => Segments::One([path]),
        Some(path) => Segments::Many(path.split('.').collect()),
        None => match main_field(kind) {
            Some(field) => Segments::One([field]),
            None => Segments::Many(Vec::new()),
        },
    }
}

/// A delta's path as segments; one segment (the main field, the common case) needs no allocation.
pub(crate) enum Segments<'a> {
    One([&'a str; 1]),
    Many(Vec<&'a str>),
}

impl<'a> std::ops::Deref for Segments<'a> {
    type Target = [&'a str];

    fn deref(&self) -> &[&'a str] {
        match self {
            Segments::One(one) => one,
            Segments::Many(many) => many,
        }
    }
}

/// A delta's action: its own, or `append`, except on the whole props, where appending means nothing: merge.
fn resolved_action(delta: &OutputMessage, segments: &[&str]) -> DeltaAction {
    delta.delta_action.unwrap_or(if segments.is_empty() { DeltaAction::Merge } else { DeltaAction::Append })
}

/// How to take back `delta` on `state` without copying the message: for an append to a string or an array
/// (the way text and arguments stream), the length before it. `None` when only a copy will do.
fn cheap_undo(slot: usize, state: &OutputMessage, delta: &OutputMessage) -> Option<Undo> {
    let segments = delta_segments(delta);
    if !delta.delta || delta.kind != state.kind || resolved_action(delta, &segments) != DeltaAction::Append {
        return None;
    }
    let (first, rest) = segments.split_first()?;
    let len = match path::get(state.props.get(*first)?, rest)? {
        Value::String(text) => text.len(),
        Value::Array(items) => items.len(),
        _ => return None,
    };
    // What the apply will change, and only that (see `apply_delta`).
    let changed = |new: &Option<String>, old: &Option<String>| (new.is_some() && new != old).then(|| old.clone());
    Some(Undo::Truncate {
        slot,
        delta_path: delta.delta_path.clone(),
        len,
        metadata: state.metadata.clone(),
        block_id: changed(&delta.block_id, &state.block_id),
        thread_id: changed(&delta.thread_id, &state.thread_id),
    })
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
    let action = resolved_action(delta, &segments);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(value: serde_json::Value) -> OutputMessage {
        serde_json::from_value(value).expect("message")
    }

    /// Logged applies of every kind, rolled back, leave exactly the state before them.
    #[test]
    fn rollback_restores_the_state_before() {
        let mut reducer = Reducer::default();
        reducer.apply(&message(json!({"type": "text", "props": {"content": "ab"}, "message_id": "t"}))).expect("t");
        let list = json!({"type": "event", "props": {"event": "e", "data": {"items": [1]}}, "message_id": "e"});
        reducer.apply(&message(list)).expect("e");
        let before: Vec<OutputMessage> = reducer.messages().to_vec();
        let mut undo = Vec::new();
        let batch = [
            json!({"type": "text", "props": {"content": "cd"}, "message_id": "t", "delta": true,
                "metadata": {"sequence": 9}, "block_id": "b"}),
            json!({"type": "event", "props": {"data": {"items": [2, 3]}}, "message_id": "e", "delta": true,
                "delta_path": "data.items"}),
            json!({"type": "event", "props": {"data": {"x": 1}}, "message_id": "e", "delta": true,
                "delta_action": "merge", "delta_path": "data"}),
            json!({"type": "text", "props": {"content": "new"}, "message_id": "n"}),
            json!({"type": "loading", "props": {"message": "z"}, "message_id": "t", "delta": true,
                "type_change": true, "delta_action": "replace", "delta_path": ""}),
            json!({"type": "loading", "props": {"message": "!"}, "message_id": "t", "delta": true}),
        ];
        for delta in batch {
            reducer.apply_logged(&message(delta), &mut undo).expect("applies");
        }
        assert!(undo.iter().any(|u| matches!(u, Undo::Truncate { .. })), "appends take the cheap path");
        assert_ne!(reducer.messages(), &before[..]);
        reducer.rollback(undo);
        assert_eq!(reducer.messages(), &before[..]);
        assert!(reducer.get("n").is_none());
    }
}
