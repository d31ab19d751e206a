//! [`Output`]: the handle an agent emits through (`docs/design.md`, "Typed output"), and [`StreamingMessage`] for a message
//! that arrives in deltas.
//!
//! An `Output` is an `Arc` to its stream plus the block and thread its messages belong to, so it is cheap to
//! clone and safe to use from several tasks: the stream orders concurrent emits. Every emit returns the
//! sequence the message got, or the [`AppendError`] that refused it (the stream ended, a limit, an invalid
//! message). A subscriber going away changes nothing here; a cancel fires [`Output::cancelled`] and ends the
//! stream, after which emits return [`AppendError::Ended`].

use std::sync::Arc;

use serde_json::{Map, Value};
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::hub::{AppendError, Stream};
use crate::output::{DeltaAction, OutputMessage, ToolError, main_field};

/// Where an agent's messages go; see the module doc.
#[derive(Debug, Clone)]
pub struct Output {
    stream: Arc<Stream>,
    block_id: Option<String>,
    thread_id: Option<String>,
}

impl Output {
    /// An output onto `stream`.
    pub fn new(stream: Arc<Stream>) -> Self {
        Output { stream, block_id: None, thread_id: None }
    }

    /// The stream this output appends to.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// Sends any message, built-in or custom; it joins this output's block and thread unless it names its own.
    pub fn send(&self, mut message: OutputMessage) -> Result<u64, AppendError> {
        if message.block_id.is_none() {
            message.block_id.clone_from(&self.block_id);
        }
        if message.thread_id.is_none() {
            message.thread_id.clone_from(&self.thread_id);
        }
        self.stream.append(message)
    }

    /// Sends `text`.
    pub fn text(&self, content: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::text(content))
    }

    /// Sends `thinking`.
    pub fn thinking(&self, content: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::thinking(content))
    }

    /// Sends `loading`. To mark it done later, use [`Output::start`] and `set("done", true)`.
    pub fn loading(&self, message: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::loading(message))
    }

    /// Sends a complete `tool_call` (`arguments` is JSON text).
    pub fn tool_call(
        &self,
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Result<u64, AppendError> {
        self.send(OutputMessage::tool_call(id, name, arguments))
    }

    /// Sends the `tool_result` of a call the agent ran: what the tool `name` returned for the call `call_id`.
    pub fn tool_result(
        &self,
        call_id: impl Into<String>,
        name: impl Into<String>,
        result: Value,
    ) -> Result<u64, AppendError> {
        self.send(OutputMessage::tool_result(call_id, name, result))
    }

    /// Sends the `tool_result` of a call the agent ran that failed.
    pub fn tool_failure(
        &self,
        call_id: impl Into<String>,
        name: impl Into<String>,
        error: ToolError,
    ) -> Result<u64, AppendError> {
        self.send(OutputMessage::tool_failure(call_id, name, error))
    }

    /// Sends `error` (the run goes on; return an error from the agent to end it).
    pub fn error(&self, message: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::error(message))
    }

    /// Sends `image`; for alt text and sizes send `ImageProps` through [`Output::send`].
    pub fn image(&self, url: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::image(url))
    }

    /// Sends `audio`.
    pub fn audio(&self, url: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::audio(url))
    }

    /// Sends `video`.
    pub fn video(&self, url: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::video(url))
    }

    /// Sends `file`.
    pub fn file(&self, url: impl Into<String>) -> Result<u64, AppendError> {
        self.send(OutputMessage::file(url))
    }

    /// Sends `action` with a payload (`Value::Null` for none).
    pub fn action(&self, name: impl Into<String>, payload: Value) -> Result<u64, AppendError> {
        self.send(with_object(OutputMessage::action(name), "payload", payload))
    }

    /// Sends `event` with data (`Value::Null` for none).
    pub fn event(&self, event: impl Into<String>, data: Value) -> Result<u64, AppendError> {
        self.send(with_object(OutputMessage::event(event), "data", data))
    }

    /// A text message that streams in deltas; nothing is sent until its first `append`.
    pub fn stream_text(&self) -> StreamingMessage {
        self.streaming("text", Map::new())
    }

    /// A thinking message that streams in deltas.
    pub fn stream_thinking(&self) -> StreamingMessage {
        self.streaming("thinking", Map::new())
    }

    /// A tool call handed to the client, whose arguments stream in deltas; its first chunk carries `id` and
    /// `name`. OpenAI clients receive it as `tool_calls`, and the run should then end (the client runs it).
    pub fn stream_tool_call(&self, id: impl Into<String>, name: impl Into<String>) -> StreamingMessage {
        self.streaming("tool_call", tool_call_props(id.into(), name.into(), false))
    }

    /// A tool call the agent runs itself (`server_side: true`), whose arguments stream in deltas; answer it
    /// with [`Output::tool_result`]. OpenAI clients never receive it as `tool_calls`.
    pub fn stream_server_tool_call(&self, id: impl Into<String>, name: impl Into<String>) -> StreamingMessage {
        self.streaming("tool_call", tool_call_props(id.into(), name.into(), true))
    }

    /// Sends `message` now as the first chunk of a message that will change (a loading that turns done, a
    /// progress action), and returns its handle.
    pub fn start(&self, mut message: OutputMessage) -> Result<StreamingMessage, AppendError> {
        let id = message.message_id.clone().unwrap_or_else(|| self.stream.new_id("m"));
        message.message_id = Some(id.clone());
        message.delta = true;
        let kind = message.kind.clone();
        self.send(message)?;
        Ok(StreamingMessage { output: self.clone(), message_id: id, kind, first: None })
    }

    fn streaming(&self, kind: &str, first: Map<String, Value>) -> StreamingMessage {
        StreamingMessage {
            output: self.clone(),
            message_id: self.stream.new_id("m"),
            kind: kind.into(),
            first: Some(first),
        }
    }

    /// An output whose messages form a new block (a step): `block_start` comes before its first message,
    /// `block_end` with [`Output::end_block`] or when the stream ends.
    pub fn begin_block(&self) -> Output {
        Output { block_id: Some(self.stream.new_id("b")), ..self.clone() }
    }

    /// Ends this output's block (and its open messages); `Ok(None)` when it has none or it never started.
    pub fn end_block(&self) -> Result<Option<u64>, AppendError> {
        match &self.block_id {
            Some(block) => self.stream.end_block(block),
            None => Ok(None),
        }
    }

    /// An output for a sub-agent: its messages carry `thread_id`.
    pub fn thread(&self, thread_id: impl Into<String>) -> Output {
        Output { thread_id: Some(thread_id.into()), ..self.clone() }
    }

    /// Completes when someone cancels the stream.
    pub fn cancelled(&self) -> WaitForCancellationFutureOwned {
        self.stream.cancellation().cancelled_owned()
    }

    /// Waits until the message `sequence` (what an emit returned) is kept: at once in memory, once committed
    /// with the store. For an agent that must not go on before what it said would survive a crash. False when
    /// the store could not keep it (its disk failed).
    pub async fn kept(&self, sequence: u64) -> bool {
        self.stream.readable(sequence).await
    }

    /// True once someone cancelled the stream, or it was stopped for the agent (a shutdown, an idle timeout,
    /// a store that failed). Already true when an emit is refused because such an end came first, so an
    /// agent can tell a cancel from a failure.
    pub fn is_cancelled(&self) -> bool {
        self.stream.cancellation().is_cancelled()
    }
}

/// Sets `key` to `value` unless it is null.
fn with_object(message: OutputMessage, key: &str, value: Value) -> OutputMessage {
    if value.is_null() { message } else { message.with_prop(key, value) }
}

/// A message that streams in deltas: text, thinking, tool-call arguments, or anything started with
/// [`Output::start`].
///
/// ```
/// use agentmux::agent::Output;
/// use agentmux::hub::Hub;
///
/// let hub = Hub::default();
/// let output = Output::new(hub.create("demo").unwrap());
/// let mut text = output.stream_text();
/// text.append("Hello").unwrap();
/// text.append(", world").unwrap();
/// text.replace("Hello, everyone").unwrap();
/// text.end().unwrap();
/// let state = output.stream().snapshot();
/// assert!(state.messages.iter().any(|m| m.prop_str("content") == Some("Hello, everyone")));
/// ```
#[derive(Debug)]
pub struct StreamingMessage {
    output: Output,
    message_id: String,
    kind: String,
    /// Props for the first chunk, until it is sent.
    first: Option<Map<String, Value>>,
}

impl StreamingMessage {
    /// The message's id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Appends text to the main field (`content`, `message`, `arguments`; `content` for a custom type).
    pub fn append(&mut self, text: impl Into<String>) -> Result<u64, AppendError> {
        self.at_main(DeltaAction::Append, text.into())
    }

    /// Replaces the main field's text.
    pub fn replace(&mut self, text: impl Into<String>) -> Result<u64, AppendError> {
        self.at_main(DeltaAction::Replace, text.into())
    }

    /// Sets the value at a path in props (`done`, `payload.progress`), creating the way.
    pub fn set(&mut self, path: &str, value: impl Into<Value>) -> Result<u64, AppendError> {
        let mut value = value.into();
        for segment in path.rsplit('.') {
            let mut map = Map::new();
            map.insert(segment.to_owned(), value);
            value = Value::Object(map);
        }
        let props = match value {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        self.delta(DeltaAction::Set, Some(path), props)
    }

    /// Ends the message: the stream appends its `message_end`.
    pub fn end(self) -> Result<Option<u64>, AppendError> {
        if self.first.is_some() {
            return Ok(None);
        }
        self.output.stream.end_message(&self.message_id)
    }

    fn at_main(&mut self, action: DeltaAction, text: String) -> Result<u64, AppendError> {
        // A type without a main field (a custom one) streams into `content`, named explicitly.
        let (field, path) = match main_field(&self.kind) {
            Some(field) => (field, None),
            None => ("content", Some("content")),
        };
        // Sized for its one field: a map grown by insertion reserves four, and the log keeps every delta.
        let mut props = Map::with_capacity(1);
        props.insert(field.to_owned(), Value::String(text));
        self.delta(action, path, props)
    }

    fn delta(
        &mut self,
        action: DeltaAction,
        path: Option<&str>,
        props: Map<String, Value>,
    ) -> Result<u64, AppendError> {
        let mut message = match &self.first {
            // The first chunk starts the message: its own props plus this delta's, as they are.
            Some(first) => {
                let mut all = first.clone();
                all.extend(props);
                let mut message = OutputMessage::new(self.kind.clone(), all);
                message.delta = true;
                message
            }
            None => OutputMessage::new(self.kind.clone(), props).as_delta(action, path),
        };
        message.message_id = Some(self.message_id.clone());
        let sequence = self.output.send(message)?;
        self.first = None;
        Ok(sequence)
    }
}

fn tool_call_props(id: String, name: String, server_side: bool) -> Map<String, Value> {
    let mut props = Map::new();
    props.insert("id".into(), Value::String(id));
    props.insert("name".into(), Value::String(name));
    props.insert("arguments".into(), Value::String(String::new()));
    if server_side {
        props.insert("server_side".into(), Value::Bool(true));
    }
    props
}
