//! A model-based property test of the hub: random operations on a few streams sharing one hub, each checked
//! against a model of what the hub must do, and the hub's own invariants checked after every step.
//!
//! Each case draws limits small enough that refusals are common (`message_bytes`, `stream_bytes`, `hub_bytes`
//! shared by several streams, `messages_per_stream`), a batch size, and a list of operations: creating
//! streams; appending batches of new messages, deltas of every action (including ones the reducer refuses)
//! and invalid messages; retrying the last refused batch, sometimes after freeing space by ending and
//! evicting the other streams; ending messages, blocks and streams; subscribing in CUI and two OpenAI
//! variants at any sequence; reading a few batches; evicting what has passed its retention (by the hub's own
//! [`SteppingClock`]).
//!
//! The model predicts what it can exactly (invalid messages, refused deltas, `TooManyMessages`, `Ended`, the
//! lifecycle events around every message, the outcome of creating a stream and of subscribing) and bounds the
//! rest (a message's stamped size is known up to the digits of the ids the stream makes up). After every step:
//!
//! - the accepted log (`Stream::history`) has sequences `1..=n`, `snapshot.last_sequence == n`, and replayed
//!   into a fresh [`Reducer`] equals `snapshot.messages`; its entries are the ones the model expects, and the
//!   producer's messages reduce to what the model's reducer says;
//! - a refused batch changed nothing: history, snapshot, the stream's and the hub's byte counts are as before,
//!   so a retry is a fresh append (checked against the same model);
//! - an accepted batch added exactly its entries' JSON size per copy it is counted for (the log, plus one
//!   estimate per rendition in use), and the hub's count is the sum of what its streams hold;
//! - every batch a subscriber reads continues exactly the frames a fresh adapter renders over the accepted
//!   log (encoded with [`encode_sse`]), with a `last_sequence` that is a correct resume point; a subscriber
//!   that waits holds everything rendered so far; `lagged` comes only after its stream was evicted while it
//!   was behind, as its format's error frames, and is followed by `None`.
//!
//! At the end every stream is ended and every subscriber reads to its end: exactly the fresh adapter's frames
//! after the sequence it joined at (or a prefix and then the lagged notice, if its stream was evicted); then
//! everything is evicted and the hub holds no bytes. Nothing may panic. The test is synchronous: every read
//! polls `Subscription::next` once, so a read that would wait where the model says it must not is a failure,
//! not a hang.
//!
//! The stream's own closing events never pass a limit: every event that opens something (`message_start`,
//! `block_start`, `stream_start` for `stream_end`) reserves the room its closing event takes at most (that
//! event with every number at `u64::MAX`, the widest id the stream makes up; for `stream_end` any finish
//! reason and usage and an error of 64 bytes of message and code) and its place among the stream's messages,
//! and the outcome's copy is reserved beside it. The model computes that room from the log and checks after
//! every step that a stream's messages and bytes, reservations included, are within its limits, that every
//! closing event fits its room, and that closing gives back exactly the difference. Ends come both ways: the
//! internal `end` (never refused; an outcome larger than its room is kept when the limits have room for it,
//! else shrunk into it) and `try_end` (a producer's: refused, changing nothing, when it does not fit).
//!
//! One example test beside it pins the scenario of issue 9's first defect (a new delta refused by a full hub,
//! then retried) step by step.

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentmux::adapter::{AgentTools, ReasoningField};
use agentmux::hub::{
    AppendError, Batch, Hub, HubConfig, HubError, Limits, Status, Stream, SubscribeError, Subscription,
};
use agentmux::output::{DeltaAction, ErrorProps, EventProps, Metadata, Outcome, OutputMessage, Reducer, Usage};
use agentmux::render::{Format, encode_sse};
use bytes::Bytes;
use common::doubles::{CountingIds, SteppingClock};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};

type Checked = Result<(), TestCaseError>;

/// Where the hub's clock starts: every timestamp of a case has 13 digits, so sizes are predictable.
const START_MS: u64 = 1_700_000_000_000;
/// Long enough that nothing expires unless the test moves the clock on purpose.
const RETENTION: Duration = Duration::from_secs(3_600);
/// The producer's message ids; the stream's own ids (`m7-e2`) never look like these.
const IDS: [&str; 4] = ["a", "b", "c", "d"];
const BLOCKS: [&str; 2] = ["b1", "b2"];
const THREADS: [&str; 2] = ["t1", "t2"];
/// The events the stream adds by itself.
const LIFECYCLE: [&str; 6] = ["stream_start", "stream_end", "message_start", "message_end", "block_start", "block_end"];
const FORMATS: [Format; 3] = [
    Format::Cui,
    Format::OPENAI,
    Format::OpenAi { include_usage: true, reasoning: ReasoningField::Both, agent_tools: AgentTools::Hidden },
];
const MODEL_NAME: &str = "model";

// ---------------------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------------------

fn content() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z ]{0,12}",
        2 => "[a-zA-Z0-9 é日😀\"\\\\\n]{0,30}",
        1 => (40usize..400).prop_map(|n| "x".repeat(n)),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => content().prop_map(Value::from),
        1 => any::<i16>().prop_map(Value::from),
        1 => Just(Value::Null),
        1 => Just(json!({"n": 1, "s": "x"})),
        1 => Just(json!([1, "two"])),
    ]
}

fn producer_id() -> impl Strategy<Value = String> {
    prop::sample::select(&IDS[..]).prop_map(str::to_owned)
}

/// A message as a producer starts one: any type, with or without an id, block, thread, trace id or `delta`.
fn new_message() -> impl Strategy<Value = OutputMessage> {
    let body = prop_oneof![
        content().prop_map(OutputMessage::text),
        content().prop_map(OutputMessage::thinking),
        content().prop_map(|c| OutputMessage::tool_call("call_1", "search", c)),
        content().prop_map(OutputMessage::loading),
        content().prop_map(|c| OutputMessage::new("card", Map::new())
            .with_prop("content", c)
            .with_prop("meta", json!({"n": 0}))),
        content().prop_map(|c| OutputMessage::event("progress").with_prop("data", json!({ "note": c }))),
        Just(OutputMessage::image("https://example.com/a.png")),
        content().prop_map(OutputMessage::error),
    ];
    let block = prop::option::weighted(0.3, prop::sample::select(&BLOCKS[..]));
    let thread = prop::option::weighted(0.2, prop::sample::select(&THREADS[..]));
    (
        body,
        prop::option::weighted(0.7, producer_id()),
        block,
        thread,
        prop::bool::weighted(0.4),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(mut message, id, block, thread, delta, traced)| {
            message.message_id = id;
            message.block_id = block.map(str::to_owned);
            message.thread_id = thread.map(str::to_owned);
            message.delta = delta;
            if traced {
                // A producer's own sequence and time are overwritten; its trace id is kept.
                message.metadata =
                    Some(Metadata { sequence: Some(999_999), timestamp: Some(5), trace_id: Some("trace".into()) });
            }
            message
        })
}

/// A delta for one of the producer's ids: any type, action and path, often one the reducer refuses.
fn delta() -> impl Strategy<Value = OutputMessage> {
    let kind = prop::sample::select(&["text", "thinking", "card", "loading", "tool_call", "event"][..]);
    let key = prop::sample::select(&["content", "meta", "items", "arguments", "message"][..]);
    let action = prop::option::of(prop::sample::select(
        &[DeltaAction::Append, DeltaAction::Replace, DeltaAction::Merge, DeltaAction::Set][..],
    ));
    let path =
        prop::option::of(prop::sample::select(&["content", "meta", "meta.n", "items", "items.0", "items.5", ""][..]));
    (producer_id(), kind, key, value(), action, path, prop::bool::weighted(0.2), prop::bool::weighted(0.2)).prop_map(
        |(id, kind, key, value, action, path, nested, type_change)| {
            let value = if nested { json!({ "n": value }) } else { value };
            let mut message = OutputMessage::new(kind, Map::new()).with_prop(key, value).with_message_id(id);
            message.delta = true;
            message.delta_action = action;
            message.delta_path = path.map(str::to_owned);
            message.type_change = type_change;
            message
        },
    )
}

/// A message that fails validation.
fn invalid() -> impl Strategy<Value = OutputMessage> {
    prop_oneof![
        Just(OutputMessage::image("ftp://nope")),
        Just(OutputMessage::new("", Map::new())),
        Just(OutputMessage::new("text", Map::new())),
        Just(OutputMessage::new("text", Map::new()).with_prop("content", 5)),
    ]
}

fn batch() -> impl Strategy<Value = Vec<OutputMessage>> {
    prop::collection::vec(prop_oneof![6 => new_message(), 6 => delta(), 1 => invalid()], 1..4)
}

/// One step of a case. Streams and subscribers are picked by index modulo how many there are.
#[derive(Debug, Clone)]
enum Op {
    /// `Hub::create`: refused when the hub cannot hold the stream's `stream_start`.
    Create,
    /// `Stream::append_batch`, mostly on an open stream.
    Append { stream: usize, batch: Vec<OutputMessage> },
    /// Appends the last batch the full hub refused again; with `free`, first ends and evicts every other stream.
    Retry { free: bool },
    /// `Stream::subscribe` in one of [`FORMATS`], after a sequence up to one past the last.
    Subscribe { stream: usize, format: usize, after: usize },
    /// Up to `batches` polls of one subscriber.
    Read { reader: usize, batches: usize },
    /// `Stream::end_message` for one of the producer's ids, open or not.
    EndMessage { stream: usize, id: usize },
    /// `Stream::end_block` for one of the blocks, open or not.
    EndBlock { stream: usize, block: usize },
    /// `Stream::end` (or, `refusable`, `Stream::try_end`) with one of [`outcome`]'s outcomes.
    End { stream: usize, outcome: usize, refusable: bool },
    /// Moves the hub's clock past the retention and lets it evict every ended stream.
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    let pick = || 0usize..64;
    prop_oneof![
        2 => Just(Op::Create),
        12 => (pick(), batch()).prop_map(|(stream, batch)| Op::Append { stream, batch }),
        2 => any::<bool>().prop_map(|free| Op::Retry { free }),
        3 => (pick(), pick(), pick()).prop_map(|(stream, format, after)| Op::Subscribe { stream, format, after }),
        4 => (pick(), 1usize..4).prop_map(|(reader, batches)| Op::Read { reader, batches }),
        1 => (pick(), pick()).prop_map(|(stream, id)| Op::EndMessage { stream, id }),
        1 => (pick(), pick()).prop_map(|(stream, block)| Op::EndBlock { stream, block }),
        2 => (pick(), pick(), any::<bool>()).prop_map(|(stream, outcome, refusable)| Op::End {
            stream,
            outcome,
            refusable
        }),
        1 => Just(Op::Evict),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    (120u64..1_200, 2usize..40, 600u64..6_000, 800u64..12_000).prop_map(
        |(message_bytes, messages_per_stream, stream_bytes, hub_bytes)| Limits {
            message_bytes,
            messages_per_stream,
            stream_bytes,
            streams: 1_000,
            hub_bytes,
            ..Limits::default()
        },
    )
}

/// Small outcomes that always fit the room reserved for the end, and three that do not: an error with
/// details a little over the room (which the limits often have room for), a long one (over most message
/// size limits), and an error code over the name limit.
fn outcome(pick: usize) -> Outcome {
    let long = |repeat: usize, details: usize| {
        Outcome::failed(ErrorProps {
            message: "an error é日😀 \"quoted\" ".repeat(repeat),
            code: Some("agent_failed".into()),
            details: Some(json!({ "trace": "x".repeat(details) })),
        })
    };
    match pick % 7 {
        0 => Outcome::completed(),
        1 => Outcome::completed().with_usage(Usage::new(12, 34)),
        2 => Outcome::cancelled(),
        3 => Outcome::failed(ErrorProps { message: "boom".into(), code: Some("agent_failed".into()), details: None }),
        4 => long(8, 150),
        5 => long(30, 600),
        _ => Outcome::failed(ErrorProps { message: "a long code".into(), code: Some("c".repeat(300)), details: None }),
    }
}

// ---------------------------------------------------------------------------------------------------------
// The model of one stream
// ---------------------------------------------------------------------------------------------------------

/// What a log entry must be, as far as the model knows it: the producer's ids, blocks and threads, and for
/// the stream's own events their name and the message or block they are about. Ids the stream makes up are
/// `None`.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    kind: String,
    /// The lifecycle event's name, for the stream's own events.
    event: Option<String>,
    /// The producer's id of the message (`message_*`) or the block (`block_*`) the event is about.
    about: Option<String>,
    message_id: Option<String>,
    block_id: Option<String>,
    thread_id: Option<String>,
}

impl Shape {
    fn event(name: &str, about: Option<String>, block_id: Option<String>, thread_id: Option<String>) -> Shape {
        Shape { kind: "event".into(), event: Some(name.into()), about, message_id: None, block_id, thread_id }
    }

    /// The shape of an entry of the log.
    fn of(message: &OutputMessage) -> Shape {
        let ours = |id: Option<&str>| id.filter(|id| IDS.contains(id) || BLOCKS.contains(id)).map(str::to_owned);
        let lifecycle = message.prop_str("event").filter(|e| message.kind == "event" && LIFECYCLE.contains(e));
        match lifecycle {
            Some(name) => {
                let data = &message.props["data"];
                let about = data["message_id"].as_str().or(data["block_id"].as_str());
                Shape::event(name, ours(about), message.block_id.clone(), message.thread_id.clone())
            }
            None => Shape {
                kind: message.kind.clone(),
                event: None,
                about: None,
                message_id: ours(message.message_id.as_deref()),
                block_id: message.block_id.clone(),
                thread_id: message.thread_id.clone(),
            },
        }
    }
}

/// A message the lifecycle holds open; `id` is `None` for one whose id the stream made up.
#[derive(Debug, Clone)]
struct OpenMessage {
    id: Option<String>,
    block_id: Option<String>,
    thread_id: Option<String>,
}

#[derive(Debug, Clone)]
struct OpenBlock {
    id: String,
    thread_id: Option<String>,
}

/// What the model expects the stream's lifecycle to hold open.
#[derive(Debug, Clone, Default)]
struct Lifecycle {
    messages: Vec<OpenMessage>,
    blocks: Vec<OpenBlock>,
}

impl Lifecycle {
    fn end_message(&mut self, index: usize) -> Shape {
        let open = self.messages.remove(index);
        Shape::event("message_end", open.id, open.block_id, open.thread_id)
    }

    fn end_block(&mut self, block: &str) -> Vec<Shape> {
        let Some(index) = self.blocks.iter().position(|b| b.id == block) else { return Vec::new() };
        let mut shapes = Vec::new();
        while let Some(i) = self.messages.iter().position(|m| m.block_id.as_deref() == Some(block)) {
            shapes.push(self.end_message(i));
        }
        let open = self.blocks.remove(index);
        shapes.push(Shape::event("block_end", Some(open.id.clone()), Some(open.id), open.thread_id));
        shapes
    }

    fn end_all(&mut self) -> Vec<Shape> {
        let mut shapes = Vec::new();
        while let Some(i) = self.messages.iter().position(|m| m.block_id.is_none()) {
            shapes.push(self.end_message(i));
        }
        while let Some(block) = self.blocks.last().map(|b| b.id.clone()) {
            shapes.extend(self.end_block(&block));
        }
        while !self.messages.is_empty() {
            shapes.push(self.end_message(0));
        }
        shapes
    }
}

struct ModelStream {
    stream: Arc<Stream>,
    /// Still in the hub (not evicted).
    alive: bool,
    outcome: Option<Outcome>,
    /// The entries the log must hold.
    shapes: Vec<Shape>,
    /// The accepted log as last seen; kept after the stream is evicted, to check its subscribers.
    log: Vec<OutputMessage>,
    /// The producer's messages (with the block and thread they inherit), reduced.
    user: Reducer,
    lifecycle: Lifecycle,
    /// Formats with a rendition: each counts every entry once more.
    formats: Vec<Format>,
}

impl ModelStream {
    fn log_bytes(&self) -> u64 {
        self.log.iter().map(json_len).sum()
    }

    /// What the stream counts against its limits: the log, the room reserved for closing what is open, and
    /// the room for `stream_end` while the stream is open.
    fn counted(&self) -> u64 {
        let short = self.short_epoch();
        let end = if self.outcome.is_none() { end_room(&short) } else { 0 };
        self.log_bytes() + open_rooms(&self.log, &short).0 + end
    }

    /// Closing events reserved: one per open message and block, and `stream_end` while open.
    fn closings(&self) -> u64 {
        open_rooms(&self.log, &self.short_epoch()).1 + u64::from(self.outcome.is_none())
    }

    /// What the hub counts once for the outcome: its room while open, its size once ended.
    fn outcome_counted(&self) -> u64 {
        self.outcome.as_ref().map_or_else(outcome_room, |o| serde_json::to_vec(o).map_or(0, |v| v.len() as u64))
    }

    /// The log, the producer's reduction, the snapshot's reduction, and each rendition.
    fn copies(&self) -> u64 {
        3 + self.formats.len() as u64
    }

    /// The stream's short epoch, as in the ids it makes up (`m7-<short>`).
    fn short_epoch(&self) -> String {
        let epoch = self.stream.epoch();
        epoch.get(..8).unwrap_or(epoch).to_owned()
    }
}

fn json_len(message: &OutputMessage) -> u64 {
    serde_json::to_vec(message).map_or(0, |json| json.len() as u64)
}

/// `message` as the stream stamps it, with `made_up` as its id when the producer gave none.
fn stamped(message: &OutputMessage, made_up: &str, sequence: u64) -> OutputMessage {
    let mut message = message.clone();
    if message.message_id.is_none() {
        message.message_id = Some(made_up.to_owned());
    }
    let trace_id = message.metadata.take().and_then(|m| m.trace_id);
    message.metadata = Some(Metadata { sequence: Some(sequence), timestamp: Some(START_MS), trace_id });
    message
}

/// The lowest and highest stamped size of `message`, over the ids the stream may make up (`m1-e2` to
/// `m99999-e2`): the digits of the counter are all the model does not know.
fn size_bounds(message: &OutputMessage, short_epoch: &str, sequence: u64) -> (u64, u64) {
    let low = json_len(&stamped(message, &format!("m1-{short_epoch}"), sequence));
    let high = json_len(&stamped(message, &format!("m99999-{short_epoch}"), sequence));
    (low, high)
}

/// One of the stream's own events, as the lifecycle writes it (before stamping).
fn lifecycle_event(name: &str, data: Value, block_id: Option<String>, thread_id: Option<String>) -> OutputMessage {
    let Value::Object(data) = data else { unreachable!("event data is an object") };
    let mut event = OutputMessage::builtin(EventProps { event: name.to_owned(), message: None, data: Some(data) });
    event.block_id = block_id;
    event.thread_id = thread_id;
    event
}

/// The name of a lifecycle event, if the message is one.
fn lifecycle_name(message: &OutputMessage) -> Option<&str> {
    message.prop_str("event").filter(|e| message.kind == "event" && LIFECYCLE.contains(e))
}

/// The room reserved for a closing event, given its widest form: its size stamped with the widest id the
/// stream can make up (`m18446744073709551615-<short epoch>`) and `u64::MAX` as sequence and time.
fn room(widest: &OutputMessage, short_epoch: &str) -> u64 {
    let mut widest = widest.clone();
    widest.message_id = Some(format!("m{}-{short_epoch}", u64::MAX));
    widest.metadata = Some(Metadata { sequence: Some(u64::MAX), timestamp: Some(u64::MAX), trace_id: None });
    json_len(&widest)
}

/// The widest event that closes what `start` (a `message_start` or `block_start`) opened: every number at
/// `u64::MAX`.
fn widest_end(start: &OutputMessage) -> OutputMessage {
    let data = &start.props["data"];
    match start.prop_str("event") {
        Some("message_start") => lifecycle_event(
            "message_end",
            json!({ "message_id": data["message_id"], "type": data["type"], "chunk_count": u64::MAX,
                "duration_ms": u64::MAX }),
            start.block_id.clone(),
            start.thread_id.clone(),
        ),
        _ => lifecycle_event(
            "block_end",
            json!({ "block_id": data["block_id"], "message_count": u64::MAX, "duration_ms": u64::MAX }),
            start.block_id.clone(),
            start.thread_id.clone(),
        ),
    }
}

/// The widest closing form of a closing event in the log (its numbers at `u64::MAX`).
fn widen(closing: &OutputMessage) -> OutputMessage {
    let mut widest = closing.clone();
    if let Some(Value::Object(data)) = widest.props.get_mut("data") {
        for value in data.values_mut() {
            if value.is_number() {
                *value = json!(u64::MAX);
            }
        }
    }
    widest
}

/// The room reserved for closing what `log` leaves open, and how many closing events that is.
fn open_rooms(log: &[OutputMessage], short_epoch: &str) -> (u64, u64) {
    let mut open: Vec<(&str, String, u64)> = Vec::new();
    for message in log {
        let data = message.props.get("data").unwrap_or(&Value::Null);
        let id = |key: &str| data[key].as_str().unwrap_or_default().to_owned();
        match lifecycle_name(message) {
            Some("message_start") => {
                open.push(("message", id("message_id"), room(&widest_end(message), short_epoch)));
            }
            Some("block_start") => open.push(("block", id("block_id"), room(&widest_end(message), short_epoch))),
            Some(end @ ("message_end" | "block_end")) => {
                let (kind, key) = if end == "message_end" { ("message", "message_id") } else { ("block", "block_id") };
                let wanted = id(key);
                if let Some(at) = open.iter().rposition(|(k, i, _)| *k == kind && *i == wanted) {
                    open.remove(at);
                }
            }
            _ => {}
        }
    }
    (open.iter().map(|(_, _, room)| room).sum(), open.len() as u64)
}

/// The widest outcome an end that cannot be refused keeps whole (the room reserved for it): the longest
/// status, finish reason and usage (its cache details too), and an error of 64 bytes of message and of code.
fn widest_outcome() -> Outcome {
    let most = "x".repeat(64);
    Outcome {
        finish_reason: Some(agentmux::output::FinishReason::ContentFilter),
        usage: Some(Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            total_tokens: u64::MAX,
            prompt_tokens_details: Some(agentmux::output::PromptTokensDetails {
                cached_tokens: u64::MAX,
                cache_creation_tokens: Some(u64::MAX),
            }),
        }),
        error: Some(ErrorProps { message: most.clone(), code: Some(most), details: None }),
        ..Outcome::completed()
    }
}

/// `stream_end` for `outcome` after `duration_ms`, as the lifecycle writes it.
fn stream_end(outcome: &Outcome, duration_ms: u64) -> OutputMessage {
    let mut data = json!({ "status": Status::of(Some(outcome)), "duration_ms": duration_ms });
    if let Some(reason) = outcome.finish_reason {
        data["finish_reason"] = json!(reason);
    }
    if let Some(usage) = &outcome.usage {
        data["usage"] = json!(usage);
    }
    if let Some(error) = &outcome.error {
        data["error"] = json!(error);
    }
    lifecycle_event("stream_end", data, None, None)
}

/// The room reserved for `stream_end`.
fn end_room(short_epoch: &str) -> u64 {
    room(&stream_end(&widest_outcome(), u64::MAX), short_epoch)
}

/// The room reserved for the outcome's copy.
fn outcome_room() -> u64 {
    serde_json::to_vec(&widest_outcome()).map_or(0, |v| v.len() as u64)
}

/// Whether a limit refuses, given the lowest and highest size it may see.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    Pass,
    Refuse,
    Unsure,
}

fn verdict(low_over: bool, high_over: bool) -> Verdict {
    match (low_over, high_over) {
        (true, _) => Verdict::Refuse,
        (false, false) => Verdict::Pass,
        (false, true) => Verdict::Unsure,
    }
}

/// What the model says about one message of a batch: each check in the order the stream makes them.
#[derive(Debug, Clone)]
struct Checks {
    message_size: (u64, u64),
    too_large: Verdict,
    too_many: Verdict,
    stream_full: Verdict,
    hub_full: Verdict,
    delta_refused: bool,
}

impl Checks {
    fn all_pass(&self) -> bool {
        [self.too_large, self.too_many, self.stream_full, self.hub_full].iter().all(|v| *v != Verdict::Refuse)
            && !self.delta_refused
    }
}

/// The model's plan for a batch: per message its checks, and if it is accepted, the entries it adds and the
/// state after it.
struct Plan {
    checks: Vec<Checks>,
    /// Expected new entries with their size bounds.
    entries: Vec<(Shape, u64, u64)>,
    sequences: Vec<u64>,
    user: Reducer,
    lifecycle: Lifecycle,
}

fn plan(model: &ModelStream, batch: &[OutputMessage], limits: &Limits, hub_bytes: u64) -> Plan {
    let short = model.short_epoch();
    let mut user = model.user.clone();
    let mut lifecycle = model.lifecycle.clone();
    let mut last = model.log.len() as u64;
    let counted = model.counted();
    let mut closings = model.closings();
    let copies = model.copies();
    let (mut low_total, mut high_total) = (0u64, 0u64);
    let mut checks = Vec::new();
    let mut entries = Vec::new();
    let mut sequences = Vec::new();
    for message in batch {
        let mut message = message.clone();
        let known = message
            .message_id
            .as_deref()
            .and_then(|id| user.get(id))
            .map(|s| (s.block_id.clone(), s.thread_id.clone()));
        let new = known.is_none();
        if let Some((block_id, thread_id)) = known {
            if message.block_id.is_none() {
                message.block_id = block_id;
            }
            if message.thread_id.is_none() {
                message.thread_id = thread_id;
            }
        }
        let mut events = Vec::new();
        if let (Some(block), true) = (&message.block_id, new)
            && !lifecycle.blocks.iter().any(|b| &b.id == block)
        {
            let event = lifecycle_event(
                "block_start",
                json!({ "block_id": block }),
                Some(block.clone()),
                message.thread_id.clone(),
            );
            events.push((
                Shape::event("block_start", Some(block.clone()), Some(block.clone()), message.thread_id.clone()),
                event,
            ));
            lifecycle.blocks.push(OpenBlock { id: block.clone(), thread_id: message.thread_id.clone() });
        }
        let open = message.message_id.is_some() && lifecycle.messages.iter().any(|m| m.id == message.message_id);
        if !open && message.delta && new {
            // The data names the message by its id, which the stream makes up when the producer gave none.
            let named = message.message_id.clone().unwrap_or_else(|| format!("m99999-{short}"));
            let event = lifecycle_event(
                "message_start",
                json!({ "message_id": named, "type": message.kind }),
                message.block_id.clone(),
                message.thread_id.clone(),
            );
            let shape = Shape::event(
                "message_start",
                message.message_id.clone(),
                message.block_id.clone(),
                message.thread_id.clone(),
            );
            events.push((shape, event));
            lifecycle.messages.push(OpenMessage {
                id: message.message_id.clone(),
                block_id: message.block_id.clone(),
                thread_id: message.thread_id.clone(),
            });
        }
        for (shape, event) in events {
            last += 1;
            let (mut low, high) = size_bounds(&event, &short, last);
            // The room for the event that will close what it opens, and its place.
            let (mut room_low, room_high) = (room(&widest_end(&event), &short), room(&widest_end(&event), &short));
            if shape.event.as_deref() == Some("message_start") && shape.about.is_none() {
                // Its data names a made-up id too: as short as `m1-…` at the lowest.
                let mut shortest = event.clone();
                shortest.props["data"]["message_id"] = json!(format!("m1-{short}"));
                low = size_bounds(&shortest, &short, last).0;
                room_low = room(&widest_end(&shortest), &short);
            }
            closings += 1;
            low_total += low + room_low;
            high_total += high + room_high;
            entries.push((shape, low, high));
        }
        last += 1;
        let (low, high) = size_bounds(&message, &short, last);
        low_total += low;
        high_total += high;
        let delta_refused = user.apply(&message).is_err();
        checks.push(Checks {
            message_size: (low, high),
            too_large: verdict(low > limits.message_bytes, high > limits.message_bytes),
            too_many: verdict(
                last + closings > limits.messages_per_stream as u64,
                last + closings > limits.messages_per_stream as u64,
            ),
            stream_full: verdict(counted + low_total > limits.stream_bytes, counted + high_total > limits.stream_bytes),
            hub_full: verdict(
                hub_bytes + copies * low_total > limits.hub_bytes,
                hub_bytes + copies * high_total > limits.hub_bytes,
            ),
            delta_refused,
        });
        entries.push((Shape::of(&message), low, high));
        sequences.push(last);
    }
    Plan { checks, entries, sequences, user, lifecycle }
}

/// Checks a refused or accepted batch against the plan (validation and the end are checked before).
fn check_outcome(plan: &Plan, result: &Result<Vec<u64>, agentmux::hub::BatchError>) -> Checked {
    match result {
        Ok(sequences) => {
            for (index, checks) in plan.checks.iter().enumerate() {
                prop_assert!(checks.all_pass(), "message {index} should have been refused: {checks:?}");
            }
            prop_assert_eq!(sequences, &plan.sequences, "the sequences the batch was given");
        }
        Err(error) => {
            let index = error.index;
            prop_assert!(index < plan.checks.len(), "refused at {index} of a batch of {}", plan.checks.len());
            for (earlier, checks) in plan.checks[..index].iter().enumerate() {
                prop_assert!(
                    checks.all_pass(),
                    "message {earlier} should have been refused before {index}: {checks:?}"
                );
            }
            let checks = &plan.checks[index];
            // The checks in the stream's order; the one that refused may not be a sure pass, and none before it
            // may be a sure refusal.
            let order = [
                checks.too_large,
                checks.too_many,
                checks.stream_full,
                checks.hub_full,
                verdict(checks.delta_refused, checks.delta_refused),
            ];
            let at = match &error.error {
                AppendError::MessageTooLarge { size, .. } => {
                    let (low, high) = checks.message_size;
                    prop_assert!((low..=high).contains(size), "the stamped size {size} is outside {low}..={high}");
                    0
                }
                AppendError::TooManyMessages { .. } => 1,
                AppendError::StreamFull { .. } => 2,
                AppendError::HubFull { .. } => 3,
                AppendError::Delta(_) => 4,
                other => return Err(TestCaseError::fail(format!("unexpected refusal {other:?}"))),
            };
            prop_assert!(order[at] != Verdict::Pass, "refused by a check that passes for sure: {error} ({checks:?})");
            for (before, verdict) in order[..at].iter().enumerate() {
                prop_assert!(
                    *verdict != Verdict::Refuse,
                    "check {before} should have refused first: {error} ({checks:?})"
                );
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// Rendering, as a fresh adapter does it
// ---------------------------------------------------------------------------------------------------------

/// A fresh adapter's frames over `log` (and the end, once there is one), SSE-encoded, and after how many
/// frames each message's frames end.
fn render(
    format: Format,
    stream: &Stream,
    log: &[OutputMessage],
    outcome: Option<&Outcome>,
) -> (Vec<Bytes>, Vec<usize>) {
    let mut adapter = format.adapter(stream.info());
    let (mut frames, mut ends) = (Vec::new(), Vec::with_capacity(log.len()));
    for message in log {
        adapter.push(message, &mut frames);
        ends.push(frames.len());
    }
    if let Some(outcome) = outcome {
        adapter.finish(outcome, &mut frames);
    }
    (frames.iter().map(encode_sse).collect(), ends)
}

/// The first frame after sequence `after`.
fn start_after(ends: &[usize], after: u64) -> usize {
    after.checked_sub(1).map_or(0, |i| ends[i as usize])
}

/// The sequences a subscriber holding frames up to `position` may resume after: every message whose frames
/// end before it, and at most every message whose frames end at it (messages without frames of their own).
fn resume_bounds(ends: &[usize], position: usize) -> (u64, u64) {
    (
        ends.iter().filter(|&&end| end < position).count() as u64,
        ends.iter().filter(|&&end| end <= position).count() as u64,
    )
}

fn frame_json(frame: &[u8]) -> Value {
    let text = std::str::from_utf8(frame).unwrap_or_default();
    let data = text.split_once("data: ").map_or("", |(_, data)| data).trim_end();
    serde_json::from_str(data).unwrap_or(Value::Null)
}

// ---------------------------------------------------------------------------------------------------------
// The world: the hub, the model of each stream, the subscribers
// ---------------------------------------------------------------------------------------------------------

struct Reader {
    stream: usize,
    format: Format,
    after: u64,
    subscription: Subscription,
    frames: Vec<Bytes>,
    /// The `last_sequence` of its last batch (`after` before the first).
    last_sequence: u64,
    lagged: bool,
    /// It got `None`.
    finished: bool,
}

/// What one poll of a subscription gave.
enum Polled {
    Batch(Batch),
    End,
    Waiting,
}

struct World {
    hub: Hub,
    clock: Arc<SteppingClock>,
    limits: Limits,
    batch_bytes: u64,
    streams: Vec<ModelStream>,
    readers: Vec<Reader>,
    /// Calls of `Hub::create`: each takes a stream id and an epoch from the counting ids.
    creates: u64,
    /// The last batch refused for want of room in the hub, and its stream: what `Op::Retry` appends again.
    refused: Option<(usize, Vec<OutputMessage>)>,
}

impl World {
    fn new(limits: Limits, batch_bytes: u64) -> World {
        let clock = Arc::new(SteppingClock::new(START_MS));
        let hub = Hub::new(HubConfig {
            limits: limits.clone(),
            batch_bytes,
            retention: RETENTION,
            // The model does not model the idle timeout; `tests/service_abuse.rs` covers it.
            idle_timeout: std::time::Duration::ZERO,
            clock: Arc::clone(&clock) as _,
            ids: Arc::new(CountingIds::default()),
            ..HubConfig::default()
        });
        World { hub, clock, limits, batch_bytes, streams: Vec::new(), readers: Vec::new(), creates: 0, refused: None }
    }

    /// The stream picked by `pick` among those still in the hub.
    fn alive(&self, pick: usize) -> Option<usize> {
        let alive: Vec<usize> = (0..self.streams.len()).filter(|&i| self.streams[i].alive).collect();
        (!alive.is_empty()).then(|| alive[pick % alive.len()])
    }

    /// The stream picked by `pick` among those still open, most of the time; `None` otherwise.
    fn open(&self, pick: usize) -> Option<usize> {
        let open: Vec<usize> =
            (0..self.streams.len()).filter(|&i| self.streams[i].alive && self.streams[i].outcome.is_none()).collect();
        (!open.is_empty() && !pick.is_multiple_of(8)).then(|| open[pick % open.len()])
    }

    fn run(&mut self, op: &Op) -> Checked {
        match op {
            Op::Create => self.create(),
            Op::Append { stream, batch } => match self.open(*stream).or_else(|| self.alive(*stream)) {
                Some(s) => self.append(s, batch.clone()),
                None => Ok(()),
            },
            Op::Retry { free } => self.retry(*free),
            Op::Subscribe { stream, format, after } => match self.alive(*stream) {
                Some(s) => self.subscribe(s, FORMATS[format % FORMATS.len()], *after),
                None => Ok(()),
            },
            Op::Read { reader, batches } => match self.readers.len() {
                0 => Ok(()),
                n => self.read(reader % n, *batches),
            },
            Op::EndMessage { stream, id } => match self.alive(*stream) {
                Some(s) => self.end_message(s, IDS[id % IDS.len()]),
                None => Ok(()),
            },
            Op::EndBlock { stream, block } => match self.alive(*stream) {
                Some(s) => self.end_block(s, BLOCKS[block % BLOCKS.len()]),
                None => Ok(()),
            },
            Op::End { stream, outcome: pick, refusable } => match self.alive(*stream) {
                Some(s) => self.end(s, outcome(*pick), *refusable),
                None => Ok(()),
            },
            Op::Evict => self.evict(),
        }
    }

    fn create(&mut self) -> Checked {
        self.creates += 1;
        let (stream_id, epoch) = (format!("s{}", 2 * self.creates - 1), format!("e{}", 2 * self.creates));
        let short = epoch.get(..8).unwrap_or(&epoch).to_owned();
        let start = lifecycle_event(
            "stream_start",
            json!({ "stream_id": stream_id, "epoch": epoch, "model": MODEL_NAME }),
            None,
            None,
        );
        let size = json_len(&stamped(&start, &format!("m1-{short}"), 1));
        // The stream's own first and last events, and the outcome's copy.
        let (end, outcome) = (end_room(&short), outcome_room());
        let before = self.hub.bytes();
        match self.hub.create(MODEL_NAME) {
            Ok(stream) => {
                prop_assert!(
                    before + 2 * (size + end) + outcome <= self.limits.hub_bytes,
                    "created a stream of {size} + {end} (twice) + {outcome} bytes in a hub holding {before}"
                );
                prop_assert!(size + end <= self.limits.stream_bytes, "created a stream its limit cannot hold");
                prop_assert_eq!((stream.id(), stream.epoch()), (stream_id.as_str(), epoch.as_str()));
                prop_assert_eq!(
                    self.hub.bytes(),
                    before + 2 * (size + end) + outcome,
                    "a new stream counts its stream_start and the room for its end, in its log and its reduction"
                );
                // The snapshot is a reader of the log with a reduction of its own, counted like a
                // rendition from its first use: make it now, so it is in every later count.
                stream.snapshot();
                prop_assert_eq!(
                    self.hub.bytes(),
                    before + 3 * (size + end) + outcome,
                    "the snapshot's reduction counts the log and the room for stream_end once more"
                );
                self.streams.push(ModelStream {
                    stream,
                    alive: true,
                    outcome: None,
                    shapes: vec![Shape::event("stream_start", None, None, None)],
                    log: Vec::new(),
                    user: Reducer::default(),
                    lifecycle: Lifecycle::default(),
                    formats: Vec::new(),
                });
            }
            Err(HubError::StreamLimitsTooSmall { messages, bytes, needed }) => {
                prop_assert_eq!(
                    (messages, bytes, needed),
                    (self.limits.messages_per_stream, self.limits.stream_bytes, size + end)
                );
                prop_assert!(needed > bytes || messages < 2, "refused a stream its limits hold");
                prop_assert_eq!(self.hub.bytes(), before, "a refused stream counts nothing");
            }
            Err(HubError::HubFull { limit, .. }) => {
                prop_assert_eq!(limit, self.limits.hub_bytes);
                prop_assert!(size + end <= self.limits.stream_bytes, "HubFull for a stream its limits refuse");
                prop_assert!(
                    before + 2 * (size + end) + outcome > limit,
                    "refused a stream of {size} + {end} (twice) + {outcome} bytes in a hub holding {before} of {limit}"
                );
                prop_assert_eq!(self.hub.bytes(), before, "a refused stream counts nothing");
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
        }
        Ok(())
    }

    fn append(&mut self, s: usize, batch: Vec<OutputMessage>) -> Checked {
        let model = &self.streams[s];
        let stream = Arc::clone(&model.stream);
        let (history, snapshot) = (stream.history(), stream.snapshot());
        let (hub_before, held_before) = (self.hub.bytes(), stream.held_bytes());
        let plan = plan(model, &batch, &self.limits, hub_before);
        let invalid = batch.iter().position(|m| m.validate().is_err());

        let result = stream.append_batch(batch.clone());

        match (&result, invalid, &model.outcome) {
            (Err(error), Some(index), _) => {
                prop_assert_eq!(error.index, index, "the first invalid message is named");
                prop_assert!(matches!(error.error, AppendError::Invalid(_)), "{error}");
            }
            (_, Some(index), _) => {
                return Err(TestCaseError::fail(format!("invalid message {index} accepted: {result:?}")));
            }
            (Err(error), None, Some(_)) => prop_assert_eq!(&error.error, &AppendError::Ended),
            (Ok(_), None, Some(_)) => return Err(TestCaseError::fail("appended to an ended stream")),
            (_, None, None) => check_outcome(&plan, &result)?,
        }
        match result {
            Ok(_) => {
                let model = &mut self.streams[s];
                let added: Vec<OutputMessage> = stream.history().split_off(history.len());
                prop_assert_eq!(added.len(), plan.entries.len(), "entries the batch added");
                for (entry, (_, low, high)) in added.iter().zip(&plan.entries) {
                    let size = json_len(entry);
                    prop_assert!(
                        (*low..=*high).contains(&size),
                        "entry of {size} bytes outside {low}..={high}: {entry:?}"
                    );
                }
                let added_bytes: u64 = added.iter().map(json_len).sum();
                // The room for closing what the batch opened counts with it.
                let short = model.short_epoch();
                let rooms = open_rooms(&stream.history(), &short).0 - open_rooms(&history, &short).0;
                prop_assert_eq!(
                    self.hub.bytes() - hub_before,
                    (added_bytes + rooms) * model.copies(),
                    "the hub counts the batch and its rooms once for the log and once per rendition in use"
                );
                prop_assert_eq!(stream.held_bytes() - held_before, (added_bytes + rooms) * model.copies());
                model.shapes.extend(plan.entries.into_iter().map(|(shape, _, _)| shape));
                model.user = plan.user;
                model.lifecycle = plan.lifecycle;
                if self.refused.as_ref().is_some_and(|(r, b)| *r == s && *b == batch) {
                    self.refused = None;
                }
            }
            Err(error) => {
                prop_assert_eq!(&stream.history(), &history, "a refused batch changed the log");
                let after = stream.snapshot();
                prop_assert_eq!(&after.messages, &snapshot.messages, "a refused batch changed the snapshot");
                prop_assert_eq!(after.last_sequence, snapshot.last_sequence);
                prop_assert_eq!(after.status, snapshot.status);
                prop_assert_eq!(self.hub.bytes(), hub_before, "a refused batch changed the hub's byte count");
                prop_assert_eq!(stream.held_bytes(), held_before, "a refused batch changed the stream's byte count");
                if matches!(error.error, AppendError::HubFull { .. }) {
                    self.refused = Some((s, batch));
                }
            }
        }
        Ok(())
    }

    fn retry(&mut self, free: bool) -> Checked {
        let Some((s, batch)) = self.refused.clone() else { return Ok(()) };
        if free {
            for other in 0..self.streams.len() {
                if other != s && self.streams[other].alive && self.streams[other].outcome.is_none() {
                    self.end(other, Outcome::completed(), false)?;
                    self.check()?;
                }
            }
            self.evict()?;
            self.check()?;
        }
        if self.streams[s].alive { self.append(s, batch) } else { Ok(()) }
    }

    fn subscribe(&mut self, s: usize, format: Format, pick: usize) -> Checked {
        let model = &self.streams[s];
        let last = model.log.len() as u64;
        let after = pick as u64 % (last + 2);
        let before = self.hub.bytes();
        let needs_rendition = !model.formats.contains(&format);
        match model.stream.subscribe(format, after) {
            Ok(subscription) => {
                prop_assert!(after <= last, "subscribed after {after}, beyond the last sequence {last}");
                prop_assert!(
                    !needs_rendition || before + model.counted() <= self.limits.hub_bytes,
                    "a new rendition of {} bytes fit in a hub holding {before}",
                    model.counted()
                );
                if needs_rendition {
                    self.streams[s].formats.push(format);
                }
                self.readers.push(Reader {
                    stream: s,
                    format,
                    after,
                    subscription,
                    frames: Vec::new(),
                    last_sequence: after,
                    lagged: false,
                    finished: false,
                });
            }
            Err(SubscribeError::SequenceAhead { from, last: reported }) => {
                prop_assert_eq!((from, reported), (after, last));
                prop_assert!(after > last);
                prop_assert_eq!(self.hub.bytes(), before);
            }
            Err(SubscribeError::HubFull { limit }) => {
                prop_assert!(after <= last);
                prop_assert!(needs_rendition, "refused a subscriber of a format already rendered");
                prop_assert!(before + model.counted() > limit, "refused a rendition that fit");
                prop_assert_eq!(self.hub.bytes(), before, "a refused subscription counts nothing");
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
        }
        Ok(())
    }

    fn poll(&mut self, r: usize) -> Polled {
        match self.readers[r].subscription.try_next() {
            Some(Some(batch)) => Polled::Batch(batch),
            Some(None) => Polled::End,
            None => Polled::Waiting,
        }
    }

    fn read(&mut self, r: usize, batches: usize) -> Checked {
        for _ in 0..batches {
            if !self.read_one(r)? {
                break;
            }
        }
        Ok(())
    }

    /// Takes one poll of reader `r` and checks it; `false` when it has nothing more now.
    fn read_one(&mut self, r: usize) -> Result<bool, TestCaseError> {
        let polled = self.poll(r);
        let reader = &self.readers[r];
        let model = &self.streams[reader.stream];
        let (full, ends) = render(reader.format, &model.stream, &model.log, model.outcome.as_ref());
        let start = start_after(&ends, reader.after);
        let expected = &full[start..];
        let what = format!("{:?} subscriber of stream {} after {}", reader.format, reader.stream, reader.after);
        match polled {
            Polled::Waiting => {
                prop_assert!(model.alive && model.outcome.is_none(), "{what} waits on a stream that ended");
                prop_assert!(!reader.finished && !reader.lagged, "{what} waits after its end");
                prop_assert_eq!(reader.frames.len(), expected.len(), "{} waits while frames are there to take", what);
                Ok(false)
            }
            Polled::End => {
                if !reader.lagged && !reader.finished {
                    // An OpenAI view ends at its `[DONE]`, which an error message sends before the stream ends.
                    let done = full.last().is_some_and(|frame| &frame[..] == b"data: [DONE]\n\n");
                    prop_assert!(model.outcome.is_some() || done, "{what} ended on an open stream");
                    prop_assert!(reader.frames == expected, "{what} ended without every frame");
                }
                self.readers[r].finished = true;
                Ok(false)
            }
            Polled::Batch(batch) => {
                prop_assert!(!reader.finished && !reader.lagged, "{what} got a batch after its end");
                let frames = batch.frames();
                prop_assert_eq!(batch.len(), frames.iter().map(Bytes::len).sum::<usize>());
                let position = start + reader.frames.len();
                if batch.lagged {
                    prop_assert!(!model.alive, "{what} lagged while its stream is kept");
                    prop_assert!(
                        reader.frames.len() < expected.len(),
                        "{what} held every frame, yet got lagged instead of its end: {frames:?}"
                    );
                    let (low, high) = resume_bounds(&ends, position);
                    prop_assert!(
                        (low.max(reader.last_sequence)..=high).contains(&batch.last_sequence),
                        "{what}: lagged at {}, outside {low}..={high}",
                        batch.last_sequence
                    );
                    check_lagged(reader.format, &frames, model.log.len() as u64)?;
                    let reader = &mut self.readers[r];
                    reader.lagged = true;
                    reader.last_sequence = batch.last_sequence;
                    return Ok(true);
                }
                prop_assert!(!frames.is_empty(), "{what}: an empty batch");
                prop_assert!(
                    batch.len() as u64 <= self.batch_bytes || frames.len() == 1,
                    "{what}: a batch of {} bytes in {} frames, over {}",
                    batch.len(),
                    frames.len(),
                    self.batch_bytes
                );
                let end = reader.frames.len() + frames.len();
                prop_assert!(end <= expected.len(), "{what}: more frames than the log renders to");
                prop_assert!(
                    frames[..] == expected[reader.frames.len()..end],
                    "{what}: frames differ from a fresh adapter's"
                );
                let (low, high) = resume_bounds(&ends, start + end);
                prop_assert!(
                    (low.max(reader.last_sequence)..=high).contains(&batch.last_sequence),
                    "{what}: last_sequence {} outside {low}..={high} (previous {})",
                    batch.last_sequence,
                    reader.last_sequence
                );
                let reader = &mut self.readers[r];
                reader.frames.extend(frames);
                reader.last_sequence = batch.last_sequence;
                Ok(true)
            }
        }
    }

    /// The hub's and stream `s`'s byte counts.
    fn counts(&self, s: usize) -> (u64, u64) {
        (self.hub.bytes(), self.streams[s].stream.held_bytes())
    }

    fn end_message(&mut self, s: usize, id: &str) -> Checked {
        let before = self.counts(s);
        let model = &mut self.streams[s];
        let result = model.stream.end_message(id);
        if model.outcome.is_some() {
            return expect_ended(result);
        }
        let shapes: Vec<Shape> = match model.lifecycle.messages.iter().position(|m| m.id.as_deref() == Some(id)) {
            Some(index) => vec![model.lifecycle.end_message(index)],
            None => Vec::new(),
        };
        let last = (!shapes.is_empty()).then_some(model.log.len() as u64 + shapes.len() as u64);
        prop_assert_eq!(result, Ok(last), "end_message({}) gives the last sequence of what it appended", id);
        self.forced(s, before, shapes, false)
    }

    fn end_block(&mut self, s: usize, block: &str) -> Checked {
        let before = self.counts(s);
        let model = &mut self.streams[s];
        let result = model.stream.end_block(block);
        if model.outcome.is_some() {
            return expect_ended(result);
        }
        let shapes = model.lifecycle.end_block(block);
        let last = (!shapes.is_empty()).then_some(model.log.len() as u64 + shapes.len() as u64);
        prop_assert_eq!(result, Ok(last), "end_block({}) gives the last sequence of what it appended", block);
        self.forced(s, before, shapes, false)
    }

    /// Ends stream `s` with `requested`: `end` (never refused) or, `refusable`, `try_end`. The model predicts
    /// whether the outcome fits the room reserved for the end, or else the limits' room beside it: then it is
    /// kept whole; otherwise `try_end` is refused and changes nothing, and `end` shrinks the outcome into its
    /// room (no details, the error's message and code cut to a prefix of at most 64 bytes, or no error).
    fn end(&mut self, s: usize, requested: Outcome, refusable: bool) -> Checked {
        let before = self.counts(s);
        let limits = self.limits.clone();
        let model = &mut self.streams[s];
        let stream = Arc::clone(&model.stream);
        let history = stream.history();
        let result = if refusable { stream.try_end(requested.clone()) } else { Ok(()) };
        let ended = if refusable { result.is_ok() } else { stream.end(requested.clone()) };
        // A producer's outcome is checked first, as a message is.
        let code_too_long = requested.error.as_ref().and_then(|e| e.code.as_ref()).is_some_and(|c| c.len() > 256);
        if refusable && code_too_long {
            let Err(AppendError::Invalid(error)) = &result else {
                return Err(TestCaseError::fail(format!("a code over the name limit: {result:?}")));
            };
            prop_assert_eq!(error.field(), Some("error.code"));
            return if model.outcome.is_some() { Ok(()) } else { self.unchanged(s, before, &history) };
        }
        if model.outcome.is_some() {
            prop_assert!(!ended, "ended twice");
            if refusable {
                prop_assert_eq!(result, Err(AppendError::Ended));
            }
            return Ok(());
        }
        // The outcome as kept whole: an end that cannot be refused cuts a code over the name limit to it.
        let mut whole = requested.clone();
        if let Some(code) = whole.error.as_mut().and_then(|e| e.code.as_mut()) {
            code.truncate(256);
        }
        let short = model.short_epoch();
        let closings = model.lifecycle.clone().end_all().len() as u64;
        let sequence = model.log.len() as u64 + closings + 1;
        let sized = |duration: u64, id: &str| json_len(&stamped(&stream_end(&whole, duration), id, sequence));
        let (low, high) = (sized(0, &format!("m1-{short}")), sized(u64::MAX, &format!("m99999-{short}")));
        let outcome_size = serde_json::to_vec(&whole).map_or(0, |v| v.len() as u64);
        let (room, outcome_room) = (end_room(&short), outcome_room());
        let (counted, copies) = (model.counted(), model.copies());
        let refused_at = |size: u64| {
            let (extra, outcome_extra) = (size.saturating_sub(room), outcome_size.saturating_sub(outcome_room));
            (extra > 0 || outcome_extra > 0)
                && (size > limits.message_bytes
                    || counted + extra > limits.stream_bytes
                    || before.0 + extra * copies + outcome_extra > limits.hub_bytes)
        };
        let verdict = verdict(refused_at(low), refused_at(high));
        if refusable {
            match &result {
                Ok(()) => prop_assert!(verdict != Verdict::Refuse, "try_end took an outcome that does not fit"),
                Err(error) => {
                    prop_assert!(verdict != Verdict::Pass, "try_end refused an outcome that fits: {error}");
                    prop_assert!(
                        matches!(
                            error,
                            AppendError::MessageTooLarge { .. }
                                | AppendError::StreamFull { .. }
                                | AppendError::HubFull { .. }
                        ),
                        "{error}"
                    );
                    return self.unchanged(s, before, &history);
                }
            }
        }
        prop_assert!(ended, "an open stream ends");
        let kept = stream.outcome().unwrap_or_default();
        let end = stream.history().pop().unwrap_or_default();
        prop_assert_eq!(&end.props["data"]["error"], &json!(kept.error), "stream_end carries the outcome");
        let shrunk = kept != whole;
        prop_assert!(!(shrunk && verdict == Verdict::Pass), "an outcome that fits was shrunk: {kept:?}");
        prop_assert!(shrunk || verdict != Verdict::Refuse, "an outcome that does not fit was kept: {kept:?}");
        if shrunk {
            prop_assert!(!refusable);
            prop_assert_eq!(
                (kept.status, kept.finish_reason, kept.usage),
                (whole.status, whole.finish_reason, whole.usage)
            );
            if let (Some(kept), Some(whole)) = (&kept.error, &whole.error) {
                prop_assert!(kept.details.is_none(), "details dropped");
                prop_assert!(kept.message.len() <= 64 && whole.message.starts_with(&kept.message), "{kept:?}");
                let code = kept.code.as_deref().unwrap_or_default();
                prop_assert!(code.len() <= 64 && whole.code.as_deref().unwrap_or_default().starts_with(code));
            }
            prop_assert!(json_len(&end) <= room, "a shrunk stream_end fits its room");
            prop_assert!(serde_json::to_vec(&kept).map_or(0, |v| v.len() as u64) <= outcome_room);
        }
        let mut shapes = model.lifecycle.end_all();
        shapes.push(Shape::event("stream_end", None, None, None));
        model.outcome = Some(kept);
        self.forced(s, before, shapes, true)
    }

    /// A refused end left stream `s` as it was: open, the same log and counts.
    fn unchanged(&self, s: usize, (hub_before, held_before): (u64, u64), history: &[OutputMessage]) -> Checked {
        let stream = &self.streams[s].stream;
        prop_assert_eq!(stream.status(), Status::Open, "a refused end leaves the stream open");
        prop_assert_eq!(&stream.history()[..], history, "a refused end changed the log");
        prop_assert_eq!(
            (self.hub.bytes(), stream.held_bytes()),
            (hub_before, held_before),
            "a refused end counts nothing"
        );
        Ok(())
    }

    /// The stream's own closing events (`shapes`) were just appended to stream `s` (`ended`: with
    /// `stream_end` and the outcome), whatever the limits: each fits the room reserved for it (`stream_end`
    /// unless its outcome took more room, which the limits had), and both byte counts changed by exactly
    /// what was appended less the rooms it took, per copy.
    fn forced(&mut self, s: usize, (hub_before, held_before): (u64, u64), shapes: Vec<Shape>, ended: bool) -> Checked {
        let model = &mut self.streams[s];
        let short = model.short_epoch();
        let history = model.stream.history();
        prop_assert_eq!(history.len(), model.log.len() + shapes.len(), "entries appended");
        let appended = &history[model.log.len()..];
        let added: u64 = appended.iter().map(json_len).sum();
        let mut fits = true;
        for closing in appended {
            if lifecycle_name(closing) == Some("stream_end") {
                fits &= json_len(closing) <= end_room(&short);
            } else {
                prop_assert!(json_len(closing) <= room(&widen(closing), &short), "a closing event fits its room");
            }
        }
        let mut rooms = open_rooms(&model.log, &short).0 - open_rooms(&history, &short).0;
        let (mut outcome_before, mut outcome_after) = (0, 0);
        if ended {
            rooms += end_room(&short);
            (outcome_before, outcome_after) = (outcome_room(), model.outcome_counted());
            fits &= outcome_after <= outcome_before;
        }
        let copies = model.copies();
        prop_assert_eq!(
            model.stream.held_bytes() + rooms * copies + outcome_before,
            held_before + added * copies + outcome_after,
            "the stream counts its events in place of their rooms"
        );
        prop_assert_eq!(
            self.hub.bytes() + rooms * copies + outcome_before,
            hub_before + added * copies + outcome_after,
            "the hub counts the stream's events in place of their rooms"
        );
        if fits {
            prop_assert!(self.hub.bytes() <= hub_before, "closing what is open adds nothing to the hub's count");
        }
        model.shapes.extend(shapes);
        Ok(())
    }

    fn evict(&mut self) -> Checked {
        self.clock.advance(RETENTION.as_millis() as u64);
        prop_assert!(self.hub.get("no such stream").is_none());
        for model in &mut self.streams {
            if model.alive && model.outcome.is_some() {
                model.alive = false;
                prop_assert!(model.stream.history().is_empty(), "an evicted stream keeps no history");
                prop_assert_eq!(model.stream.held_bytes(), 0, "an evicted stream holds no bytes");
            }
        }
        Ok(())
    }

    /// The invariants that hold after every step.
    fn check(&mut self) -> Checked {
        let mut held = 0;
        for (s, model) in self.streams.iter_mut().enumerate() {
            if !model.alive {
                prop_assert_eq!(model.stream.held_bytes(), 0);
                continue;
            }
            let stream = &model.stream;
            let history = stream.history();
            let snapshot = stream.snapshot();
            let sequences: Vec<u64> = history.iter().map(|m| m.sequence().unwrap_or(0)).collect();
            prop_assert!(sequences.iter().copied().eq(1..=history.len() as u64), "stream {s}: sequences {sequences:?}");
            prop_assert_eq!(snapshot.last_sequence, history.len() as u64);
            prop_assert_eq!(stream.last_sequence(), history.len() as u64);
            prop_assert_eq!(stream.log().last_sequence(), history.len() as u64);
            let mut replay = Reducer::default();
            for message in &history {
                prop_assert!(replay.apply(message).is_ok(), "stream {s}: the log does not replay: {message:?}");
            }
            prop_assert_eq!(
                replay.messages(),
                &snapshot.messages[..],
                "stream {}: the log replayed is not the snapshot",
                s
            );
            let shapes: Vec<Shape> = history.iter().map(Shape::of).collect();
            prop_assert_eq!(&shapes, &model.shapes, "stream {}: the log's entries", s);
            let theirs: Vec<(&str, &Map<String, Value>)> = snapshot
                .messages
                .iter()
                .filter(|m| Shape::of(m).event.is_none())
                .map(|m| (m.kind.as_str(), &m.props))
                .collect();
            let ours: Vec<(&str, &Map<String, Value>)> =
                model.user.messages().iter().map(|m| (m.kind.as_str(), &m.props)).collect();
            prop_assert_eq!(theirs, ours, "stream {}: the producer's messages reduce as the model says", s);
            let made_up: Vec<&str> =
                history.iter().filter_map(|m| m.message_id.as_deref()).filter(|id| !IDS.contains(id)).collect();
            let mut unique = made_up.clone();
            unique.sort_unstable();
            unique.dedup();
            prop_assert_eq!(unique.len(), made_up.len(), "stream {}: the ids the stream makes up are unique", s);
            prop_assert_eq!(snapshot.status, Status::of(model.outcome.as_ref()));
            prop_assert_eq!(stream.status(), Status::of(model.outcome.as_ref()));
            held += stream.held_bytes();
            model.log = history;
            // Never past a limit, the room reserved for closing what is open included.
            let (messages, counted) = (model.log.len() as u64 + model.closings(), model.counted());
            prop_assert!(
                messages <= self.limits.messages_per_stream as u64,
                "stream {s}: {messages} messages and closings reserved, over {}",
                self.limits.messages_per_stream
            );
            prop_assert!(
                counted <= self.limits.stream_bytes,
                "stream {s}: {counted} bytes with its rooms, over {}",
                self.limits.stream_bytes
            );
        }
        prop_assert_eq!(self.hub.bytes(), held, "the hub counts what its streams hold");
        prop_assert_eq!(self.hub.len(), self.streams.iter().filter(|m| m.alive).count());
        Ok(())
    }

    /// Ends every stream, reads every subscriber to its end, subscribes once more in every format in use,
    /// then evicts everything.
    fn finish(&mut self) -> Checked {
        for s in 0..self.streams.len() {
            if self.streams[s].alive && self.streams[s].outcome.is_none() {
                self.end(s, Outcome::completed(), false)?;
                self.check()?;
            }
        }
        for r in 0..self.readers.len() {
            let mut polls = 0;
            while !self.readers[r].finished {
                polls += 1;
                prop_assert!(polls < 10_000, "reader {r} never ends");
                prop_assert!(self.read_one(r)? || self.readers[r].finished, "reader {r} waits on an ended stream");
            }
            let reader = &self.readers[r];
            let model = &self.streams[reader.stream];
            let (full, ends) = render(reader.format, &model.stream, &model.log, model.outcome.as_ref());
            let expected = &full[start_after(&ends, reader.after)..];
            if reader.lagged {
                prop_assert!(
                    reader.frames.len() < expected.len() && reader.frames[..] == expected[..reader.frames.len()]
                );
            } else {
                prop_assert!(reader.frames == expected, "reader {r} did not read exactly the fresh adapter's frames");
            }
        }
        for s in 0..self.streams.len() {
            if !self.streams[s].alive {
                continue;
            }
            for format in self.streams[s].formats.clone() {
                let mut late = self.streams[s].stream.subscribe(format, 0).expect("a format in use is rendered");
                let mut frames = Vec::new();
                while let Some(batch) = late.try_next().expect("an ended stream never waits") {
                    prop_assert!(!batch.lagged);
                    frames.extend(batch.frames());
                }
                let model = &self.streams[s];
                prop_assert!(frames == render(format, &model.stream, &model.log, model.outcome.as_ref()).0);
            }
        }
        self.evict()?;
        self.check()?;
        prop_assert_eq!(self.hub.bytes(), 0, "an empty hub holds no bytes");
        Ok(())
    }
}

fn expect_ended(result: Result<Option<u64>, AppendError>) -> Checked {
    prop_assert_eq!(result, Err(AppendError::Ended));
    Ok(())
}

/// A lagged batch: CUI's one `error` frame without an id, or OpenAI's error envelope then `[DONE]`; both name
/// where the kept history starts.
fn check_lagged(format: Format, frames: &[Bytes], kept_after: u64) -> Checked {
    if format == Format::Cui {
        prop_assert_eq!(frames.len(), 1, "one frame: {:?}", frames);
        prop_assert!(!frames[0].starts_with(b"id:"), "the notice has no id");
        let json = frame_json(&frames[0]);
        prop_assert_eq!(&json["type"], "error");
        prop_assert_eq!(&json["props"]["code"], "lagged");
        prop_assert_eq!(&json["props"]["details"]["resume_from"], &json!(kept_after));
    } else {
        prop_assert_eq!(frames.len(), 2, "error then [DONE]: {:?}", frames);
        let json = frame_json(&frames[0]);
        prop_assert_eq!(&json["error"]["code"], "lagged");
        let message = json["error"]["message"].as_str().unwrap_or_default();
        prop_assert!(message.ends_with(&format!("sequence {kept_after}")), "{json}");
        prop_assert_eq!(&frames[1][..], b"data: [DONE]\n\n");
    }
    Ok(())
}

fn run_case(limits: Limits, batch_bytes: u64, ops: Vec<Op>) -> Checked {
    let mut world = World::new(limits, batch_bytes);
    world.create()?;
    world.create()?;
    world.check()?;
    for op in &ops {
        world.run(op)?;
        world.check()?;
    }
    world.finish()
}

/// The scenario of issue 9's first defect, as one example the model also covers: a hub filled to its byte
/// limit refuses a new delta message (`message_id` + `delta: true`) on a fresh stream with `HubFull`, which
/// leaves the stream exactly as it was (no `message_start` in the snapshot); retrying it while the hub is still
/// full is refused the same way, without a panic; once another stream is ended and evicted, the retry goes
/// in once, as a fresh append would, and a subscriber reads exactly the log the snapshot was reduced from.
#[test]
fn a_new_delta_refused_for_a_full_hub_leaves_the_stream_unchanged_and_goes_in_once_space_is_freed() {
    const HUB_BYTES: u64 = 6_000;
    let limits = Limits { hub_bytes: HUB_BYTES, ..Limits::default() };
    let clock = Arc::new(SteppingClock::new(START_MS));
    let hub = Hub::new(HubConfig {
        limits,
        retention: RETENTION,
        clock: Arc::clone(&clock) as _,
        ids: Arc::new(CountingIds::default()),
        ..HubConfig::default()
    });
    let fresh = hub.create(MODEL_NAME).expect("create");
    let filler = hub.create(MODEL_NAME).expect("create");
    let mut filled = None;
    for i in 0..1_000 {
        if let Err(error) = filler.append(OutputMessage::text(format!("filler {i:04}"))) {
            filled = Some(error);
            break;
        }
    }
    assert_eq!(filled, Some(AppendError::HubFull { limit: HUB_BYTES }), "the hub is full");

    let delta = || {
        let mut message = OutputMessage::text("x".repeat(300)).with_message_id("a");
        message.delta = true;
        message
    };
    let (history, snapshot, bytes) = (fresh.history(), fresh.snapshot(), hub.bytes());
    for attempt in 0..3 {
        assert_eq!(fresh.append(delta()), Err(AppendError::HubFull { limit: HUB_BYTES }), "attempt {attempt}");
        assert_eq!(fresh.history(), history, "attempt {attempt} left the log as it was");
        let after = fresh.snapshot();
        assert_eq!(after.messages, snapshot.messages, "attempt {attempt} left the snapshot as it was");
        assert_eq!(after.last_sequence, snapshot.last_sequence);
        assert_eq!(hub.bytes(), bytes, "attempt {attempt} left the byte count as it was");
    }

    assert!(filler.end(Outcome::completed()));
    clock.advance(RETENTION.as_millis() as u64);
    assert!(hub.get(filler.id()).is_none(), "the filler is evicted");
    assert_eq!(fresh.append(delta()), Ok(3), "the retry goes in after its message_start (sequence 2)");
    assert!(fresh.end(Outcome::completed()));

    let history = fresh.history();
    let events: Vec<&str> = history.iter().map(|m| m.prop_str("event").unwrap_or(&m.kind)).collect();
    assert_eq!(events, ["stream_start", "message_start", "text", "message_end", "stream_end"], "in once");
    let mut replay = Reducer::default();
    for message in &history {
        replay.apply(message).expect("the log replays");
    }
    assert_eq!(replay.messages(), &fresh.snapshot().messages[..]);
    let mut subscription = fresh.subscribe(Format::Cui, 0).expect("subscribe");
    let mut frames = Vec::new();
    while let Some(batch) = subscription.try_next().expect("an ended stream never waits") {
        frames.extend(batch.frames());
    }
    let (expected, _) = render(Format::Cui, &fresh, &history, fresh.outcome().as_ref());
    assert!(frames == expected, "the subscriber reads the log the snapshot was reduced from");
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(128) })]

    #[test]
    fn the_hub_behaves_like_its_model(
        limits in limits(),
        batch_bytes in 200u64..3_000,
        ops in prop::collection::vec(op(), 1..64),
    ) {
        run_case(limits, batch_bytes, ops)?;
    }
}
