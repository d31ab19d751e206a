//! [`ResponsesAdapter`]: a stream's messages as an OpenAI Responses stream (`docs/clients.md`, "OpenAI Responses"), the semantic
//! events `responses.stream(...)` reads, each with its `event:` line and a `sequence_number` counting from 0.
//!
//! The Responses API's output is the chat stream's content in items, so this adapter shares the OpenAI
//! adapters' state machine (`openai/progress.rs`, as the Anthropic adapter does) and lays its pieces out as
//! output items, one at a time: a `message` item (one `output_text` part) for content, a `reasoning` item (one
//! `summary_text` part) for reasoning, a `function_call` item per call handed to the client. Each item opens
//! with `response.output_item.added` (and its part's `…part.added`), streams its deltas, and closes with its
//! `…done` events carrying the whole text, then `response.output_item.done`. Another kind of content closes the
//! open item and opens the next, and so does a correction (text taken back, `progress.rs`): the corrected
//! message's whole text goes out in a new item.
//!
//! The stream opens with `response.created` and `response.in_progress` and ends with `response.completed`
//! (the whole response: every item and the usage); `response.incomplete` when the token limit cut it
//! (`max_output_tokens`); and for an `error` message, a failed or cancelled stream or a reader whose history
//! is gone, an `error` event (with the flat fields and a nested `error` object, as the Python client reads
//! either) then `response.failed`, its response's `status` `failed` (or OpenAI's `cancelled`) and its `error`
//! `{type, code, message, param}` (the AI SDK requires `type`). A cancel is an error because that is what
//! clients surface: the API has no cancel event, and a `response.incomplete` reads, to the AI SDK, pydantic-ai
//! and LangChain, as a short answer. Nothing else is sent: the Node client throws on an event type it does not
//! know. The response id (`resp_<epoch>`) never changes.
//!
//! The `…done` events and the final response carry whole texts, so this adapter keeps every item's content
//! (as the reducer under it keeps every message's).

use serde_json::{Value, json};

use super::frame::Frame;
use super::machine::Adapter;
use super::openai::AgentTools;
use super::openai::progress::{Piece, Progress};
use crate::output::{EndStatus, ErrorProps, FinishReason, Outcome, OutputMessage, Usage};

/// What the adapter needs beyond the messages: fixed per stream, so output is deterministic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponsesOptions {
    /// The response id (`resp_...`); item ids are made from it.
    pub id: String,
    /// Creation time in seconds since the Unix epoch.
    pub created_at: u64,
    /// The model to report.
    pub model: String,
}

/// Renders messages as Responses stream events.
///
/// ```
/// use agentmux::adapter::{Adapter, ResponsesAdapter, ResponsesOptions};
/// use agentmux::output::{Outcome, OutputMessage};
///
/// let options = ResponsesOptions { id: "resp_1".into(), created_at: 1700000000, model: "demo".into() };
/// let mut adapter = ResponsesAdapter::new(options);
/// let mut frames = Vec::new();
/// adapter.push(&OutputMessage::text("Hi"), &mut frames);
/// adapter.finish(&Outcome::completed(), &mut frames);
/// assert_eq!(frames.first().and_then(|f| f.event), Some("response.created"));
/// assert_eq!(frames.last().and_then(|f| f.event), Some("response.completed"));
/// assert_eq!(adapter.response()["output"][0]["content"][0]["text"], "Hi");
/// ```
#[derive(Debug)]
pub struct ResponsesAdapter {
    progress: Progress,
    items: Items,
}

/// The output items as they go out.
#[derive(Debug)]
struct Items {
    options: ResponsesOptions,
    sequence: u64,
    started: bool,
    /// The item open now: its index.
    open: Option<usize>,
    items: Vec<Item>,
    /// The item of each tool call, by the tool call's index.
    tools: Vec<usize>,
    status: &'static str,
    incomplete: Option<&'static str>,
    error: Option<Failure>,
    usage: Option<Usage>,
    done: bool,
}

#[derive(Debug)]
enum Item {
    Message { id: String, text: String },
    Reasoning { id: String, text: String },
    FunctionCall { id: String, call_id: String, name: String, arguments: String },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Message { id, .. } | Item::Reasoning { id, .. } | Item::FunctionCall { id, .. } => id,
        }
    }

    /// As the response lists it: `in_progress` while it streams, `completed` once done.
    fn json(&self, status: &str) -> Value {
        match self {
            Item::Message { id, text } => json!({
                "id": id, "type": "message", "status": status, "role": "assistant",
                "content": if status == "completed" { json!([output_text(text)]) } else { json!([]) },
            }),
            Item::Reasoning { id, text } => json!({
                "id": id, "type": "reasoning",
                "summary": if status == "completed" { json!([{"type": "summary_text", "text": text}]) } else { json!([]) },
            }),
            Item::FunctionCall { id, call_id, name, arguments } => json!({
                "id": id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
                "arguments": if status == "completed" { arguments.as_str() } else { "" },
            }),
        }
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

impl ResponsesAdapter {
    /// An adapter for one stream.
    pub fn new(options: ResponsesOptions) -> Self {
        ResponsesAdapter { progress: Progress::new(AgentTools::Reasoning), items: Items::new(options) }
    }

    /// The response as it stands (the non-streaming answer, once the stream has finished).
    pub fn response(&self) -> Value {
        self.items.response()
    }
}

impl Items {
    fn new(options: ResponsesOptions) -> Self {
        Items {
            options,
            sequence: 0,
            started: false,
            open: None,
            items: Vec::new(),
            tools: Vec::new(),
            status: "in_progress",
            incomplete: None,
            error: None,
            usage: None,
            done: false,
        }
    }

    fn response(&self) -> Value {
        let o = &self.options;
        let output: Vec<Value> = self.items.iter().map(|item| item.json("completed")).collect();
        let usage = self.usage.as_ref().map(|u| {
            json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.map_or(0, |d| d.cached_tokens)},
                "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.total_tokens,
            })
        });
        json!({
            "id": o.id, "object": "response", "created_at": o.created_at, "status": self.status, "model": o.model,
            "output": if self.started && self.status != "in_progress" { json!(output) } else { json!([]) },
            "error": self.error.as_ref().map(|e| e.json()),
            "incomplete_details": self.incomplete.map(|reason| json!({"reason": reason})),
            "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": usage,
        })
    }

    /// One event: `body` with its type and the next sequence number.
    fn event(&mut self, kind: &'static str, body: Value, frames: &mut Vec<Frame>) {
        // The type first, as the API sends it.
        let mut event = serde_json::Map::new();
        event.insert("type".into(), json!(kind));
        event.insert("sequence_number".into(), json!(self.sequence));
        if let Value::Object(body) = body {
            event.extend(body);
        }
        self.sequence += 1;
        frames.push(Frame::named(kind, &event));
    }

    fn start(&mut self, frames: &mut Vec<Frame>) {
        if !std::mem::replace(&mut self.started, true) {
            let response = self.response();
            self.event("response.created", json!({"response": response}), frames);
            let response = self.response();
            self.event("response.in_progress", json!({"response": response}), frames);
        }
    }

    /// Closes the open item: its part's and its own `…done` events.
    fn close(&mut self, frames: &mut Vec<Frame>) {
        let Some(index) = self.open.take() else { return };
        let (item_id, item) = (self.items[index].id().to_owned(), self.items[index].json("completed"));
        match &self.items[index] {
            Item::Message { text, .. } => {
                let text = text.clone();
                let at = json!({"item_id": item_id, "output_index": index, "content_index": 0});
                self.event("response.output_text.done", merged(&at, json!({"text": text, "logprobs": []})), frames);
                self.event("response.content_part.done", merged(&at, json!({"part": output_text(&text)})), frames);
            }
            Item::Reasoning { text, .. } => {
                let text = text.clone();
                let at = json!({"item_id": item_id, "output_index": index, "summary_index": 0});
                self.event("response.reasoning_summary_text.done", merged(&at, json!({"text": text})), frames);
                let part = json!({"part": {"type": "summary_text", "text": text}});
                self.event("response.reasoning_summary_part.done", merged(&at, part), frames);
            }
            Item::FunctionCall { arguments, .. } => {
                let body = json!({"item_id": item_id, "output_index": index, "arguments": arguments});
                self.event("response.function_call_arguments.done", body, frames);
            }
        }
        self.event("response.output_item.done", json!({"output_index": index, "item": item}), frames);
    }

    /// Opens `item` as the next one, closing the open one.
    fn open(&mut self, item: Item, frames: &mut Vec<Frame>) -> usize {
        self.close(frames);
        let index = self.items.len();
        let added = item.json("in_progress");
        let item_id = item.id().to_owned();
        self.items.push(item);
        self.open = Some(index);
        self.event("response.output_item.added", json!({"output_index": index, "item": added}), frames);
        match &self.items[index] {
            Item::Message { .. } => {
                let body =
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": output_text("")});
                self.event("response.content_part.added", body, frames);
            }
            Item::Reasoning { .. } => {
                let part = json!({"type": "summary_text", "text": ""});
                let body = json!({"item_id": item_id, "output_index": index, "summary_index": 0, "part": part});
                self.event("response.reasoning_summary_part.added", body, frames);
            }
            Item::FunctionCall { .. } => {}
        }
        index
    }

    fn item_id(&self, prefix: &str) -> String {
        let base = self.options.id.strip_prefix("resp_").unwrap_or(&self.options.id);
        format!("{prefix}_{base}_{}", self.items.len())
    }

    fn piece(&mut self, piece: Piece<'_>, frames: &mut Vec<Frame>) {
        match piece {
            Piece::Content { text, new_line, fresh } | Piece::Reasoning { text, new_line, fresh } => {
                let reasoning = matches!(piece, Piece::Reasoning { .. });
                // A correction opens an item of its own, which needs no line break first.
                let text = if new_line && !fresh { format!("\n{text}") } else { text.to_owned() };
                let index = match self.open.map(|index| (index, &self.items[index])) {
                    Some((index, Item::Message { .. })) if !reasoning && !fresh => index,
                    Some((index, Item::Reasoning { .. })) if reasoning && !fresh => index,
                    _ if reasoning => {
                        self.open(Item::Reasoning { id: self.item_id("rs"), text: String::new() }, frames)
                    }
                    _ => self.open(Item::Message { id: self.item_id("msg"), text: String::new() }, frames),
                };
                let item_id = self.items[index].id().to_owned();
                if reasoning {
                    let body = json!({"item_id": item_id, "output_index": index, "summary_index": 0, "delta": text});
                    self.event("response.reasoning_summary_text.delta", body, frames);
                } else {
                    let body = json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []});
                    self.event("response.output_text.delta", body, frames);
                }
                if let Item::Message { text: all, .. } | Item::Reasoning { text: all, .. } = &mut self.items[index] {
                    all.push_str(&text);
                }
            }
            Piece::ToolHeader { index, id, name } => {
                let item = Item::FunctionCall {
                    id: self.item_id("fc"),
                    call_id: id.to_owned(),
                    name: name.to_owned(),
                    arguments: String::new(),
                };
                let at = self.open(item, frames);
                let tool = index as usize;
                if self.tools.len() <= tool {
                    self.tools.resize(tool + 1, at);
                }
                self.tools[tool] = at;
            }
            Piece::ToolArguments { index, arguments } => {
                let Some(&at) = self.tools.get(index as usize) else { return };
                let item_id = self.items[at].id().to_owned();
                let body = json!({"item_id": item_id, "output_index": at, "delta": arguments});
                self.event("response.function_call_arguments.delta", body, frames);
                if let Item::FunctionCall { arguments: all, .. } = &mut self.items[at] {
                    all.push_str(arguments);
                }
            }
            Piece::Error { message, code } => {
                self.fail(Failure::agent(code.unwrap_or("agent_error"), message), frames);
            }
        }
    }

    /// Ends the stream with an `error` event and `response.failed`.
    fn fail(&mut self, failure: Failure, frames: &mut Vec<Frame>) {
        self.close(frames);
        let error = failure.json();
        let body = json!({"code": failure.code, "message": failure.message, "param": null, "error": error});
        self.event("error", body, frames);
        self.status = failure.status;
        (self.error, self.done) = (Some(failure), true);
        let response = self.response();
        self.event("response.failed", json!({"response": response}), frames);
    }
}

/// Why a response failed: its status (`failed`, or `cancelled`) and its error.
#[derive(Debug)]
struct Failure {
    status: &'static str,
    kind: &'static str,
    code: String,
    message: String,
}

impl Failure {
    /// The agent (or the stream) failed with `code`.
    fn agent(code: &str, message: &str) -> Failure {
        Failure { status: "failed", kind: "agent_error", code: code.to_owned(), message: message.to_owned() }
    }

    /// Someone cancelled the stream.
    fn cancelled() -> Failure {
        let message = "the stream was cancelled".to_owned();
        Failure { status: "cancelled", kind: "cancelled", code: "cancelled".into(), message }
    }

    fn json(&self) -> Value {
        json!({"type": self.kind, "code": self.code, "message": self.message, "param": null})
    }
}

/// `a`'s fields, then `b`'s.
fn merged(a: &Value, b: Value) -> Value {
    let mut map = a.as_object().cloned().unwrap_or_default();
    if let Value::Object(b) = b {
        map.extend(b);
    }
    Value::Object(map)
}

impl Adapter for ResponsesAdapter {
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>) {
        if self.items.done {
            return;
        }
        self.items.start(frames);
        let items = &mut self.items;
        self.progress.push(message, &mut |piece| items.piece(piece, frames));
    }

    fn finish(&mut self, outcome: &Outcome, frames: &mut Vec<Frame>) {
        if self.items.done {
            return;
        }
        self.items.start(frames);
        self.items.usage = outcome.usage;
        match outcome.status {
            EndStatus::Error => {
                let error = outcome.error.as_ref();
                let message = error.map_or("the agent failed", |e| e.message.as_str());
                let code = error.and_then(|e| e.code.as_deref()).unwrap_or("agent_error");
                return self.items.fail(Failure::agent(code, message), frames);
            }
            EndStatus::Cancelled => return self.items.fail(Failure::cancelled(), frames),
            EndStatus::Completed => {
                let items = &mut self.items;
                self.progress.finish(&mut |piece| items.piece(piece, frames));
                if self.progress.finish_reason(outcome) == FinishReason::Length {
                    self.items.incomplete = Some("max_output_tokens");
                }
            }
        }
        let items = &mut self.items;
        items.close(frames);
        items.done = true;
        let kind = if items.incomplete.is_some() { "response.incomplete" } else { "response.completed" };
        items.status = if items.incomplete.is_some() { "incomplete" } else { "completed" };
        let response = items.response();
        items.event(kind, json!({"response": response}), frames);
    }

    fn ended(&self) -> bool {
        self.items.done
    }

    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>) {
        // Changes no state: fresh items, where this reader is, end its view.
        let mut items =
            Items { sequence: self.items.sequence, started: true, ..Items::new(self.items.options.clone()) };
        items.fail(Failure::agent(error.code.as_deref().unwrap_or("lagged"), &error.message), frames);
    }
}
