//! Validation of a message a producer sends, with errors that name the field.
//!
//! The rules are a table per built-in type (field, kind, required), not code per type: one mechanism checks
//! them all, and a test checks the table against the typed props in `props.rs`. A full message must carry
//! every required prop; a delta carries only what it changes, so for a delta only the props present are
//! checked. Unknown props are allowed (a producer may add its own); custom types are not checked beyond
//! having a type.
//!
//! The methods that parse and check a message ([`OutputMessage::from_json`], [`OutputMessage::from_value`],
//! [`OutputMessage::validate`]) are defined here rather than in `message.rs`, so that the message type
//! depends on nothing of its validation.
//!
//! # Names
//!
//! Every string a producer gives that is a name or an id rather than content is at most [`NAME_BYTES`]
//! bytes of UTF-8: the `type` (a custom type's name too), `message_id`, `chunk_id`, `block_id`,
//! `thread_id`, `delta_path` and `metadata.trace_id`, and the built-in props that name something
//! (`tool_call`'s `id` and `name`, `tool_result`'s `call_id` and `name`, `action`'s `name`, `event`'s `event`, `error`'s `code`, `file`'s `name`
//! and `mime`, `audio`'s and `video`'s `format`). Names are what the stream and the adapters copy: into
//! the lifecycle events that open and close a message or block, into every OpenAI chunk (a stream's model
//! name), into a tool call's header. Bounding them bounds those copies, and lets a stream reserve room for
//! the events that close what is open (see `hub/stream/closing.rs`). Content (text, arguments, URLs, alt text, and
//! every key and value of free-form objects such as `data`, `details`, `payload` or a custom type's props)
//! is bounded only by the message size limit.
//!
//! # Lifecycle events
//!
//! The `event` messages named `stream_start`, `stream_end`, `message_start`, `message_end`, `block_start`
//! and `block_end` are the stream's own (`lifecycle.rs`): a CUI reader takes `stream_end` as the end, the
//! adapters close a message at its `message_end`, and a restart rebuilds what is open from them. A producer's
//! message is refused when it would be one ([`ValidationError::Reserved`], `props.event`), whether it is
//! whole, a delta or a `type_change`, and so is a delta that would spell one by appending to an event's name.
//! Every producer's message passes here (an HTTP append, a WebSocket `publish`, a Rust agent's `Output`, a
//! replay), so no path can append one.
//!
//! The error code `lagged` is the service's likewise: it tells a reader that its history is gone and where
//! to resume, and in the formats without sequences (OpenAI, AG-UI, Anthropic, Responses) the clients know it
//! only by that code. So an `error` message whose `props.code` is `lagged` ([`LAGGED`]; a delta or a
//! `type_change` too) and an outcome whose `error.code` is `lagged` are refused as reserved.

use serde::Deserialize;
use serde_json::Value;

use super::message::{DeltaAction, OutputMessage};

/// The most bytes (as UTF-8) of a name or an id a producer gives: see the module doc. A stream's model name
/// is bounded by it too.
pub const NAME_BYTES: usize = 256;

/// Why a producer's message was refused. [`ValidationError::field`] names the field for an error envelope's
/// `param`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// Not JSON, or not a JSON object.
    #[error("invalid JSON: {0}")]
    Syntax(String),
    /// A required field is absent.
    #[error("{field} is required")]
    Missing {
        /// e.g. `props.url`
        field: String,
    },
    /// A field has the wrong JSON type or an unknown value.
    #[error("{field} must be {expected}")]
    WrongType {
        /// e.g. `props.width`
        field: String,
        /// e.g. `a non-negative integer`
        expected: String,
    },
    /// A media URL that is not http(s) or `data:`.
    #[error("{field} must be an http(s) or data: URL, got {found:?}")]
    Url {
        /// e.g. `props.url`
        field: String,
        /// The value, cut to 100 characters.
        found: String,
    },
    /// The name of a lifecycle event (`stream_end`, ...) or the error code `lagged`: the stream sends those
    /// itself, and its readers trust them.
    #[error("{field} is {found:?}, which only the stream itself sends: its readers trust it")]
    Reserved {
        /// `props.event`, `props.code` or `error.code`
        field: String,
        /// The name.
        found: String,
    },
    /// A name or an id over [`NAME_BYTES`].
    #[error("{field} is {size} bytes long, over the limit of {limit} bytes for a name or an id")]
    TooLong {
        /// e.g. `message_id`, `props.name`
        field: String,
        /// Its length in bytes.
        size: usize,
        /// The limit.
        limit: usize,
    },
}

impl ValidationError {
    /// The offending field, as a path into the message (`props.url`, `delta_action`).
    pub fn field(&self) -> Option<&str> {
        match self {
            ValidationError::Syntax(_) => None,
            ValidationError::Missing { field }
            | ValidationError::WrongType { field, .. }
            | ValidationError::Url { field, .. }
            | ValidationError::Reserved { field, .. }
            | ValidationError::TooLong { field, .. } => Some(field),
        }
    }

    /// The code an error envelope gives it: `string_above_max_length` for a name over its limit (OpenAI's
    /// code for a string too long), `invalid_message` otherwise.
    pub fn code(&self) -> &'static str {
        match self {
            ValidationError::TooLong { .. } => "string_above_max_length",
            _ => "invalid_message",
        }
    }

    pub(crate) fn from_serde(err: serde_path_to_error::Error<serde_json::Error>) -> Self {
        let field = err.path().to_string();
        let not_data = !err.inner().is_data();
        let inner = err.into_inner().to_string();
        if not_data || field == "." || field.is_empty() {
            ValidationError::Syntax(inner)
        } else {
            // serde says e.g. "unknown variant `push`, expected one of `append`, ..." or "invalid type: ...".
            let expected = inner.split(" at line ").next().unwrap_or(&inner).to_owned();
            ValidationError::WrongType { field, expected: format!("valid ({expected})") }
        }
    }
}

/// What a prop must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    String,
    Bool,
    Number,
    Count,
    Object,
    Url,
    OneOf(&'static [&'static str]),
    /// A string of at most [`NAME_BYTES`].
    Name,
    Any,
}

impl Kind {
    fn expected(self) -> String {
        match self {
            Kind::String | Kind::Name => "a string".into(),
            Kind::Bool => "a boolean".into(),
            Kind::Number => "a number".into(),
            Kind::Count => "a non-negative integer".into(),
            Kind::Object => "an object".into(),
            Kind::Url => "a URL string".into(),
            Kind::OneOf(values) => format!("one of {}", values.join(", ")),
            Kind::Any => "any JSON value".into(),
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            Kind::String | Kind::Url | Kind::Name => value.is_string(),
            Kind::Bool => value.is_boolean(),
            Kind::Number => value.is_number(),
            Kind::Count => value.is_u64(),
            Kind::Object => value.is_object(),
            Kind::OneOf(values) => value.as_str().is_some_and(|s| values.contains(&s)),
            Kind::Any => true,
        }
    }
}

/// One prop of a built-in type.
pub(crate) struct Field {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) required: bool,
}

const fn req(name: &'static str, kind: Kind) -> Field {
    Field { name, kind, required: true }
}

const fn opt(name: &'static str, kind: Kind) -> Field {
    Field { name, kind, required: false }
}

const TEXT: &[Field] = &[req("content", Kind::String)];
const LOADING: &[Field] = &[req("message", Kind::String), opt("done", Kind::Bool)];
const TOOL_CALL: &[Field] =
    &[req("id", Kind::Name), req("name", Kind::Name), opt("arguments", Kind::String), opt("server_side", Kind::Bool)];
const TOOL_RESULT: &[Field] =
    &[req("call_id", Kind::Name), opt("name", Kind::Name), opt("result", Kind::Any), opt("error", Kind::Object)];
const ERROR: &[Field] = &[req("message", Kind::String), opt("code", Kind::Name), opt("details", Kind::Any)];
const IMAGE: &[Field] = &[
    req("url", Kind::Url),
    opt("alt", Kind::String),
    opt("width", Kind::Count),
    opt("height", Kind::Count),
    opt("detail", Kind::OneOf(&["auto", "low", "high"])),
];
const AUDIO: &[Field] = &[
    req("url", Kind::Url),
    opt("format", Kind::Name),
    opt("duration", Kind::Number),
    opt("transcript", Kind::String),
    opt("autoplay", Kind::Bool),
    opt("controls", Kind::Bool),
];
const VIDEO: &[Field] = &[
    req("url", Kind::Url),
    opt("format", Kind::Name),
    opt("duration", Kind::Number),
    opt("thumbnail", Kind::Url),
    opt("width", Kind::Count),
    opt("height", Kind::Count),
    opt("autoplay", Kind::Bool),
    opt("controls", Kind::Bool),
    opt("loop", Kind::Bool),
];
const FILE: &[Field] =
    &[req("url", Kind::Url), opt("name", Kind::Name), opt("mime", Kind::Name), opt("size", Kind::Count)];
const ACTION: &[Field] = &[req("name", Kind::Name), opt("payload", Kind::Object)];
const EVENT: &[Field] = &[req("event", Kind::Name), opt("message", Kind::String), opt("data", Kind::Object)];

/// The props of each built-in type; `None` for a custom type.
pub(crate) fn schema(kind: &str) -> Option<&'static [Field]> {
    Some(match kind {
        "text" | "thinking" => TEXT,
        "loading" => LOADING,
        "tool_call" => TOOL_CALL,
        "tool_result" => TOOL_RESULT,
        "error" => ERROR,
        "image" => IMAGE,
        "audio" => AUDIO,
        "video" => VIDEO,
        "file" => FILE,
        "action" => ACTION,
        "event" => EVENT,
        _ => return None,
    })
}

/// Checks that a name or an id (`field` names it) is at most [`NAME_BYTES`] long.
///
/// ```
/// use agentmux::output::{NAME_BYTES, check_name};
///
/// assert!(check_name("model", "demo").is_ok());
/// let error = check_name("model", &"x".repeat(NAME_BYTES + 1)).unwrap_err();
/// assert_eq!((error.field(), error.code()), (Some("model"), "string_above_max_length"));
/// ```
pub fn check_name(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.len() > NAME_BYTES {
        return Err(ValidationError::TooLong { field: field.to_owned(), size: value.len(), limit: NAME_BYTES });
    }
    Ok(())
}

/// The message's own names and ids, each with its field.
fn names(message: &OutputMessage) -> [(&'static str, Option<&str>); 7] {
    [
        ("type", Some(message.kind.as_str())),
        ("message_id", message.message_id.as_deref()),
        ("chunk_id", message.chunk_id.as_deref()),
        ("block_id", message.block_id.as_deref()),
        ("thread_id", message.thread_id.as_deref()),
        ("delta_path", message.delta_path.as_deref()),
        ("metadata.trace_id", message.metadata.as_ref().and_then(|m| m.trace_id.as_deref())),
    ]
}

pub(crate) fn validate(message: &OutputMessage) -> Result<(), ValidationError> {
    if message.kind.is_empty() {
        return Err(ValidationError::Missing { field: "type".into() });
    }
    for (field, value) in names(message) {
        if let Some(value) = value {
            check_name(field, value)?;
        }
    }
    not_lifecycle(message)?;
    not_lagged(message)?;
    let Some(fields) = schema(&message.kind) else {
        return Ok(());
    };
    for field in fields {
        let path = || format!("props.{}", field.name);
        match message.props.get(field.name) {
            None | Some(Value::Null) if field.required && !message.delta => {
                return Err(ValidationError::Missing { field: path() });
            }
            None | Some(Value::Null) => {}
            Some(value) if !field.kind.accepts(value) => {
                return Err(ValidationError::WrongType { field: path(), expected: field.kind.expected() });
            }
            Some(Value::String(url)) if field.kind == Kind::Url && !is_media_url(url) => {
                return Err(ValidationError::Url { field: path(), found: url.chars().take(100).collect() });
            }
            Some(Value::String(name)) if field.kind == Kind::Name => check_name(&path(), name)?,
            Some(_) => {}
        }
    }
    Ok(())
}

/// The error code of the notice a reader gets when its history is gone (see the module doc).
pub(crate) const LAGGED: &str = "lagged";

/// The names of the lifecycle events (`lifecycle.rs`, whose test checks this list against its types): the
/// stream's own, which readers, adapters and a restart trust.
pub(crate) const LIFECYCLE_NAMES: [&str; 6] =
    ["stream_start", "stream_end", "message_start", "message_end", "block_start", "block_end"];

/// Refuses a lifecycle event from a producer: an `event` message (whole or a delta, `type_change` included)
/// whose `props.event` is a lifecycle name, and a delta that appends to an event's name, which could spell
/// one piece by piece (a name is given whole: `replace` or `set` it). See the module doc, "Lifecycle events".
fn not_lifecycle(message: &OutputMessage) -> Result<(), ValidationError> {
    if message.kind != "event" {
        return Ok(());
    }
    let name = message.props.get("event").and_then(Value::as_str);
    if let Some(name) = name.filter(|name| LIFECYCLE_NAMES.contains(name)) {
        return Err(ValidationError::Reserved { field: "props.event".into(), found: name.to_owned() });
    }
    let appends = !matches!(message.delta_action, Some(DeltaAction::Replace | DeltaAction::Set));
    if message.delta && message.delta_path.as_deref() == Some("event") && appends {
        return Err(ValidationError::WrongType {
            field: "delta_action".into(),
            expected: "replace or set on an event's name, which is given whole".into(),
        });
    }
    Ok(())
}

/// Refuses the `lagged` code on a producer's `error` message, whole or as a delta, and a delta that appends
/// to an error's code, which could spell it piece by piece (a code is given whole: `replace` or `set` it).
fn not_lagged(message: &OutputMessage) -> Result<(), ValidationError> {
    if message.kind != "error" {
        return Ok(());
    }
    if message.props.get("code").and_then(Value::as_str) == Some(LAGGED) {
        return Err(ValidationError::Reserved { field: "props.code".into(), found: LAGGED.into() });
    }
    let appends = !matches!(message.delta_action, Some(DeltaAction::Replace | DeltaAction::Set));
    if message.delta && message.delta_path.as_deref() == Some("code") && appends {
        return Err(ValidationError::WrongType {
            field: "delta_action".into(),
            expected: "replace or set on an error's code, which is given whole".into(),
        });
    }
    Ok(())
}

/// An absolute http(s) URL with a host, or a `data:` URL.
pub(crate) fn is_media_url(text: &str) -> bool {
    match url::Url::parse(text) {
        Ok(url) => match url.scheme() {
            "http" | "https" => url.host_str().is_some_and(|h| !h.is_empty()),
            "data" => url.path().contains(','),
            _ => false,
        },
        Err(_) => false,
    }
}

/// Parsing and validation are methods of the message, defined here so that the message's own file needs
/// nothing of validation.
impl OutputMessage {
    /// Parses and validates a message a producer sent.
    ///
    /// A wrong-typed top-level field or an unknown `delta_action` names that field; a missing or wrong
    /// prop names it as `props.<name>`.
    pub fn from_json(text: &str) -> Result<Self, ValidationError> {
        if !text.trim_start().starts_with('{') {
            return Err(ValidationError::Syntax("a message must be a JSON object".into()));
        }
        // The common case parses once; only a failure parses again to learn the path of the bad field.
        let message: OutputMessage = match serde_json::from_str(text) {
            Ok(message) => message,
            Err(_) => {
                let mut de = serde_json::Deserializer::from_str(text);
                let message = serde_path_to_error::deserialize(&mut de).map_err(ValidationError::from_serde)?;
                de.end().map_err(|e| ValidationError::Syntax(e.to_string()))?;
                message
            }
        };
        message.validate()?;
        Ok(message)
    }

    /// Parses and validates a message already decoded as JSON.
    pub fn from_value(value: Value) -> Result<Self, ValidationError> {
        if !value.is_object() {
            return Err(ValidationError::Syntax("a message must be a JSON object".into()));
        }
        let message = match OutputMessage::deserialize(&value) {
            Ok(message) => message,
            Err(_) => serde_path_to_error::deserialize(&value).map_err(ValidationError::from_serde)?,
        };
        message.validate()?;
        Ok(message)
    }

    /// Checks a message a producer sends: a type, built-in props of the right types (all required ones
    /// unless the message is a delta), media URLs that are http(s) or `data:`.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::props::*;
    use crate::output::{BuiltinProps, builtin_types};
    use serde_json::json;

    /// Every field of every typed props struct is in the table, and every table field is in the struct.
    #[test]
    fn schema_matches_typed_props() {
        fn keys<P: BuiltinProps>(full: serde_json::Value) -> (&'static str, Vec<String>) {
            let props: P = serde_json::from_value(full).expect("test props parse");
            let value = serde_json::to_value(props).expect("serialise");
            (P::TYPE, value.as_object().expect("object").keys().cloned().collect())
        }
        let url = "https://example.com/x";
        let all = [
            keys::<TextProps>(json!({"content": "a"})),
            keys::<ThinkingProps>(json!({"content": "a"})),
            keys::<LoadingProps>(json!({"message": "a", "done": true})),
            keys::<ToolCallProps>(json!({"id": "c", "name": "f", "arguments": "{}", "server_side": true})),
            keys::<ToolResultProps>(json!({"call_id": "c", "name": "f", "result": 1, "error": {"message": "m"}})),
            keys::<ErrorProps>(json!({"message": "m", "code": "c", "details": "d"})),
            keys::<ImageProps>(json!({"url": url, "alt": "a", "width": 1, "height": 1, "detail": "low"})),
            keys::<AudioProps>(json!({"url": url, "format": "mp3", "duration": 1.5, "transcript": "t",
                "autoplay": true, "controls": true})),
            keys::<VideoProps>(json!({"url": url, "format": "mp4", "duration": 1.5, "thumbnail": url,
                "width": 1, "height": 1, "autoplay": true, "controls": true, "loop": true})),
            keys::<FileProps>(json!({"url": url, "name": "n", "mime": "m", "size": 1})),
            keys::<ActionProps>(json!({"name": "n", "payload": {}})),
            keys::<EventProps>(json!({"event": "e", "message": "m", "data": {}})),
        ];
        assert_eq!(all.iter().map(|(t, _)| *t).collect::<Vec<_>>(), builtin_types());
        for (kind, struct_keys) in all {
            let table: Vec<&str> = schema(kind).expect("builtin").iter().map(|f| f.name).collect();
            assert_eq!(struct_keys, table, "{kind}");
        }
    }

    fn check(message: serde_json::Value) -> Result<(), ValidationError> {
        OutputMessage::from_value(message).map(|_| ())
    }

    #[test]
    fn names_the_field() {
        let cases = [
            (json!({"type": "image", "props": {}}), "props.url"),
            (json!({"type": "image", "props": {"url": 3}}), "props.url"),
            (json!({"type": "image", "props": {"url": "ftp://x/y"}}), "props.url"),
            (json!({"type": "image", "props": {"url": "/relative.png"}}), "props.url"),
            (json!({"type": "image", "props": {"url": "https://x/y", "width": -1}}), "props.width"),
            (json!({"type": "image", "props": {"url": "https://x/y", "detail": "ultra"}}), "props.detail"),
            (
                json!({"type": "video", "props": {"url": "https://x/y", "thumbnail": "javascript:alert(1)"}}),
                "props.thumbnail",
            ),
            (json!({"type": "text", "props": {"content": 5}}), "props.content"),
            (json!({"type": "text", "props": {}}), "props.content"),
            (json!({"type": "tool_call", "props": {"id": "c", "arguments": "{}"}}), "props.name"),
            (json!({"type": "action", "props": {"name": "x", "payload": [1]}}), "props.payload"),
            (json!({"type": "text", "props": {"content": "a"}, "delta_action": "push"}), "delta_action"),
            (json!({"type": "text", "props": {"content": "a"}, "delta": "yes"}), "delta"),
            (json!({"props": {"content": "a"}}), "type"),
            (json!({"type": "text", "props": ["a"]}), "props"),
            (json!({"type": "text", "props": {"content": "a"}, "metadata": {"sequence": "one"}}), "metadata.sequence"),
        ];
        for (message, field) in cases {
            let err = check(message.clone()).expect_err(&message.to_string());
            assert_eq!(err.field(), Some(field), "{message}: {err}");
        }
    }

    #[test]
    fn names_and_ids_are_bounded_and_content_is_not() {
        let long = "n".repeat(NAME_BYTES + 1);
        let text = || json!({"type": "text", "props": {"content": "a"}});
        let with = |key: &str| {
            let mut message = text();
            message[key] = json!(long);
            message
        };
        let cases = [
            (json!({"type": long, "props": {}}), "type"),
            (with("message_id"), "message_id"),
            (with("chunk_id"), "chunk_id"),
            (with("block_id"), "block_id"),
            (with("thread_id"), "thread_id"),
            (with("delta_path"), "delta_path"),
            (json!({"type": "text", "props": {"content": "a"}, "metadata": {"trace_id": long}}), "metadata.trace_id"),
            (json!({"type": "tool_call", "props": {"id": long, "name": "f"}}), "props.id"),
            (json!({"type": "tool_call", "props": {"id": "c", "name": long}}), "props.name"),
            (json!({"type": "action", "props": {"name": long}}), "props.name"),
            (json!({"type": "event", "props": {"event": long}}), "props.event"),
            (json!({"type": "error", "props": {"message": "m", "code": long}}), "props.code"),
            (json!({"type": "file", "props": {"url": "https://x/y", "mime": long}}), "props.mime"),
            (json!({"type": "audio", "props": {"url": "https://x/y", "format": long}}), "props.format"),
            (json!({"type": "tool_call", "props": {"name": long}, "delta": true, "message_id": "t"}), "props.name"),
        ];
        for (message, field) in cases {
            let err = check(message.clone()).expect_err(field);
            assert_eq!(err.field(), Some(field), "{err}");
            assert_eq!(err.code(), "string_above_max_length", "{err}");
        }
        // Exactly at the limit (in bytes: é is two), and content of any length, pass.
        let at_limit = "é".repeat(NAME_BYTES / 2);
        let huge = "c".repeat(4 * NAME_BYTES);
        let ok = [
            json!({"type": "text", "props": {"content": huge}, "message_id": at_limit}),
            json!({"type": "tool_call", "props": {"id": "c", "name": at_limit, "arguments": huge}}),
            json!({"type": "event", "props": {"event": "e", "message": huge, "data": {huge.clone(): huge}}}),
            json!({"type": "chart", "props": {huge.clone(): huge}}),
            json!({"type": "error", "props": {"message": huge, "details": {huge.clone(): 1}}}),
        ];
        for message in ok {
            check(message).unwrap_or_else(|e| panic!("{e}"));
        }
        let err = check(json!({"type": "text", "props": {"content": "a"}, "message_id": "é".repeat(NAME_BYTES)}))
            .expect_err("bytes, not characters");
        assert_eq!(
            err.to_string(),
            format!("message_id is {} bytes long, over the limit of 256 bytes for a name or an id", 2 * NAME_BYTES)
        );
    }

    #[test]
    fn lifecycle_events_are_the_streams_own() {
        for name in LIFECYCLE_NAMES {
            let cases = [
                json!({"type": "event", "props": {"event": name}}),
                json!({"type": "event", "props": {"event": name, "data": {}}, "message_id": "e", "delta": true,
                    "delta_action": "merge"}),
                json!({"type": "event", "props": {"event": name}, "message_id": "e", "delta": true,
                    "delta_path": "event", "delta_action": "replace"}),
                json!({"type": "event", "props": {"event": name}, "message_id": "t", "delta": true,
                    "type_change": true, "delta_path": "", "delta_action": "replace"}),
            ];
            for message in cases {
                let error = check(message.clone()).expect_err(&message.to_string());
                assert_eq!((error.field(), error.code()), (Some("props.event"), "invalid_message"), "{message}");
                assert!(error.to_string().contains(name), "{error}");
            }
        }
        // A name spelt piece by piece could become one: appending to an event's name is refused.
        let append = json!({"type": "event", "props": {"event": "_end"}, "message_id": "e", "delta": true,
            "delta_path": "event"});
        assert_eq!(check(append).expect_err("append").field(), Some("delta_action"));
        // Any other name, whole or replaced, and other types that say the words, are the producer's.
        let ok = [
            json!({"type": "event", "props": {"event": "progress", "data": {"event": "stream_end"}}}),
            json!({"type": "event", "props": {"event": "stream_ended"}}),
            json!({"type": "event", "props": {"event": "progress"}, "message_id": "e", "delta": true,
                "delta_path": "event", "delta_action": "set"}),
            json!({"type": "event", "props": {"data": {"step": 2}}, "message_id": "e", "delta": true}),
            json!({"type": "action", "props": {"name": "stream_end"}}),
            json!({"type": "stream_end", "props": {"event": "stream_end"}}),
        ];
        for message in ok {
            check(message.clone()).unwrap_or_else(|e| panic!("{message}: {e}"));
        }
    }

    #[test]
    fn accepts_valid_and_partial_deltas() {
        let ok = [
            json!({"type": "image", "props": {"url": "data:image/png;base64,iVBORw0KGgo="}}),
            json!({"type": "image", "props": {"url": "HTTPS://Example.com/a.png", "alt": "a"}}),
            json!({"type": "chart", "props": {"anything": [1, 2]}}),
            json!({"type": "tool_call", "props": {"arguments": "{\"a\""}, "delta": true, "message_id": "t"}),
            json!({"type": "text", "props": {"content": "x", "extra": true}}),
            json!({"type": "error", "props": {"message": "m", "details": {"retry": false}}}),
        ];
        for message in ok {
            check(message.clone()).unwrap_or_else(|e| panic!("{message}: {e}"));
        }
    }

    #[test]
    fn syntax_errors_have_no_field() {
        let err = OutputMessage::from_json("{\"type\": ").expect_err("truncated");
        assert_eq!(err.field(), None);
        let err = OutputMessage::from_json("[1]").expect_err("array");
        assert_eq!(err.field(), None);
        let err =
            OutputMessage::from_json("{\"type\":\"text\",\"props\":{\"content\":\"a\"}} x").expect_err("trailing");
        assert_eq!(err.field(), None);
    }
}
