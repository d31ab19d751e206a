//! Property tests: random streams of messages through every adapter.
//!
//! 1. Any sequence of valid messages (every built-in type, custom types, deltas of every action on default and
//!    explicit paths, type changes, deltas the reducer refuses, awkward Unicode) renders without panic through
//!    [`CuiAdapter`], [`OpenAiAdapter`] (usage chunk on and off, every reasoning field) and [`OpenAiCompletion`],
//!    for every way a stream can end, and the frames keep the wire invariants clients rely on.
//! 2. For an append-only stream, what a streaming OpenAI client accumulates (`delta.content`, each tool call's
//!    `function.arguments`) is what the reducer says the messages are, and what the non-streaming response says.

use std::collections::{BTreeMap, HashMap};

use agentmux::adapter::{Adapter, CuiAdapter, OpenAiAdapter, OpenAiCompletion, OpenAiOptions, ReasoningField};
use agentmux::output::{
    DeltaAction, ErrorProps, FinishReason, Metadata, Outcome, OutputMessage, Reducer, Usage, main_field,
};
use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------------------------
// Strategies: strings, URLs, JSON values.
// ---------------------------------------------------------------------------------------------------------

/// Fragments that tend to break JSON, SSE or Markdown handling.
const FRAGMENTS: &[&str] = &[
    "",
    "a",
    "Hello",
    " ",
    "\"",
    "'",
    "\\",
    "\n",
    "\r\n",
    "\r",
    "\t",
    "\u{0}",
    "\u{7f}",
    "\u{2028}",
    "\u{202e}",
    "\u{feff}",
    "é",
    "日本語",
    "😀",
    "👨\u{200d}👩\u{200d}👧",
    "🏳️‍🌈",
    "[",
    "]",
    "(",
    ")",
    "<",
    ">",
    "</script>",
    "data: ",
    "[DONE]",
    "\n\n",
    "{\"a\":",
    "}",
    "```",
    "**",
];

/// A string: arbitrary characters, or a few awkward fragments glued together.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => "(?s).{0,8}",
        3 => prop::collection::vec(prop::sample::select(FRAGMENTS), 0..5).prop_map(|v| v.concat()),
        1 => any::<String>(),
    ]
    .boxed()
}

/// A non-empty string.
fn non_empty_text() -> BoxedStrategy<String> {
    text().prop_map(|s| if s.is_empty() { "x".to_owned() } else { s }).boxed()
}

/// A media URL that validation accepts (http(s) or `data:`), often with characters Markdown must escape.
fn media_url() -> BoxedStrategy<String> {
    let fixed = prop::sample::select(vec![
        "https://example.com/a.png",
        "http://x.test/docs/report.pdf?dl=1#p2",
        "HTTPS://Example.com/a (1).png",
        "https://x.test/dir/",
        "https://x.test",
        "https://例え.jp/画像.png",
        "data:image/png;base64,iVBORw0KGgo=",
        "data:text/plain,hello%20world",
        "https://x.test/a<b>c",
        "https://user:pw@x.test:8443/p)q(",
    ])
    .prop_map(str::to_owned);
    let built = (prop::sample::select(vec!["https://h.test/", "http://h.test/p/", "https://h.test/?q="]), text())
        .prop_map(|(base, tail)| format!("{base}{tail}"));
    prop_oneof![fixed, built].boxed()
}

/// Any finite float: serde_json's `float_roundtrip` feature (on in Cargo.toml) reads every one back exactly,
/// so custom props carrying numbers pass through the CUI adapter untouched.
fn decimal() -> BoxedStrategy<f64> {
    any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).boxed()
}

/// Any JSON value, shallow.
fn json_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        decimal().prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map(key(), inner, 0..3).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec!["content", "message", "url", "alt", "name", "progress", "items", "x", "ü 😀", ""])
            .prop_map(str::to_owned),
        text(),
    ]
    .boxed()
}

fn json_object() -> BoxedStrategy<Map<String, Value>> {
    prop::collection::btree_map(key(), json_value(), 0..3).prop_map(|m| m.into_iter().collect()).boxed()
}

/// A string or, sometimes, any JSON value: what a delta carries.
fn delta_value() -> BoxedStrategy<Value> {
    prop_oneof![5 => text().prop_map(Value::from), 2 => json_value(), 1 => json_object().prop_map(Value::Object)]
        .boxed()
}

// ---------------------------------------------------------------------------------------------------------
// Strategies: messages.
// ---------------------------------------------------------------------------------------------------------

const CUSTOM_KINDS: &[&str] = &["chart", "widget", "ünïcødé 😀", "a]b[c", "x\ny", "tool_result"];
const ALL_KINDS: &[&str] = &[
    "text",
    "thinking",
    "loading",
    "tool_call",
    "error",
    "image",
    "audio",
    "video",
    "file",
    "action",
    "event",
    "chart",
    "ünïcødé 😀",
];

fn opt<T: std::fmt::Debug + Clone + 'static>(s: impl Strategy<Value = T> + 'static) -> BoxedStrategy<Option<T>> {
    prop::option::of(s).boxed()
}

fn with_opt(mut message: OutputMessage, key: &str, value: Option<impl Into<Value>>) -> OutputMessage {
    if let Some(value) = value {
        message.props.insert(key.to_owned(), value.into());
    }
    message
}

fn image() -> BoxedStrategy<OutputMessage> {
    let detail = opt(prop::sample::select(vec!["auto", "low", "high"]));
    (media_url(), opt(text()), opt(0u64..5000), opt(0u64..5000), detail)
        .prop_map(|(url, alt, w, h, detail)| {
            let m = with_opt(with_opt(OutputMessage::image(url), "alt", alt), "width", w);
            with_opt(with_opt(m, "height", h), "detail", detail)
        })
        .boxed()
}

fn duration() -> BoxedStrategy<f64> {
    prop_oneof![Just(0.0), Just(1.5), Just(0.1), decimal().prop_map(f64::abs)].boxed()
}

fn audio() -> BoxedStrategy<OutputMessage> {
    (media_url(), opt(text()), opt(duration()), opt(text()), opt(any::<bool>()))
        .prop_map(|(url, format, duration, transcript, autoplay)| {
            let m = with_opt(with_opt(OutputMessage::audio(url), "format", format), "duration", duration);
            with_opt(with_opt(m, "transcript", transcript), "autoplay", autoplay)
        })
        .boxed()
}

fn video() -> BoxedStrategy<OutputMessage> {
    (media_url(), opt(media_url()), opt(duration()), opt(any::<bool>()))
        .prop_map(|(url, thumb, duration, looped)| {
            let m = with_opt(with_opt(OutputMessage::video(url), "thumbnail", thumb), "duration", duration);
            with_opt(m, "loop", looped)
        })
        .boxed()
}

fn file() -> BoxedStrategy<OutputMessage> {
    (media_url(), opt(text()), opt(text()), opt(any::<u64>()))
        .prop_map(|(url, name, mime, size)| {
            let m = with_opt(with_opt(OutputMessage::file(url), "name", name), "mime", mime);
            with_opt(m, "size", size)
        })
        .boxed()
}

fn tool_call() -> BoxedStrategy<OutputMessage> {
    let id = prop_oneof![Just(String::new()), text()];
    let name = prop_oneof![1 => Just(String::new()), 4 => text()];
    (id, name, text()).prop_map(|(id, name, args)| OutputMessage::tool_call(id, name, args)).boxed()
}

/// A custom type, with or without a `url` prop (which, unchecked, may hold anything).
fn custom() -> BoxedStrategy<OutputMessage> {
    let url = prop_oneof![
        Just(None),
        media_url().prop_map(|u| Some(Value::from(u))),
        text().prop_map(|u| Some(Value::from(u))),
        json_value().prop_map(Some),
    ];
    (prop::sample::select(CUSTOM_KINDS), json_object(), url)
        .prop_map(|(kind, props, url)| with_opt(OutputMessage::new(kind, props), "url", url))
        .boxed()
}

/// A whole (non-delta) message of any type, without ids.
fn full_message() -> BoxedStrategy<OutputMessage> {
    prop_oneof![
        4 => text().prop_map(OutputMessage::text),
        2 => text().prop_map(OutputMessage::thinking),
        2 => (text(), opt(any::<bool>())).prop_map(|(m, d)| with_opt(OutputMessage::loading(m), "done", d)),
        3 => tool_call(),
        1 => (text(), opt(text()), opt(json_value())).prop_map(|(m, code, details)| {
            with_opt(with_opt(OutputMessage::error(m), "code", code), "details", details)
        }),
        1 => image(),
        1 => audio(),
        1 => video(),
        1 => file(),
        1 => (text(), opt(json_object())).prop_map(|(name, payload)| {
            with_opt(OutputMessage::action(name), "payload", payload.map(Value::Object))
        }),
        1 => (text(), opt(text()), opt(json_object())).prop_map(|(event, message, data)| {
            with_opt(with_opt(OutputMessage::event(event), "message", message), "data", data.map(Value::Object))
        }),
        2 => custom(),
    ]
    .boxed()
}

/// The ids and metadata a message may carry besides `message_id`.
#[derive(Debug, Clone)]
struct Extras {
    chunk_id: Option<String>,
    block_id: Option<String>,
    thread_id: Option<String>,
    metadata: Option<Metadata>,
}

fn extras() -> BoxedStrategy<Extras> {
    let metadata = (opt(any::<u64>()), opt(any::<u64>()), opt(text()))
        .prop_map(|(sequence, timestamp, trace_id)| Metadata { sequence, timestamp, trace_id });
    (opt(text()), opt(text()), opt(text()), opt(metadata))
        .prop_map(|(chunk_id, block_id, thread_id, metadata)| Extras { chunk_id, block_id, thread_id, metadata })
        .boxed()
}

impl Extras {
    fn apply(self, message: &mut OutputMessage) {
        message.chunk_id = self.chunk_id;
        message.block_id = self.block_id;
        message.thread_id = self.thread_id;
        message.metadata = self.metadata;
    }
}

/// Which type a delta has.
#[derive(Debug, Clone)]
enum DeltaKind {
    /// The type of the message it updates (as far as the generator knows).
    Same,
    /// Another type, without `type_change`: the reducer refuses it unless the types happen to agree.
    Other(&'static str),
    /// Another type, with `type_change`.
    Change(&'static str),
}

/// One step of a generated stream; turned into messages by [`build`].
#[derive(Debug, Clone)]
enum Step {
    Full { message: OutputMessage, id: Option<usize>, extras: Extras },
    Delta(DeltaSpec),
}

#[derive(Debug, Clone)]
struct DeltaSpec {
    id: usize,
    kind: DeltaKind,
    action: Option<DeltaAction>,
    path: Option<&'static str>,
    value: Value,
    /// False: the props carry nothing at the path (the reducer refuses it).
    carry: bool,
    extras: Extras,
}

const PATHS: &[&str] = &[
    "",
    "content",
    "message",
    "arguments",
    "url",
    "alt",
    "done",
    "name",
    "payload",
    "payload.progress",
    "data.items",
    "data.items.0",
    "a.b.c",
    "list.1",
    "extra",
];

fn action() -> BoxedStrategy<DeltaAction> {
    prop::sample::select(vec![DeltaAction::Append, DeltaAction::Replace, DeltaAction::Merge, DeltaAction::Set]).boxed()
}

fn step() -> BoxedStrategy<Step> {
    let full =
        (full_message(), opt(0usize..5), extras()).prop_map(|(message, id, extras)| Step::Full { message, id, extras });
    let kind = prop_oneof![
        6 => Just(DeltaKind::Same),
        1 => prop::sample::select(ALL_KINDS).prop_map(DeltaKind::Other),
        1 => prop::sample::select(ALL_KINDS).prop_map(DeltaKind::Change),
    ];
    let path = prop_oneof![3 => Just(None), 2 => prop::sample::select(PATHS).prop_map(Some)];
    let delta = (
        0usize..5,
        kind,
        prop_oneof![Just(None), action().prop_map(Some)],
        path,
        delta_value(),
        prop::bool::weighted(0.9),
        extras(),
    )
        .prop_map(|(id, kind, action, path, value, carry, extras)| {
            Step::Delta(DeltaSpec { id, kind, action, path, value, carry, extras })
        });
    prop_oneof![2 => full, 3 => delta].boxed()
}

/// Turns steps into valid messages; a step whose message would not validate is left out.
fn build(steps: Vec<Step>) -> Vec<OutputMessage> {
    let mut kinds: HashMap<String, &'static str> = HashMap::new();
    let mut out = Vec::new();
    for step in steps {
        let message = match step {
            Step::Full { mut message, id, extras } => {
                extras.apply(&mut message);
                if let Some(id) = id {
                    let id = format!("m{id}");
                    let kind = ALL_KINDS.iter().chain(CUSTOM_KINDS).find(|k| **k == message.kind).copied();
                    kinds.insert(id.clone(), kind.unwrap_or("chart"));
                    message.message_id = Some(id);
                }
                message
            }
            Step::Delta(spec) => {
                let id = format!("m{}", spec.id);
                let (kind, type_change) = match spec.kind {
                    DeltaKind::Same => (kinds.get(&id).copied().unwrap_or("text"), false),
                    DeltaKind::Other(kind) => (kind, false),
                    DeltaKind::Change(kind) => (kind, true),
                };
                let segments: Vec<&str> = match spec.path {
                    Some("") => Vec::new(),
                    Some(path) => path.split('.').collect(),
                    None => main_field(kind).into_iter().collect(),
                };
                let props = if !spec.carry {
                    Map::from_iter([("unrelated".to_owned(), spec.value)])
                } else if segments.is_empty() {
                    match spec.value {
                        Value::Object(map) => map,
                        other => Map::from_iter([("extra".to_owned(), other)]),
                    }
                } else {
                    let nested = segments.iter().skip(1).rev().fold(spec.value, |v, s| json!({ *s: v }));
                    Map::from_iter([(segments[0].to_owned(), nested)])
                };
                let mut message = OutputMessage::new(kind, props);
                spec.extras.apply(&mut message);
                message.message_id = Some(id.clone());
                message.delta = true;
                message.delta_path = spec.path.map(str::to_owned);
                message.delta_action = spec.action;
                message.type_change = type_change;
                if type_change && message.validate().is_ok() {
                    kinds.insert(id, kind);
                }
                message
            }
        };
        if message.validate().is_ok() {
            out.push(message);
        }
    }
    out
}

fn stream() -> BoxedStrategy<Vec<OutputMessage>> {
    prop::collection::vec(step(), 0..24).prop_map(build).boxed()
}

#[derive(Debug, Clone)]
struct Ending {
    finish_reason: Option<FinishReason>,
    usage: Option<Usage>,
    error: ErrorProps,
}

fn ending() -> BoxedStrategy<Ending> {
    let reason = opt(prop::sample::select(vec![
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::ContentFilter,
        FinishReason::ToolCalls,
    ]));
    let usage = opt((0u64..1 << 40, 0u64..1 << 40).prop_map(|(p, c)| Usage::new(p, c)));
    let error = (text(), opt(text())).prop_map(|(message, code)| ErrorProps { message, code, details: None });
    (reason, usage, error).prop_map(|(finish_reason, usage, error)| Ending { finish_reason, usage, error }).boxed()
}

impl Ending {
    /// The three ways to end, each with the generated usage.
    fn outcomes(&self) -> [Outcome; 3] {
        let with_usage = |mut o: Outcome| {
            o.usage = self.usage;
            o
        };
        let mut completed = Outcome::completed();
        completed.finish_reason = self.finish_reason;
        [with_usage(completed), with_usage(Outcome::cancelled()), with_usage(Outcome::failed(self.error.clone()))]
    }
}

fn options() -> BoxedStrategy<OpenAiOptions> {
    let reasoning =
        prop::sample::select(vec![ReasoningField::ReasoningContent, ReasoningField::Reasoning, ReasoningField::Both]);
    let id = prop_oneof![Just("chatcmpl-1".to_owned()), text()];
    let model = prop_oneof![Just("demo".to_owned()), text()];
    (id, any::<u64>(), model, reasoning)
        .prop_map(|(id, created, model, reasoning)| {
            let mut options = OpenAiOptions::new(id, created, model);
            options.reasoning = reasoning;
            options
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------------------
// Frame parsing and checks.
// ---------------------------------------------------------------------------------------------------------

const DONE: &[u8] = b"data: [DONE]\n\n";

#[derive(Debug)]
enum Frame {
    Done,
    Json(Value),
}

/// Parses OpenAI frames: each must be `data: [DONE]\n\n` or `data: <one-line JSON object>\n\n`.
fn parse_openai(frames: &[Bytes]) -> Result<Vec<Frame>, TestCaseError> {
    frames
        .iter()
        .map(|frame| {
            if &frame[..] == DONE {
                return Ok(Frame::Done);
            }
            let text = std::str::from_utf8(frame).map_err(|e| TestCaseError::fail(format!("not UTF-8: {e}")))?;
            let body = text
                .strip_prefix("data: ")
                .and_then(|t| t.strip_suffix("\n\n"))
                .ok_or_else(|| TestCaseError::fail(format!("bad framing: {text:?}")))?;
            prop_assert!(!body.contains(['\n', '\r']), "line break inside a data line: {text:?}");
            let value: Value = serde_json::from_str(body).map_err(|e| TestCaseError::fail(format!("{e}: {body:?}")))?;
            prop_assert!(value.is_object(), "not an object: {body}");
            Ok(Frame::Json(value))
        })
        .collect()
}

/// What a checked OpenAI stream says, for comparison with the non-streaming response.
#[derive(Debug, Default)]
struct StreamSummary {
    error: Option<Value>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    content: String,
    /// Per tool-call index: id, name, concatenated arguments.
    tools: BTreeMap<u64, (String, String, String)>,
}

/// Checks the structural invariants of one OpenAI chunk stream and sums it up.
fn check_openai(frames: &[Bytes], options: &OpenAiOptions, outcome: &Outcome) -> Result<StreamSummary, TestCaseError> {
    let parsed = parse_openai(frames)?;
    prop_assert!(parsed.len() >= 2, "too few frames: {parsed:?}");
    prop_assert!(matches!(parsed.last(), Some(Frame::Done)), "last frame is not [DONE]");
    let dones = parsed.iter().filter(|f| matches!(f, Frame::Done)).count();
    prop_assert_eq!(dones, 1, "[DONE] count");

    let mut summary = StreamSummary::default();
    let mut closing_seen = false;
    let json: Vec<&Value> = parsed
        .iter()
        .filter_map(|f| match f {
            Frame::Json(v) => Some(v),
            Frame::Done => None,
        })
        .collect();
    for (i, chunk) in json.iter().enumerate() {
        let last = i + 1 == json.len();
        if let Some(error) = chunk.get("error") {
            prop_assert!(last, "an error frame is not the last before [DONE]: {chunk}");
            prop_assert_eq!(chunk.as_object().map(Map::len), Some(1), "error envelope has extra keys: {}", chunk);
            let message = error.get("message").and_then(Value::as_str).unwrap_or("");
            prop_assert!(!message.is_empty(), "error without message: {}", chunk);
            prop_assert!(error.get("type").is_some_and(Value::is_string), "error without type: {}", chunk);
            prop_assert!(error.get("param").is_some(), "error without param: {}", chunk);
            let code = error.get("code");
            prop_assert!(code.is_some_and(|c| c.is_null() || c.is_string()), "error code: {}", chunk);
            summary.error = Some(error.clone());
            continue;
        }
        prop_assert_eq!(chunk.get("id"), Some(&Value::from(options.id.as_str())), "id: {}", chunk);
        prop_assert_eq!(chunk.get("created"), Some(&Value::from(options.created)), "created: {}", chunk);
        prop_assert_eq!(chunk.get("model"), Some(&Value::from(options.model.as_str())), "model: {}", chunk);
        prop_assert_eq!(chunk.get("object"), Some(&json!("chat.completion.chunk")), "object: {}", chunk);
        let choices = chunk.get("choices").and_then(Value::as_array);
        let Some(choices) = choices else {
            return Err(TestCaseError::fail(format!("choices missing or not an array: {chunk}")));
        };
        if choices.is_empty() {
            // The usage chunk: only after the closing chunk, as the last JSON frame.
            prop_assert!(closing_seen && last, "usage chunk out of place: {}", chunk);
            prop_assert!(chunk.get("usage").is_some(), "empty choices without usage: {}", chunk);
            summary.usage = chunk.get("usage").cloned();
            continue;
        }
        prop_assert!(chunk.get("usage").is_none(), "usage on a chunk with choices: {}", chunk);
        prop_assert_eq!(choices.len(), 1, "one choice per chunk: {}", chunk);
        let choice = &choices[0];
        prop_assert_eq!(choice.get("index"), Some(&json!(0)), "choice index: {}", chunk);
        prop_assert!(!closing_seen, "a chunk after the closing chunk: {}", chunk);
        let finish = choice.get("finish_reason");
        prop_assert!(finish.is_some(), "finish_reason absent: {}", chunk);
        match finish {
            Some(Value::Null) => {}
            Some(Value::String(reason)) => {
                prop_assert!(
                    ["stop", "length", "content_filter", "tool_calls"].contains(&reason.as_str()),
                    "finish_reason {:?}: {}",
                    reason,
                    chunk
                );
                closing_seen = true;
                summary.finish_reason = Some(reason.clone());
            }
            other => return Err(TestCaseError::fail(format!("finish_reason {other:?}: {chunk}"))),
        }
        let Some(delta) = choice.get("delta").and_then(Value::as_object) else {
            return Err(TestCaseError::fail(format!("delta missing: {chunk}")));
        };
        if i == 0 {
            prop_assert_eq!(delta.get("role"), Some(&json!("assistant")), "first chunk lacks the role: {}", chunk);
        } else {
            prop_assert!(delta.get("role").is_none(), "role after the first chunk: {}", chunk);
        }
        for key in delta.keys() {
            prop_assert!(
                ["role", "content", "reasoning_content", "reasoning", "tool_calls"].contains(&key.as_str()),
                "unexpected delta key {:?}: {}",
                key,
                chunk
            );
        }
        for field in ["reasoning_content", "reasoning"] {
            if let Some(v) = delta.get(field) {
                prop_assert!(v.as_str().is_some_and(|s| !s.is_empty()), "{} not a non-empty string: {}", field, chunk);
            }
        }
        match options.reasoning {
            ReasoningField::ReasoningContent => prop_assert!(delta.get("reasoning").is_none(), "{}", chunk),
            ReasoningField::Reasoning => prop_assert!(delta.get("reasoning_content").is_none(), "{}", chunk),
            ReasoningField::Both => prop_assert_eq!(delta.get("reasoning"), delta.get("reasoning_content")),
        }
        match delta.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => summary.content.push_str(s),
            Some(other) => return Err(TestCaseError::fail(format!("content {other}: {chunk}"))),
        }
        if let Some(calls) = delta.get("tool_calls") {
            let calls = calls.as_array().ok_or_else(|| TestCaseError::fail(format!("tool_calls: {chunk}")))?;
            prop_assert_eq!(calls.len(), 1, "one tool call entry per chunk: {}", chunk);
            let call = &calls[0];
            let Some(index) = call.get("index").and_then(Value::as_u64) else {
                return Err(TestCaseError::fail(format!("tool call without index: {chunk}")));
            };
            let function = call.get("function").and_then(Value::as_object);
            let arguments = function.and_then(|f| f.get("arguments")).and_then(Value::as_str);
            let Some(arguments) = arguments else {
                return Err(TestCaseError::fail(format!("tool call without function.arguments: {chunk}")));
            };
            match summary.tools.get_mut(&index) {
                None => {
                    // The header: the next index, with id, type, name, empty arguments, content null.
                    prop_assert_eq!(index, summary.tools.len() as u64, "tool call index out of order: {}", chunk);
                    let id = call.get("id").and_then(Value::as_str).unwrap_or("");
                    let name = function.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or("");
                    prop_assert!(!id.is_empty() && !name.is_empty(), "header without id or name: {}", chunk);
                    prop_assert_eq!(call.get("type"), Some(&json!("function")), "header type: {}", chunk);
                    prop_assert_eq!(arguments, "", "header carries arguments: {}", chunk);
                    summary.tools.insert(index, (id.to_owned(), name.to_owned(), String::new()));
                }
                Some((_, _, so_far)) => {
                    prop_assert!(call.get("id").is_none() && call.get("type").is_none(), "repeated header: {}", chunk);
                    prop_assert!(function.is_some_and(|f| f.get("name").is_none()), "repeated name: {}", chunk);
                    prop_assert!(!arguments.is_empty(), "empty arguments fragment: {}", chunk);
                    so_far.push_str(arguments);
                }
            }
        }
        if i > 0 && finish.is_some_and(Value::is_null) {
            // Every chunk between the role and the closing chunk says something.
            prop_assert!(
                delta.get("content").is_some_and(|c| c.as_str().is_some_and(|s| !s.is_empty()))
                    || delta.contains_key("tool_calls")
                    || delta.contains_key("reasoning_content")
                    || delta.contains_key("reasoning"),
                "empty chunk: {}",
                chunk
            );
        }
    }

    // How the stream ends.
    let completed = outcome.status == agentmux::output::EndStatus::Completed;
    if summary.error.is_some() {
        prop_assert!(!closing_seen && summary.usage.is_none(), "closing chunk beside an error");
    } else {
        prop_assert!(completed, "a stream that did not complete ended without an error frame");
        prop_assert!(closing_seen, "no closing chunk");
        let expected_usage = outcome.usage.filter(|_| options.include_usage);
        prop_assert_eq!(summary.usage.clone(), expected_usage.map(|u| serde_json::to_value(u).unwrap()));
        match outcome.finish_reason.unwrap_or_default() {
            FinishReason::Stop => prop_assert!(
                matches!(summary.finish_reason.as_deref(), Some("stop" | "tool_calls")),
                "finish_reason {:?} for stop",
                summary.finish_reason
            ),
            reason => prop_assert_eq!(summary.finish_reason.as_deref(), Some(reason.as_str())),
        }
    }
    Ok(summary)
}

/// Checks the CUI frames: one per message, each the message itself, with its sequence as the event id.
fn check_cui(messages: &[OutputMessage], frames: &[Bytes]) -> Result<(), TestCaseError> {
    prop_assert_eq!(frames.len(), messages.len(), "one CUI frame per message");
    for (message, frame) in messages.iter().zip(frames) {
        let text = std::str::from_utf8(frame).map_err(|e| TestCaseError::fail(format!("not UTF-8: {e}")))?;
        let rest = match message.sequence() {
            Some(sequence) => {
                let prefix = format!("id: {sequence}\n");
                prop_assert!(text.starts_with(&prefix), "expected {:?}: {:?}", prefix, text);
                &text[prefix.len()..]
            }
            None => text,
        };
        let body = rest
            .strip_prefix("data: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .ok_or_else(|| TestCaseError::fail(format!("bad framing: {text:?}")))?;
        prop_assert!(!body.contains(['\n', '\r']), "line break inside a data line: {text:?}");
        let value: Value = serde_json::from_str(body).map_err(|e| TestCaseError::fail(format!("{e}: {body:?}")))?;
        let expected = serde_json::to_value(message).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&value, &expected);
        let back: OutputMessage =
            serde_json::from_value(value).map_err(|e| TestCaseError::fail(format!("{e}: {body}")))?;
        prop_assert_eq!(&back, message);
    }
    Ok(())
}

/// Renders `messages` through the streaming adapter with `options`, ending with `outcome`.
fn render_openai(options: &OpenAiOptions, messages: &[OutputMessage], outcome: &Outcome) -> Vec<Bytes> {
    let mut adapter = OpenAiAdapter::new(options.clone());
    let mut frames = Vec::new();
    for message in messages {
        adapter.push(message, &mut frames);
    }
    adapter.finish(outcome, &mut frames);
    // A second finish adds nothing: the stream is over.
    let before = frames.len();
    adapter.finish(outcome, &mut frames);
    assert_eq!(frames.len(), before, "a second finish added frames");
    frames.iter().map(agentmux::render::encode_sse).collect()
}

/// The non-streaming body for the same messages, parsed.
fn render_completion(
    options: &OpenAiOptions,
    messages: &[OutputMessage],
    outcome: &Outcome,
) -> Result<Result<Value, agentmux::adapter::ApiError>, TestCaseError> {
    let mut completion = OpenAiCompletion::new(options.clone());
    for message in messages {
        completion.push(message);
    }
    match completion.finish(outcome) {
        Ok(body) => {
            let value: Value = serde_json::from_slice(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
            Ok(Ok(value))
        }
        Err(error) => Ok(Err(error)),
    }
}

/// The non-streaming response agrees with what the stream said.
fn check_completion(
    options: &OpenAiOptions,
    summary: &StreamSummary,
    completion: &Result<Value, agentmux::adapter::ApiError>,
) -> Result<(), TestCaseError> {
    match (completion, &summary.error) {
        (Err(error), Some(streamed)) => {
            let expected = serde_json::to_value(error).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&expected, streamed, "the stream's error differs from the response's");
        }
        (Ok(body), None) => {
            prop_assert_eq!(body.get("id"), Some(&Value::from(options.id.as_str())));
            prop_assert_eq!(body.get("created"), Some(&Value::from(options.created)));
            prop_assert_eq!(body.get("model"), Some(&Value::from(options.model.as_str())));
            prop_assert_eq!(body.get("object"), Some(&json!("chat.completion")));
            let choice = &body["choices"][0];
            let message = &choice["message"];
            prop_assert_eq!(&message["role"], &json!("assistant"));
            let calls = message.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
            // The same finish reason, except that a response whose tool calls all became other types
            // (a resend or a type_change) says stop.
            let expected_finish = match summary.finish_reason.as_deref() {
                Some("tool_calls") if calls.is_empty() => Some("stop"),
                other => other,
            };
            prop_assert_eq!(choice["finish_reason"].as_str(), expected_finish);
            // Only calls whose header was streamed, in index order, with the id and name the header carried;
            // fewer when a call's message later became another type.
            let mut streamed = summary.tools.values();
            for call in &calls {
                prop_assert_eq!(&call["type"], &json!("function"));
                prop_assert!(call["function"]["arguments"].is_string());
                let (id, name) = (call["id"].as_str().unwrap_or(""), call["function"]["name"].as_str().unwrap_or(""));
                prop_assert!(!id.is_empty() && !name.is_empty(), "call without id or name: {}", body);
                let found = streamed.by_ref().any(|(sid, sname, _)| sid == id && sname == name);
                prop_assert!(found, "call {} {} not streamed in this order: {} vs {:?}", id, name, body, summary.tools);
            }
            let content = &message["content"];
            prop_assert!(content.is_string() || (content.is_null() && !calls.is_empty()), "content: {}", body);
        }
        (completion, streamed) => {
            return Err(TestCaseError::fail(format!(
                "the stream and the response disagree on failing: {completion:?} vs {streamed:?}"
            )));
        }
    }
    Ok(())
}

fn dump(messages: &[OutputMessage]) -> String {
    messages.iter().map(|m| serde_json::to_string(m).unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

// ---------------------------------------------------------------------------------------------------------
// Property 2's append-only streams.
// ---------------------------------------------------------------------------------------------------------

/// One message streamed as a first chunk and append deltas.
#[derive(Debug, Clone)]
struct Unit {
    kind: UnitKind,
    first: String,
    /// The first chunk is itself marked as an append delta (a delta for a new id starts the message).
    first_is_delta: bool,
    /// Appends name the main field explicitly instead of leaving `delta_path` out.
    explicit_path: bool,
    appends: Vec<String>,
    extras: Extras,
}

#[derive(Debug, Clone)]
enum UnitKind {
    Text,
    Thinking,
    Loading,
    ToolCall { id: String, name: String },
    Action,
    Event,
}

fn unit(kind: BoxedStrategy<UnitKind>) -> BoxedStrategy<Unit> {
    (kind, text(), any::<bool>(), prop::bool::weighted(0.2), prop::collection::vec(text(), 0..5), extras())
        .prop_map(|(kind, first, first_is_delta, explicit_path, appends, extras)| Unit {
            kind,
            first,
            first_is_delta,
            explicit_path,
            appends,
            extras,
        })
        .boxed()
}

fn other_kind() -> BoxedStrategy<UnitKind> {
    let id = prop_oneof![Just(String::new()), text()];
    prop_oneof![
        2 => Just(UnitKind::Thinking),
        1 => Just(UnitKind::Loading),
        3 => (id, non_empty_text()).prop_map(|(id, name)| UnitKind::ToolCall { id, name }),
        1 => Just(UnitKind::Action),
        1 => Just(UnitKind::Event),
    ]
    .boxed()
}

impl Unit {
    /// The unit's messages, under message id `id`.
    fn messages(&self, id: &str) -> Vec<OutputMessage> {
        let (first, main, append_path): (OutputMessage, &str, Option<&str>) = match &self.kind {
            UnitKind::Text => (OutputMessage::text(&self.first), "content", None),
            UnitKind::Thinking => (OutputMessage::thinking(&self.first), "content", None),
            UnitKind::Loading => (OutputMessage::loading(&self.first), "message", None),
            UnitKind::ToolCall { id, name } => (OutputMessage::tool_call(id, name, &self.first), "arguments", None),
            UnitKind::Action => (
                OutputMessage::action("progress").with_prop("payload", json!({"log": self.first})),
                "payload",
                Some("payload.log"),
            ),
            UnitKind::Event => {
                (OutputMessage::event("progress").with_prop("message", self.first.as_str()), "message", Some("message"))
            }
        };
        let mut first = first;
        self.extras.clone().apply(&mut first);
        // A text message without deltas may go without an id.
        if !(self.appends.is_empty() && matches!(self.kind, UnitKind::Text) && self.first_is_delta) {
            first.message_id = Some(id.to_owned());
        }
        if self.first_is_delta && first.message_id.is_some() {
            first = first.as_delta(DeltaAction::Append, None);
        }
        let mut out = vec![first.clone()];
        for fragment in &self.appends {
            let path = append_path.or(self.explicit_path.then_some(main));
            let props = match path {
                Some("payload.log") => Map::from_iter([("payload".to_owned(), json!({"log": fragment}))]),
                _ => Map::from_iter([(main.to_owned(), Value::from(fragment.as_str()))]),
            };
            let mut delta = OutputMessage::new(first.kind.clone(), props).with_message_id(id);
            delta = delta.as_delta(DeltaAction::Append, path);
            if self.explicit_path {
                delta.delta_action = None;
            }
            out.push(delta);
        }
        out
    }
}

/// Interleaves several sequences, keeping each one's order; `picks` chooses which goes next.
fn interleave(mut sequences: Vec<std::collections::VecDeque<OutputMessage>>, picks: &[usize]) -> Vec<OutputMessage> {
    let mut out = Vec::new();
    let mut picks = picks.iter().cycle();
    sequences.retain(|s| !s.is_empty());
    while !sequences.is_empty() {
        let i = picks.next().copied().unwrap_or(0) % sequences.len();
        if let Some(message) = sequences[i].pop_front() {
            out.push(message);
        }
        if sequences[i].is_empty() {
            sequences.remove(i);
        }
    }
    out
}

/// An append-only stream: text messages one after another, other messages interleaved anywhere.
fn append_only_stream() -> BoxedStrategy<Vec<OutputMessage>> {
    (
        prop::collection::vec(unit(Just(UnitKind::Text).boxed()), 0..5),
        prop::collection::vec(unit(other_kind()), 0..5),
        prop::collection::vec(any::<usize>(), 1..16),
    )
        .prop_map(|(texts, others, picks)| {
            let text_stream: Vec<OutputMessage> =
                texts.iter().enumerate().flat_map(|(i, u)| u.messages(&format!("t{i}"))).collect();
            let mut sequences = vec![text_stream.into()];
            sequences.extend(others.iter().enumerate().map(|(i, u)| u.messages(&format!("o{i}")).into()));
            interleave(sequences, &picks)
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------------------
// The properties.
// ---------------------------------------------------------------------------------------------------------

/// Property 1 for one input.
fn renders_cleanly(messages: &[OutputMessage], options: &OpenAiOptions, ending: &Ending) -> Result<(), TestCaseError> {
    let mut cui = CuiAdapter;
    let mut cui_frames = Vec::new();
    for message in messages {
        prop_assert!(message.validate().is_ok(), "generator made an invalid message: {:?}", message);
        cui.push(message, &mut cui_frames);
    }
    for outcome in ending.outcomes() {
        let before = cui_frames.len();
        cui.finish(&outcome, &mut cui_frames);
        prop_assert_eq!(cui_frames.len(), before, "CUI finish adds nothing");
        for include_usage in [false, true] {
            let options = OpenAiOptions { include_usage, ..options.clone() };
            let frames = render_openai(&options, messages, &outcome);
            let summary = check_openai(&frames, &options, &outcome).map_err(|e| context(e, &outcome, messages))?;
            let completion = render_completion(&options, messages, &outcome)?;
            check_completion(&options, &summary, &completion).map_err(|e| context(e, &outcome, messages))?;
        }
    }
    check_cui(messages, &cui_frames.iter().map(agentmux::render::encode_sse).collect::<Vec<_>>())?;
    Ok(())
}

/// Property 2 for one input.
fn adds_up(messages: &[OutputMessage], options: OpenAiOptions, include_usage: bool) -> Result<(), TestCaseError> {
    let mut reducer = Reducer::default();
    for message in messages {
        prop_assert!(message.validate().is_ok(), "generator made an invalid message: {:?}", message);
        let applied = reducer.apply(message);
        prop_assert!(applied.is_ok(), "append refused: {:?} for {:?}", applied, message);
    }
    let options = OpenAiOptions { include_usage, ..options };
    let outcome = Outcome::completed().with_usage(Usage::new(3, 4));
    let frames = render_openai(&options, messages, &outcome);
    let summary = check_openai(&frames, &options, &outcome)?;
    prop_assert!(summary.error.is_none());

    let text = reducer.text();
    prop_assert_eq!(&summary.content, &text, "streamed content vs Reducer::text()\n{}", dump(messages));

    let calls: Vec<&OutputMessage> = reducer.messages().iter().filter(|m| m.kind == "tool_call").collect();
    prop_assert_eq!(calls.len(), summary.tools.len(), "tool calls streamed\n{}", dump(messages));
    for (call, (index, (id, name, arguments))) in calls.iter().zip(&summary.tools) {
        let expected_id = match call.prop_str("id") {
            Some("") | None => format!("call_{index}"),
            Some(id) => id.to_owned(),
        };
        prop_assert_eq!(id, &expected_id);
        prop_assert_eq!(Some(name.as_str()), call.prop_str("name"));
        prop_assert_eq!(Some(arguments.as_str()), call.prop_str("arguments"), "arguments of call {}", index);
    }

    let completion = render_completion(&options, messages, &outcome)?;
    check_completion(&options, &summary, &completion)?;
    let Ok(body) = completion else { unreachable!("checked above") };
    let message = &body["choices"][0]["message"];
    if text.is_empty() {
        prop_assert!(message["content"].is_null() || message["content"] == json!(""), "content: {}", body);
    } else {
        prop_assert_eq!(&message["content"], &json!(text), "response content\n{}", dump(messages));
    }
    let response_calls = message.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
    for (call, (_, (_, _, arguments))) in response_calls.iter().zip(&summary.tools) {
        prop_assert_eq!(&call["function"]["arguments"], &json!(arguments));
    }
    Ok(())
}

fn context(error: TestCaseError, outcome: &Outcome, messages: &[OutputMessage]) -> TestCaseError {
    TestCaseError::fail(format!("{error}\noutcome: {outcome:?}\nmessages:\n{}", dump(messages)))
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(256) })]

    /// Any valid stream renders through every adapter, for every ending, keeping the wire invariants.
    #[test]
    fn any_stream_renders_cleanly(messages in stream(), options in options(), ending in ending()) {
        renders_cleanly(&messages, &options, &ending)?;
    }

    /// For an append-only stream, streamed content and tool-call arguments add up to the reduced messages and
    /// to the non-streaming response.
    #[test]
    fn append_only_streams_add_up(messages in append_only_stream(), options in options(), usage in any::<bool>()) {
        adds_up(&messages, options, usage)?;
    }
}

// ---------------------------------------------------------------------------------------------------------
// Failures the properties once found in src/, kept as tests with the inputs proptest shrank to.
// ---------------------------------------------------------------------------------------------------------

fn completion_body(messages: &[OutputMessage]) -> Value {
    let mut completion = OpenAiCompletion::new(OpenAiOptions::new("chatcmpl-1", 0, "demo"));
    for message in messages {
        completion.push(message);
    }
    let body = completion.finish(&Outcome::completed()).expect("completed");
    serde_json::from_slice(&body).expect("JSON")
}

/// A tool call whose message later becomes another type (a resend or a `type_change`) is dropped from the
/// non-streaming `tool_calls`, and then `finish_reason` must not say `tool_calls`.
#[test]
fn completion_never_says_tool_calls_without_tool_calls() {
    let messages =
        [OutputMessage::tool_call("", "a", "").with_message_id("m0"), OutputMessage::text("").with_message_id("m0")];
    let body = completion_body(&messages);
    let choice = &body["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().map_or(0, Vec::len);
    assert!(choice["finish_reason"] != json!("tool_calls") || calls > 0, "{body}");
}

/// A tool call resent with an empty name after its header went out keeps the name the header carried.
#[test]
fn completion_tool_calls_have_names() {
    let messages = [
        OutputMessage::tool_call("", " ", "").with_message_id("m1"),
        OutputMessage::tool_call("", "", "").with_message_id("m1"),
    ];
    let body = completion_body(&messages);
    for call in body["choices"][0]["message"]["tool_calls"].as_array().into_iter().flatten() {
        assert!(call["function"]["name"].as_str().is_some_and(|n| !n.is_empty()), "{body}");
    }
}
