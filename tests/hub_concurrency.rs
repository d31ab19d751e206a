//! Concurrency tests of the hub: one producer, many subscribers, late joiners and resumes.
//!
//! 1. Fan-out: 50 subscribers in three formats, subscribed before a producer appends a few thousand
//!    messages as fast as it can, all get byte-identical output per format, equal to what a late subscriber
//!    gets after the end and to what a fresh adapter renders over the log.
//! 2. Joiners at random moments (and some at fixed points while the producer waits) each get the full output.
//! 3. Resuming a finished stream from every sequence gives exactly the frames after that sequence.
//! 4. A partial read while the producer runs, then a resume from its `last_sequence`, adds up to the full
//!    output without gap or duplicate; and the same after stopping at every frame of a finished stream.
//!
//! Nothing here is evicted, so nobody lags: every subscriber reads at its own pace from the shared rendition.

mod common;

use common::assert_same_frames;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentmux::adapter::{Adapter, AgentTools, CuiAdapter, OpenAiAdapter, ReasoningField};
use agentmux::hub::{Hub, HubConfig, Status, Stream, SubscribeError, Subscription};
use agentmux::output::{DeltaAction, Metadata, Outcome, OutputMessage, Usage};
use agentmux::render::Format;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

/// OpenAI chunks with the usage chunk and reasoning in both fields.
const OPENAI_USAGE: Format =
    Format::OpenAi { include_usage: true, reasoning: ReasoningField::Both, agent_tools: AgentTools::Hidden };
const FORMATS: [Format; 3] = [Format::Cui, Format::OPENAI, OPENAI_USAGE];
/// No single read in these tests may take longer than this.
const PATIENCE: Duration = Duration::from_secs(30);

fn hub_with_batch_bytes(batch_bytes: u64) -> Hub {
    Hub::new(HubConfig { batch_bytes, ..HubConfig::default() })
}

fn hub() -> Hub {
    hub_with_batch_bytes(HubConfig::default().batch_bytes)
}

fn outcome() -> Outcome {
    Outcome::completed().with_usage(Usage::new(1234, 5678))
}

// ---------------------------------------------------------------------------------------------------------
// The producer's script.
// ---------------------------------------------------------------------------------------------------------

/// One thing the producer does.
#[derive(Debug, Clone)]
enum Step {
    Append(Box<OutputMessage>),
    Batch(Vec<OutputMessage>),
    EndMessage(String),
    EndBlock(String),
}

fn append(message: OutputMessage) -> Step {
    Step::Append(Box::new(message))
}

const TEXT: &[&str] = &[
    "Hello",
    ", world",
    " ",
    "wörld",
    "日本語",
    "😀",
    "\n",
    "\n\n",
    "\"quoted\"",
    "back\\slash",
    "data: x",
    "[DONE]",
    "\r\n",
    "**bold**",
    "```",
    "\u{2028}",
    "tab\t",
    "x",
];
const ARGUMENTS: &[&str] = &["{", "\"q\":", "\"rust", " async\"", ",\"n\":", "42", "}", "[1,2]", "\"\\u00e9\""];
const TOOLS: &[&str] = &["search", "fetch_url", "run_code"];

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.random_range(0..items.len())]
}

/// A deterministic mix of `steps` producer steps: text deltas on three interleaved message ids (some in
/// blocks), thinking, tool calls with argument deltas, actions, events, loading, custom types (with merge and
/// append deltas, and with a `url`), a producer trace id, small batches, and explicit message and block ends.
/// No `error` message: it would end the OpenAI rendering early.
fn script(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(steps);
    let mut counter = 0u64;
    let mut fresh = |prefix: &str| {
        counter += 1;
        format!("{prefix}{counter}")
    };
    // Open text messages per lane, with the block they were started in.
    let mut lanes: [Option<(String, Option<String>)>; 3] = Default::default();
    let mut thinking: Option<String> = None;
    let mut tool: Option<String> = None;
    let mut chart: Option<String> = None;
    let mut block: Option<String> = None;
    while out.len() < steps {
        let i = out.len();
        let roll = rng.random_range(0..100);
        let step = match roll {
            // A text delta, on one of three message ids streaming at once.
            0..35 | 90..95 => {
                let count = if roll < 90 { 1 } else { rng.random_range(2..=4) };
                let mut batch = Vec::new();
                for _ in 0..count {
                    let lane = rng.random_range(0..3);
                    let started = lanes[lane].is_none();
                    let (id, in_block) =
                        lanes[lane].get_or_insert_with(|| (fresh("t"), if lane == 0 { block.clone() } else { None }));
                    let mut message = OutputMessage::text(pick(&mut rng, TEXT))
                        .with_message_id(id.clone())
                        .as_delta(DeltaAction::Append, None);
                    if let (true, Some(b)) = (started, in_block.as_ref()) {
                        message = message.with_block_id(b.clone());
                    }
                    batch.push(message);
                }
                if batch.len() == 1 { append(batch.remove(0)) } else { Step::Batch(batch) }
            }
            // End a text message (its next delta starts a new one).
            35..40 => {
                let lane = rng.random_range(0..3);
                match lanes[lane].take() {
                    Some((id, _)) => Step::EndMessage(id),
                    None => continue,
                }
            }
            // Thinking, in deltas; ended now and then.
            40..50 => {
                if rng.random_bool(0.05)
                    && let Some(id) = thinking.take()
                {
                    Step::EndMessage(id)
                } else {
                    let id = thinking.get_or_insert_with(|| fresh("r")).clone();
                    append(
                        OutputMessage::thinking(pick(&mut rng, TEXT))
                            .with_message_id(id)
                            .as_delta(DeltaAction::Append, None),
                    )
                }
            }
            // A tool call: a header, then argument fragments.
            50..63 => {
                let message = match &tool {
                    Some(id) if !rng.random_bool(0.08) => {
                        OutputMessage::new("tool_call", object(json!({ "arguments": pick(&mut rng, ARGUMENTS) })))
                            .with_message_id(id.clone())
                            .as_delta(DeltaAction::Append, None)
                    }
                    _ => {
                        let id = fresh("c");
                        tool = Some(id.clone());
                        let arguments = if rng.random_bool(0.5) { pick(&mut rng, ARGUMENTS) } else { "" };
                        OutputMessage::tool_call(format!("call_{id}"), pick(&mut rng, TOOLS), arguments)
                            .with_message_id(id)
                            .as_delta(DeltaAction::Append, None)
                    }
                };
                append(message)
            }
            // Actions and events: silent in OpenAI.
            63..69 => append(if rng.random_bool(0.5) {
                OutputMessage::action("open_panel").with_prop("payload", json!({ "step": i }))
            } else {
                OutputMessage::event("progress").with_prop("data", json!({ "step": i, "of": steps }))
            }),
            // A custom type: started whole, then merge and append deltas.
            69..78 => {
                let message = match &chart {
                    Some(id) if !rng.random_bool(0.1) => {
                        if rng.random_bool(0.5) {
                            OutputMessage::new("chart", object(json!({ "title": format!("chart at {i}") })))
                                .with_message_id(id.clone())
                                .as_delta(DeltaAction::Merge, None)
                        } else {
                            OutputMessage::new("chart", object(json!({ "points": [i] })))
                                .with_message_id(id.clone())
                                .as_delta(DeltaAction::Append, Some("points"))
                        }
                    }
                    _ => {
                        let id = fresh("g");
                        chart = Some(id.clone());
                        OutputMessage::new("chart", object(json!({ "title": "start", "points": [0] })))
                            .with_message_id(id)
                    }
                };
                append(message)
            }
            // A custom type with a URL: a link in OpenAI.
            78..82 => append(OutputMessage::new(
                "diagram",
                object(json!({ "url": format!("https://example.com/d/{i}.png"), "caption": "a [diagram]" })),
            )),
            // Loading, sometimes done.
            82..86 => {
                let message = OutputMessage::loading(format!("working on {i}…"));
                append(if rng.random_bool(0.3) { message.with_prop("done", true) } else { message })
            }
            // A whole text message with a producer trace id.
            86..90 => {
                let mut message = OutputMessage::text(format!(" [{i}] "));
                message.metadata = Some(Metadata { trace_id: Some(format!("trace-{i}")), ..Metadata::default() });
                append(message)
            }
            // Open or close a block (lane 0 starts its messages in the open block).
            _ => match block.take() {
                Some(b) => {
                    for lane in &mut lanes {
                        if lane.as_ref().is_some_and(|(_, in_block)| in_block.as_ref() == Some(&b)) {
                            *lane = None;
                        }
                    }
                    Step::EndBlock(b)
                }
                None => {
                    block = Some(fresh("b"));
                    continue;
                }
            },
        };
        out.push(step);
    }
    out
}

/// How the producer paces itself.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Yield to the scheduler every this many steps.
    yield_every: usize,
    /// Sleep a millisecond every this many steps.
    sleep_every: Option<usize>,
}

const FLAT_OUT: Pace = Pace { yield_every: 32, sleep_every: None };
const PACED: Pace = Pace { yield_every: 8, sleep_every: Some(25) };

/// A point where the producer stops until a joiner has subscribed.
struct Gate {
    at: usize,
    reached: oneshot::Sender<()>,
    resume: oneshot::Receiver<()>,
}

/// The joiner's side of a [`Gate`].
struct GateKey {
    reached: oneshot::Receiver<()>,
    resume: oneshot::Sender<()>,
}

fn gate(at: usize) -> (Gate, GateKey) {
    let (reached_tx, reached_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel();
    (Gate { at, reached: reached_tx, resume: resume_rx }, GateKey { reached: reached_rx, resume: resume_tx })
}

/// Runs the script against the stream, then ends it with [`outcome`]. Returns the sequences the appends got.
async fn produce(stream: Arc<Stream>, steps: Vec<Step>, pace: Pace, mut gates: Vec<Gate>) -> Vec<u64> {
    gates.sort_by_key(|g| g.at);
    let mut gates = gates.into_iter().peekable();
    let mut sequences = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        while let Some(gate) = gates.next_if(|g| g.at == i) {
            let _ = gate.reached.send(());
            let _ = gate.resume.await;
        }
        match step {
            Step::Append(message) => sequences.push(stream.append(*message).expect("append")),
            Step::Batch(messages) => sequences.extend(stream.append_batch(messages).expect("append_batch")),
            Step::EndMessage(id) => {
                stream.end_message(&id).expect("end_message");
            }
            Step::EndBlock(id) => {
                stream.end_block(&id).expect("end_block");
            }
        }
        if i % pace.yield_every == pace.yield_every - 1 {
            tokio::task::yield_now().await;
        }
        // The producer's pace, as the case drew it: the scenario, not synchronisation.
        if pace.sleep_every.is_some_and(|n| i % n == n - 1) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    for gate in gates {
        let _ = gate.reached.send(());
        let _ = gate.resume.await;
    }
    assert!(stream.end(outcome()), "the stream was already ended");
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "append sequences increase");
    sequences
}

// ---------------------------------------------------------------------------------------------------------
// Reading.
// ---------------------------------------------------------------------------------------------------------

/// What a subscriber read.
#[derive(Debug, Default, Clone)]
struct Read {
    frames: Vec<Bytes>,
    /// Each batch's `last_sequence`, in order.
    last_sequences: Vec<u64>,
}

impl Read {
    fn take(&mut self, batch: agentmux::hub::Batch) {
        assert!(!batch.lagged, "nobody lags while the history is kept");
        assert!(!batch.frames().is_empty(), "a batch holds frames");
        if let Some(&previous) = self.last_sequences.last() {
            assert!(
                batch.last_sequence >= previous,
                "last_sequence went back: {previous} then {}",
                batch.last_sequence
            );
        }
        self.last_sequences.push(batch.last_sequence);
        self.frames.extend(batch.frames());
    }

    fn bytes(&self) -> Vec<u8> {
        self.frames.concat()
    }
}

/// Reads until the subscription ends.
async fn read_to_end(mut subscription: Subscription) -> Read {
    let mut read = Read::default();
    tokio::time::timeout(PATIENCE, async {
        while let Some(batch) = subscription.next().await {
            read.take(batch);
        }
    })
    .await
    .expect("the subscription ends in time");
    read
}

/// Reads up to `batches` batches, stopping early at the end or once a batch's `last_sequence` is `stop_at`.
async fn read_batches(subscription: &mut Subscription, batches: usize, stop_at: Option<u64>) -> Read {
    let mut read = Read::default();
    tokio::time::timeout(PATIENCE, async {
        while read.last_sequences.len() < batches
            && (stop_at.is_none() || read.last_sequences.last() != stop_at.as_ref())
        {
            match subscription.next().await {
                Some(batch) => read.take(batch),
                None => break,
            }
        }
    })
    .await
    .expect("batches in time");
    read
}

/// The `id:` of a CUI frame, checking its shape.
fn cui_id(frame: &[u8]) -> u64 {
    let text = std::str::from_utf8(frame).expect("utf-8 frame");
    let rest = text.strip_prefix("id: ").unwrap_or_else(|| panic!("no id line: {text:?}"));
    let (id, rest) = rest.split_once('\n').expect("id line ends");
    assert!(rest.starts_with("data: ") && rest.ends_with("\n\n"), "frame shape: {text:?}");
    assert_eq!(rest.matches('\n').count(), 2, "one data line: {text:?}");
    id.parse().unwrap_or_else(|_| panic!("bad id {id:?}"))
}

/// The message in a CUI frame.
fn cui_message(frame: &[u8]) -> OutputMessage {
    let text = std::str::from_utf8(frame).expect("utf-8 frame");
    let data = text.split_once("\ndata: ").expect("data line").1.trim_end_matches('\n');
    serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"))
}

/// Asserts a full CUI read: ids 1..=last exactly once in order, `stream_start` first, `stream_end` last.
fn check_full_cui(frames: &[Bytes], last: u64) {
    let ids: Vec<u64> = frames.iter().map(|f| cui_id(f)).collect();
    assert_eq!(ids.len() as u64, last, "one frame per sequence");
    for (index, id) in ids.iter().enumerate() {
        assert_eq!(*id, index as u64 + 1, "sequence at frame {index}");
    }
    let first = cui_message(&frames[0]);
    assert_eq!((first.kind.as_str(), first.prop_str("event")), ("event", Some("stream_start")));
    let end = cui_message(frames.last().expect("frames"));
    assert_eq!((end.kind.as_str(), end.prop_str("event")), ("event", Some("stream_end")));
    assert_eq!(end.props["data"]["status"], "completed");
    assert_eq!(end.props["data"]["usage"]["total_tokens"], 1234 + 5678);
}

/// What a fresh adapter of `format` renders over `log`: the frames, and after how many frames each message's
/// frames end (`ends[i]` for sequence `i + 1`).
struct Rendered {
    frames: Vec<Bytes>,
    ends: Vec<usize>,
}

impl Rendered {
    /// The first frame after sequence `n`.
    fn start_after(&self, n: u64) -> usize {
        if n == 0 { 0 } else { self.ends[n as usize - 1] }
    }
}

fn render(stream: &Stream, format: Format, log: &[OutputMessage], outcome: &Outcome) -> Rendered {
    let mut adapter: Box<dyn Adapter> = match format {
        Format::Cui => Box::new(CuiAdapter),
        Format::OpenAi { include_usage, reasoning, agent_tools } => {
            let mut options = agentmux::adapter::OpenAiOptions::from(stream.info());
            options.include_usage = include_usage;
            options.reasoning = reasoning;
            options.agent_tools = agent_tools;
            Box::new(OpenAiAdapter::new(options))
        }
        other => panic!("unknown format {other:?}"),
    };
    let mut frames = Vec::new();
    let mut ends = Vec::with_capacity(log.len());
    for message in log {
        adapter.push(message, &mut frames);
        ends.push(frames.len());
    }
    adapter.finish(outcome, &mut frames);
    Rendered { frames: frames.iter().map(agentmux::render::encode_sse).collect(), ends }
}

/// The full output of each format for an ended stream, read by a subscriber from 0, checked against what a
/// fresh adapter renders over the log (taken from the CUI output).
struct Full {
    last: u64,
    reads: Vec<(Format, Rendered)>,
}

impl Full {
    async fn of(stream: &Arc<Stream>) -> Full {
        assert_ne!(stream.status(), Status::Open);
        let last = stream.last_sequence();
        let mut reads = Vec::new();
        let mut log = Vec::new();
        for format in FORMATS {
            let read = read_to_end(stream.subscribe(format, 0).expect("subscribe after the end")).await;
            if format == Format::Cui {
                check_full_cui(&read.frames, last);
                log = read.frames.iter().map(|f| cui_message(f)).collect();
                assert_eq!(read.last_sequences.last(), Some(&last));
            } else {
                let text = String::from_utf8(read.bytes()).expect("utf-8");
                assert!(text.ends_with("data: [DONE]\n\n"), "OpenAI output ends with [DONE]");
                assert_eq!(text.matches("data: [DONE]").count(), 1, "one [DONE]");
                assert!(!text.contains("\"error\""), "no error frame");
                let usage_chunks = text.matches("\"usage\":{\"prompt_tokens\":1234").count();
                assert_eq!(usage_chunks, usize::from(format == OPENAI_USAGE), "usage chunk in {format:?}");
            }
            let rendered = render(stream, format, &log, &outcome());
            assert!(read.frames == rendered.frames, "{format:?}: the hub's output differs from a fresh adapter's");
            reads.push((format, Rendered { frames: read.frames, ends: rendered.ends }));
        }
        assert_eq!(log.len() as u64, last);
        Full { last, reads }
    }

    fn of_format(&self, format: Format) -> &Rendered {
        &self.reads.iter().find(|(f, _)| *f == format).expect("format").1
    }
}

// ---------------------------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_subscribers_in_three_formats_get_identical_complete_output() {
    let started = Instant::now();
    let hub = hub();
    let stream = hub.create("fan-out").expect("create");
    let subscribers: Vec<_> = (0..50)
        .map(|i| {
            let format = FORMATS[i % FORMATS.len()];
            let subscription = stream.subscribe(format, 0).expect("subscribe");
            (format, tokio::spawn(read_to_end(subscription)))
        })
        .collect();
    let steps = script(1, 4000);
    let producer = tokio::spawn(produce(Arc::clone(&stream), steps, FLAT_OUT, Vec::new()));
    let appended = producer.await.expect("producer").len();
    let mut reads = Vec::new();
    for (format, subscriber) in subscribers {
        reads.push((format, subscriber.await.expect("subscriber")));
    }

    assert_eq!(stream.status(), Status::Completed);
    assert!(stream.last_sequence() as usize > appended, "lifecycle events were added");
    let full = Full::of(&stream).await;
    for (index, (format, read)) in reads.iter().enumerate() {
        assert_same_frames(&read.frames, &full.of_format(*format).frames, &format!("subscriber {index} ({format:?})"));
        if *format == Format::Cui {
            check_full_cui(&read.frames, full.last);
            assert_eq!(read.last_sequences.last(), Some(&full.last));
        }
    }
    // Every format has subscribers, and subscribers of one format share bytes.
    for format in FORMATS {
        let same: Vec<&Read> = reads.iter().filter(|(f, _)| *f == format).map(|(_, r)| r).collect();
        assert!(same.len() >= 16);
        let first = same[0].bytes();
        assert!(same.iter().all(|r| r.bytes() == first), "{format:?}: subscribers differ");
    }
    eprintln!(
        "fan-out: {appended} appends, {} messages, {} CUI / {} OpenAI frames, {:?}",
        full.last,
        full.of_format(Format::Cui).frames.len(),
        full.of_format(Format::OPENAI).frames.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribers_joining_at_random_moments_get_the_whole_stream() {
    let started = Instant::now();
    let hub = hub();
    let stream = hub.create("joiners").expect("create");
    let steps = script(2, 3000);
    let mut rng = StdRng::seed_from_u64(22);

    // Joiners at fixed points: the producer waits there until they have subscribed.
    let (gates, keys): (Vec<Gate>, Vec<GateKey>) = [0, 1, 500, 1234, 2000, 2999, 3000].into_iter().map(gate).unzip();
    let mut joiners = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let stream = Arc::clone(&stream);
        let format = FORMATS[i % FORMATS.len()];
        joiners.push((
            format,
            tokio::spawn(async move {
                key.reached.await.expect("the producer reaches the gate");
                assert_eq!(stream.status(), Status::Open, "the producer waits at the gate");
                let at = stream.last_sequence();
                let subscription = stream.subscribe(format, 0).expect("subscribe");
                key.resume.send(()).expect("the producer waits");
                (at, read_to_end(subscription).await)
            }),
        ));
    }
    // Joiners after a random sleep while the producer runs.
    for i in 0..30 {
        let stream = Arc::clone(&stream);
        let format = FORMATS[i % FORMATS.len()];
        let sleep = Duration::from_micros(rng.random_range(0..80_000));
        joiners.push((
            format,
            tokio::spawn(async move {
                // Joining at a random moment is the scenario, not synchronisation.
                tokio::time::sleep(sleep).await;
                let at = stream.last_sequence();
                let subscription = stream.subscribe(format, 0).expect("subscribe");
                (at, read_to_end(subscription).await)
            }),
        ));
    }
    let producer = tokio::spawn(produce(Arc::clone(&stream), steps, PACED, gates));
    producer.await.expect("producer");
    let full = Full::of(&stream).await;

    let mut mid_stream = 0;
    for (index, (format, joiner)) in joiners.into_iter().enumerate() {
        let (at, read) = joiner.await.expect("joiner");
        mid_stream += usize::from(at > 1 && at < full.last);
        if format == Format::Cui {
            check_full_cui(&read.frames, full.last);
        }
        assert_same_frames(&read.frames, &full.of_format(format).frames, &format!("joiner {index} at {at}"));
    }
    assert!(mid_stream >= 5, "the gated joiners join mid-stream");
    eprintln!("joiners: {mid_stream} of 37 joined mid-stream, {} messages, {:?}", full.last, started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resuming_a_finished_stream_from_every_sequence_gives_exactly_the_rest() {
    let started = Instant::now();
    let hub = hub();
    let stream = hub.create("resume").expect("create");
    produce(Arc::clone(&stream), script(3, 1000), FLAT_OUT, Vec::new()).await;
    let full = Full::of(&stream).await;
    let last = full.last;

    for format in FORMATS {
        let whole = full.of_format(format);
        // A reader still connected keeps the format's frames, and every resume below reads them. Once the
        // last reader is gone, the ended stream drops them and a resume renders the log again: the sampled
        // resumes after `pinned` is dropped check those frames are the same.
        let mut pinned = Some(stream.subscribe(format, last).expect("a reader at the end"));
        let mut previous_start = 0;
        let sampled = [0, 1, last / 3, last / 2, last - 1];
        for (i, n) in (0..=last).chain(sampled).enumerate() {
            if i as u64 == last + 1 {
                pinned = None;
                previous_start = 0;
            }
            let read = read_to_end(stream.subscribe(format, n).expect("resume")).await;
            // A suffix of the full output ...
            let start = whole.frames.len().checked_sub(read.frames.len()).expect("not longer than the whole");
            assert_same_frames(&read.frames, &whole.frames[start..], &format!("{format:?} from {n}"));
            // ... starting at the first frame of message n + 1.
            assert_eq!(start, whole.start_after(n), "{format:?} from {n}: where the resume starts");
            assert!(start >= previous_start);
            previous_start = start;
            if format == Format::Cui {
                assert_eq!(start as u64, n);
                let ids: Vec<u64> = read.frames.iter().map(|f| cui_id(f)).collect();
                assert!(ids.iter().copied().eq(n + 1..=last), "CUI from {n}: ids {}..", n + 1);
            }
            if !read.frames.is_empty() {
                assert_eq!(read.last_sequences.last(), Some(&last), "{format:?} from {n}: last batch");
            }
        }
        assert!(pinned.is_none());
        // From the last sequence: only the closing frames (none for CUI, whose end is stream_end itself).
        let read = read_to_end(stream.subscribe(format, last).expect("resume from last")).await;
        let tail = String::from_utf8(read.bytes()).expect("utf-8");
        match format {
            Format::Cui => assert_eq!(tail, ""),
            _ => {
                let closing = 2 + usize::from(format == OPENAI_USAGE);
                assert_eq!(read.frames.len(), closing, "{format:?}: finish chunk, usage chunk if asked, [DONE]");
                assert!(
                    tail.contains("\"finish_reason\":\"tool_calls\"") || tail.contains("\"finish_reason\":\"stop\"")
                );
                assert!(tail.ends_with("data: [DONE]\n\n"));
            }
        }
        // Beyond the last sequence: refused.
        for ahead in [last + 1, last + 1000, u64::MAX] {
            match stream.subscribe(format, ahead) {
                Err(SubscribeError::SequenceAhead { from, last: l }) => assert_eq!((from, l), (ahead, last)),
                other => panic!("{format:?} from {ahead}: {other:?}"),
            }
        }
    }
    eprintln!("resume: {} sequences x {} formats, {:?}", last + 1, FORMATS.len(), started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partial_read_then_a_resume_adds_up_to_the_whole_stream() {
    let started = Instant::now();
    // Small batches, so batches often end between two frames of one message.
    let hub = hub_with_batch_bytes(400);
    let stream = hub.create("partial").expect("create");
    let steps = script(4, 3000);
    let mut rng = StdRng::seed_from_u64(44);

    let points: Vec<usize> = (0..12).map(|_| rng.random_range(0..3000)).collect();
    let (gates, keys): (Vec<Gate>, Vec<GateKey>) = points.iter().map(|&at| gate(at)).unzip();
    let mut readers = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let stream = Arc::clone(&stream);
        let format = FORMATS[i % FORMATS.len()];
        let batches = rng.random_range(1..=40);
        let pause = Duration::from_micros(rng.random_range(0..20_000));
        // Half the gated readers hold the producer until they have resumed, so they resume an open stream
        // for sure; the others let it go on as soon as they have subscribed.
        let hold = i % 2 == 0;
        readers.push((
            format,
            tokio::spawn(async move {
                key.reached.await.expect("the producer reaches the gate");
                let available = stream.last_sequence();
                let mut subscription = stream.subscribe(format, 0).expect("subscribe");
                let resume = if hold {
                    Some(key.resume)
                } else {
                    key.resume.send(()).expect("the producer waits");
                    None
                };
                // While the producer waits, stop once everything there is was read: more would wait forever.
                let first = read_batches(&mut subscription, batches, hold.then_some(available)).await;
                drop(subscription);
                let resume_from = first.last_sequences.last().copied().unwrap_or(0);
                let open = stream.status() == Status::Open;
                if !hold {
                    // Away a while before resuming, as a reconnecting client is: the scenario.
                    tokio::time::sleep(pause).await;
                }
                let rest = stream.subscribe(format, resume_from).expect("resume");
                if let Some(resume) = resume {
                    assert!(open, "the producer waits");
                    resume.send(()).expect("the producer waits");
                }
                (first, resume_from, open, read_to_end(rest).await)
            }),
        ));
    }
    // Readers that join at random moments without a gate.
    for i in 0..9 {
        let stream = Arc::clone(&stream);
        let format = FORMATS[i % FORMATS.len()];
        let sleep = Duration::from_micros(rng.random_range(0..60_000));
        let batches = rng.random_range(1..=40);
        readers.push((
            format,
            tokio::spawn(async move {
                // Joining at a random moment is the scenario, not synchronisation.
                tokio::time::sleep(sleep).await;
                let mut subscription = stream.subscribe(format, 0).expect("subscribe");
                let first = read_batches(&mut subscription, batches, None).await;
                drop(subscription);
                let resume_from = first.last_sequences.last().copied().unwrap_or(0);
                let open = stream.status() == Status::Open;
                let rest = read_to_end(stream.subscribe(format, resume_from).expect("resume")).await;
                (first, resume_from, open, rest)
            }),
        ));
    }
    produce(Arc::clone(&stream), steps, PACED, gates).await;
    let full = Full::of(&stream).await;

    let (mut resumed_open, mut cut_mid_message) = (0, 0);
    for (index, (format, reader)) in readers.into_iter().enumerate() {
        let (first, from, open, rest) = reader.await.expect("reader");
        let whole = full.of_format(format);
        let boundary = whole.start_after(from);
        let what = format!("reader {index} ({format:?}), resumed from {from}");
        // The first read holds every frame up to its last_sequence, and at most part of the next message.
        assert!(first.frames.len() >= boundary, "{what}: the first read lacks frames of its last_sequence");
        assert_same_frames(&first.frames, &whole.frames[..first.frames.len()], &format!("{what}: first read"));
        if (from as usize) < whole.ends.len() {
            assert!(first.frames.len() < whole.ends[from as usize], "{what}: last_sequence is not the last complete");
        }
        cut_mid_message += usize::from(first.frames.len() > boundary);
        resumed_open += usize::from(open);
        if format == Format::Cui {
            assert_eq!(first.frames.len(), boundary);
            assert_eq!(first.frames.last().map(|f| cui_id(f)).unwrap_or(0), from);
        }
        // The first read up to its last_sequence, then the resumed read: the whole output.
        let mut union = first.frames[..boundary].to_vec();
        union.extend(rest.frames);
        assert_same_frames(&union, &whole.frames, &what);
    }
    assert!(resumed_open >= 1, "some reader resumed while the stream was open");

    // The same, stopping after every frame of a finished stream, one frame per batch: covers every place a
    // batch can end, between two frames of one message included.
    let hub = hub_with_batch_bytes(1);
    let stream = hub.create("partial-sweep").expect("create");
    produce(Arc::clone(&stream), script(5, 400), FLAT_OUT, Vec::new()).await;
    let full = Full::of(&stream).await;
    let mut sweep_cuts = 0;
    for format in FORMATS {
        let whole = full.of_format(format);
        for k in 1..=whole.frames.len() {
            let mut subscription = stream.subscribe(format, 0).expect("subscribe");
            let first = read_batches(&mut subscription, k, None).await;
            drop(subscription);
            assert_eq!(first.frames.len(), k, "one frame per batch");
            let from = *first.last_sequences.last().expect("a batch");
            let boundary = whole.start_after(from);
            let what = format!("{format:?}: stopped after frame {k}, resumed from {from}");
            assert!(boundary <= k, "{what}: last_sequence {from} claims frames not read");
            if (from as usize) < whole.ends.len() {
                assert!(k < whole.ends[from as usize], "{what}: last_sequence is not the last complete");
            }
            sweep_cuts += usize::from(boundary < k);
            let rest = read_to_end(stream.subscribe(format, from).expect("resume")).await;
            let mut union = first.frames[..boundary].to_vec();
            union.extend(rest.frames);
            assert_same_frames(&union, &whole.frames, &what);
        }
    }
    assert!(sweep_cuts > 0, "some message has several frames");
    eprintln!(
        "partial: 21 readers, {resumed_open} resumed mid-stream, {cut_mid_message} cut mid-message; sweep: {} \
         messages, {sweep_cuts} cuts mid-message; {:?}",
        full.last,
        started.elapsed()
    );
}
