//! Slow readers, eviction, batching, cancellation, agent failures and retention, seen from outside the hub.
//!
//! - Being behind is free: a subscriber that stalls while the producer appends megabytes, then reads on,
//!   gets every frame, byte for byte what a fast subscriber got, in CUI and OpenAI; the producer is never
//!   refused or made to wait, and subscribers that are behind add nothing to the hub's byte count.
//! - `lagged` is only for history that is no longer kept: a subscriber still behind when its stream is
//!   evicted gets exactly one batch with its format's error frames (naming where the kept history starts),
//!   then `None`; a subscriber that has every frame ends normally.
//! - A backlog is handed out in batches bounded by `batch_bytes`, but never less than one frame.
//! - `Stream::cancel` reaches the agent, ends the stream `cancelled`, and refuses later emits.
//! - Subscribers going away do not stop an agent; a panic or an error ends the stream with status `error`.
//! - An ended stream stays readable for the retention time by the hub's clock (a [`SteppingClock`] the tests
//!   move by hand, no wall-clock sleeps), then is evicted and gives its bytes back.

mod common;

use common::assert_same_frames;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentmux::agent::{self, Agent, AgentError, Output};
use agentmux::conversation::Conversation;
use agentmux::hub::{AppendError, Batch, Hub, HubConfig, Status, Stream, Subscription};
use agentmux::output::{Outcome, OutputMessage};
use agentmux::render::Format;
use bytes::Bytes;
use common::doubles::{CountingIds, SteppingClock};
use common::wait::eventually;
use serde_json::Value;

/// How long any single wait in these tests may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

const DONE: &[u8] = b"data: [DONE]\n\n";

/// The two formats every reader test runs in.
const FORMATS: [Format; 2] = [Format::Cui, Format::OPENAI];

// ---------------------------------------------------------------------------------------------------------
// Frame helpers
// ---------------------------------------------------------------------------------------------------------

/// A CUI frame's `id:` (if any) and its JSON.
fn cui(frame: &[u8]) -> (Option<u64>, Value) {
    let text = std::str::from_utf8(frame).expect("frames are UTF-8");
    let body = text.strip_suffix("\n\n").unwrap_or_else(|| panic!("frame without a blank line: {text:?}"));
    let (id, data) = match body.strip_prefix("id: ") {
        Some(rest) => {
            let (id, data) = rest.split_once('\n').expect("an id line then a data line");
            (Some(id.parse().expect("numeric id")), data)
        }
        None => (None, body),
    };
    let json = data.strip_prefix("data: ").unwrap_or_else(|| panic!("no data line: {text:?}"));
    (id, serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}")))
}

/// A CUI frame's `id:`, without parsing the JSON.
fn cui_id(frame: &[u8]) -> Option<u64> {
    let rest = frame.strip_prefix(b"id: ")?;
    let end = rest.iter().position(|&b| b == b'\n')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// An OpenAI frame's JSON; `None` for `data: [DONE]`.
fn openai(frame: &[u8]) -> Option<Value> {
    if frame == DONE {
        return None;
    }
    let text = std::str::from_utf8(frame).expect("frames are UTF-8");
    assert!(!text.starts_with("id:"), "OpenAI frames carry no id line: {text:?}");
    let json = text
        .strip_prefix("data: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("not one data line: {text:?}"));
    Some(serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}")))
}

/// The text content carried by OpenAI frames, in order.
fn openai_content(frames: &[Bytes]) -> String {
    let mut content = String::new();
    for frame in frames {
        if let Some(json) = openai(frame)
            && let Some(text) = json["choices"][0]["delta"]["content"].as_str()
        {
            content.push_str(text);
        }
    }
    content
}

/// Asserts the CUI frames carry exactly the ids `first..=last`, each once and in order.
fn assert_cui_ids(frames: &[Bytes], first: u64, last: u64) {
    let ids: Vec<u64> = frames.iter().map(|f| cui_id(f).unwrap_or_else(|| panic!("frame without id: {f:?}"))).collect();
    assert_eq!(ids.len() as u64, last + 1 - first, "frame count from {first} to {last}");
    for (offset, id) in ids.iter().enumerate() {
        assert_eq!(*id, first + offset as u64, "ids run without gaps or repeats");
    }
}

/// The `stream_end` event's data, asserting the frame is one.
fn stream_end_data(frame: &[u8]) -> Value {
    let (id, json) = cui(frame);
    assert!(id.is_some(), "stream_end is part of the log");
    assert_eq!(json["type"], "event", "{json}");
    assert_eq!(json["props"]["event"], "stream_end", "{json}");
    json["props"]["data"].clone()
}

/// Every frame until the subscription ends, asserting no batch is a lagged notice.
async fn read_to_end(subscription: &mut Subscription) -> Vec<Bytes> {
    let mut frames = Vec::new();
    while let Some(batch) = next(subscription).await {
        assert!(!batch.lagged, "unexpected lagged notice: {:?}", batch.frames());
        frames.extend(batch.frames());
    }
    frames
}

/// The next batch, failing the test instead of hanging.
async fn next(subscription: &mut Subscription) -> Option<Batch> {
    tokio::time::timeout(PATIENCE, subscription.next()).await.expect("a batch within the patience")
}

/// Delta `i`: 60 bytes, distinct.
fn delta_text(i: usize) -> String {
    format!("{i:06}:{}", "abcdefghij".repeat(6).get(..53).unwrap_or_default())
}

/// Appends `n` deltas of one streaming text message, ends it, and returns (sequence, text) of each delta.
fn fill(stream: &Arc<Stream>, n: usize) -> Vec<(u64, String)> {
    let output = Output::new(Arc::clone(stream));
    let mut text = output.stream_text();
    let sent = (0..n)
        .map(|i| {
            let chunk = delta_text(i);
            (text.append(chunk.clone()).expect("append"), chunk)
        })
        .collect();
    text.end().expect("end the text");
    sent
}

/// The text of the deltas with a sequence after `after`.
fn text_after(sent: &[(u64, String)], after: u64) -> String {
    sent.iter().filter(|(sequence, _)| *sequence > after).map(|(_, text)| text.as_str()).collect()
}

/// Reads batches until one ends at or after sequence `at`, asserting none is a lagged notice.
async fn read_until(subscription: &mut Subscription, at: u64) -> (Vec<Bytes>, u64) {
    let mut frames = Vec::new();
    loop {
        let batch = next(subscription).await.expect("the stream is still open");
        assert!(!batch.lagged, "lagged while the history is kept");
        frames.extend(batch.frames());
        if batch.last_sequence >= at {
            return (frames, batch.last_sequence);
        }
    }
}

/// Reads `count` batches: the frames and the `last_sequence` of the last one.
async fn read_batches(subscription: &mut Subscription, count: usize) -> (Vec<Bytes>, u64) {
    let (mut frames, mut last) = (Vec::new(), 0);
    for _ in 0..count {
        let batch = next(subscription).await.expect("a batch");
        assert!(!batch.lagged, "lagged while the history is kept");
        frames.extend(batch.frames());
        last = batch.last_sequence;
    }
    (frames, last)
}

/// Reads until it holds its format's last frame (`stream_end` in CUI, `[DONE]` in OpenAI), without asking
/// for the `None` that follows.
async fn read_every_frame(subscription: &mut Subscription, format: Format) -> Vec<Bytes> {
    let mut frames: Vec<Bytes> = Vec::new();
    let is_last = |frame: &Bytes| match format {
        Format::Cui => cui(frame).1["props"]["event"] == "stream_end",
        _ => &frame[..] == DONE,
    };
    while !frames.last().is_some_and(is_last) {
        let batch = next(subscription).await.expect("frames until the end");
        assert!(!batch.lagged, "lagged while the history is kept");
        frames.extend(batch.frames());
    }
    frames
}

/// A hub on a [`SteppingClock`] the test moves by hand, with counting ids.
fn hub_on_clock(retention: Duration, batch_bytes: u64) -> (Hub, Arc<SteppingClock>) {
    let clock = Arc::new(SteppingClock::new(1_700_000_000_000));
    let config = HubConfig {
        retention,
        batch_bytes,
        clock: Arc::clone(&clock) as _,
        ids: Arc::new(CountingIds::default()),
        ..HubConfig::default()
    };
    (Hub::new(config), clock)
}

/// Moves the clock past the retention and lets the hub evict: `stream` must be gone afterwards.
fn evict(hub: &Hub, clock: &SteppingClock, stream: &Stream) {
    clock.advance(hub.config().retention.as_millis() as u64);
    assert!(hub.get(stream.id()).is_none(), "evicted once its retention has passed");
}

// ---------------------------------------------------------------------------------------------------------
// 1. Being behind is free: a stalled subscriber reads on and gets everything
// ---------------------------------------------------------------------------------------------------------

/// Deltas the producer appends while the stalled subscribers do not read.
const STALL_DELTAS: usize = 20_000;
/// Deltas appended before they stall (they read these first).
const BEFORE_STALL: usize = 200;
/// Bytes of text per delta: 20,000 of them make about 5 MB of text, more in each format.
const LONG_DELTA_BYTES: usize = 250;

/// Delta `i` of the long stream: `LONG_DELTA_BYTES` bytes, distinct.
fn long_delta_text(i: usize) -> String {
    let mut text = format!("{i:06}:");
    while text.len() < LONG_DELTA_BYTES {
        text.push_str("lorem ipsum dolor sit amet ");
    }
    text.truncate(LONG_DELTA_BYTES);
    text
}

/// Asserts a full read of the stream of [`long_delta_text`]s: every sequence once in CUI, all the text once
/// and a clean finish in OpenAI.
fn assert_complete(format: Format, frames: &[Bytes], last: u64, text: &str) {
    match format {
        Format::Cui => {
            assert_cui_ids(frames, 1, last);
            assert_eq!(stream_end_data(frames.last().expect("frames"))["status"], "completed");
        }
        _ => {
            assert!(openai_content(frames) == text, "an OpenAI reader gets all the text, once, in order");
            assert_eq!(&frames.last().expect("frames")[..], DONE);
            let finish = openai(&frames[frames.len() - 2]).expect("the finish chunk");
            assert_eq!(finish["choices"][0]["finish_reason"], "stop", "{finish}");
        }
    }
}

/// Reads a whole subscription, for a spawned fast reader.
async fn read_all(mut subscription: Subscription) -> Vec<Bytes> {
    read_to_end(&mut subscription).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subscriber_that_stalls_while_megabytes_go_by_then_reads_on_gets_exactly_what_a_fast_one_got() {
    let hub = Hub::new(HubConfig { batch_bytes: 16 << 10, ..HubConfig::default() });
    let stream = hub.create("load").expect("create");

    // In each format: one subscriber that reads the start and then stalls, one that reads nothing until the end.
    let mut stalled_midway = Vec::new();
    let mut never_read = Vec::new();
    for format in FORMATS {
        stalled_midway.push((format, stream.subscribe(format, 0).expect("subscribe")));
        never_read.push((format, stream.subscribe(format, 0).expect("subscribe")));
    }
    // And fast ones that read as the producer goes.
    let fast: Vec<_> = FORMATS
        .iter()
        .cycle()
        .take(6)
        .map(|&format| (format, tokio::spawn(read_all(stream.subscribe(format, 0).expect("subscribe")))))
        .collect();

    let output = Output::new(Arc::clone(&stream));
    let mut text = output.stream_text();
    let mut sent = Vec::with_capacity(STALL_DELTAS);
    for i in 0..BEFORE_STALL {
        let chunk = long_delta_text(i);
        sent.push((text.append(chunk.clone()).expect("append"), chunk));
    }
    let mut read_before_stall = Vec::new();
    for (_, subscription) in &mut stalled_midway {
        let (frames, _) = read_until(subscription, stream.last_sequence()).await;
        read_before_stall.push(frames);
    }

    // They stall; the producer appends megabytes at full speed, never waiting for anyone.
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in BEFORE_STALL..STALL_DELTAS {
        let chunk = long_delta_text(i);
        let append = Instant::now();
        let sequence = text.append(chunk.clone()).expect("the producer is never refused");
        slowest = slowest.max(append.elapsed());
        sent.push((sequence, chunk));
        if i % 512 == 0 {
            // Lets the fast readers' tasks run on this worker too; the producer never waits on a reader.
            tokio::task::yield_now().await;
        }
    }
    text.end().expect("end the text");
    assert!(stream.end(Outcome::completed()));
    eprintln!(
        "producer appended {} deltas in {:?} (slowest append {slowest:?}) while 4 subscribers stalled",
        STALL_DELTAS - BEFORE_STALL,
        started.elapsed()
    );
    let last = stream.last_sequence();
    let everything = text_after(&sent, 0);

    // The fast readers got everything; per format they got the same bytes.
    let mut reference: Vec<(Format, Vec<Bytes>)> = Vec::new();
    for (format, reader) in fast {
        let frames = tokio::time::timeout(PATIENCE, reader).await.expect("a fast reader ends").expect("no panic");
        assert_complete(format, &frames, last, &everything);
        match reference.iter().find(|(f, _)| *f == format) {
            Some((_, first)) => assert_same_frames(&frames, first, "two fast readers of one format"),
            None => reference.push((format, frames)),
        }
    }
    let reference_of = |format: Format| &reference.iter().find(|(f, _)| *f == format).expect("a reference").1;
    let cui_bytes: usize = reference_of(Format::Cui).iter().map(Bytes::len).sum();
    assert!(cui_bytes > 5 << 20, "megabytes went by while they stalled: {cui_bytes} bytes of CUI frames");

    // Being behind costs nothing: more subscribers that are as far behind add no bytes, and neither does
    // reading on (every frame is rendered already, and shared).
    let held = hub.bytes();
    let more: Vec<Subscription> =
        FORMATS.iter().cycle().take(20).map(|&f| stream.subscribe(f, 0).expect("subscribe")).collect();
    assert_eq!(hub.bytes(), held, "a subscriber that is behind holds nothing of its own");

    // The stalled ones read on, from where they stopped: exactly what a fast one got, without a gap.
    for ((format, mut subscription), before) in stalled_midway.into_iter().zip(read_before_stall) {
        let mut frames = before;
        frames.extend(read_to_end(&mut subscription).await);
        assert_same_frames(&frames, reference_of(format), &format!("{format:?} stalled midway, then read on"));
    }
    for (format, mut subscription) in never_read {
        let frames = read_to_end(&mut subscription).await;
        assert_same_frames(&frames, reference_of(format), &format!("{format:?} read nothing until the end"));
    }
    assert_eq!(hub.bytes(), held, "reading on adds nothing either");
    drop(more);
}

// ---------------------------------------------------------------------------------------------------------
// 2. Lagged only when the history is gone: eviction
// ---------------------------------------------------------------------------------------------------------

const RETENTION: Duration = Duration::from_secs(60);

/// Checks a CUI lagged batch: one `error` frame without an id, code `lagged`, `resume_from` where the kept
/// history starts; the batch's `last_sequence` is what the subscriber had.
fn assert_cui_lagged(batch: &Batch, had: u64, kept_after: u64) {
    assert!(batch.lagged, "a lagged batch: {:?}", batch.frames());
    assert_eq!(batch.last_sequence, had, "the batch names what the subscriber had");
    assert_eq!(batch.frames().len(), 1, "the notice is one frame: {:?}", batch.frames());
    let (id, json) = cui(&batch.frames()[0]);
    assert_eq!(id, None, "the notice is not part of the log, so it has no id");
    assert_eq!(json["type"], "error", "{json}");
    assert_eq!(json["props"]["code"], "lagged", "{json}");
    assert_eq!(json["props"]["details"]["resume_from"], kept_after, "{json}");
    assert!(json.get("metadata").is_none(), "the notice carries no sequence: {json}");
}

/// Checks an OpenAI lagged batch: an error envelope with code `lagged` naming where the kept history
/// starts, then `[DONE]`.
fn assert_openai_lagged(batch: &Batch, had: u64, kept_after: u64) {
    assert!(batch.lagged, "a lagged batch: {:?}", batch.frames());
    assert_eq!(batch.last_sequence, had, "the batch names what the subscriber had");
    assert_eq!(batch.frames().len(), 2, "error then [DONE]: {:?}", batch.frames());
    let error = openai(&batch.frames()[0]).expect("an error frame first");
    assert_eq!(error["error"]["code"], "lagged", "{error}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.ends_with(&format!("sequence {kept_after}")), "names where the history starts: {error}");
    assert_eq!(&batch.frames()[1][..], DONE);
}

#[tokio::test]
async fn a_subscriber_still_behind_when_its_stream_is_evicted_gets_one_lagged_batch_then_none() {
    let (hub, clock) = hub_on_clock(RETENTION, 4 << 10);
    let stream = hub.create("evicted").expect("create");
    // Subscribed before anything was appended and never read: its rendition renders nothing before eviction.
    let unrendered_openai = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let sent = fill(&stream, 300);
    assert!(stream.end(Outcome::completed()));
    let last = stream.last_sequence();

    let never_read_cui = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let mut partly_read_cui = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let (cui_frames, cui_had) = read_batches(&mut partly_read_cui, 2).await;
    assert_cui_ids(&cui_frames, 1, cui_had);
    let joined_midway_cui = stream.subscribe(Format::Cui, last / 2).expect("subscribe");
    let mut partly_read_openai = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let (openai_frames, openai_had) = read_batches(&mut partly_read_openai, 2).await;
    assert_eq!(openai_content(&openai_frames), text_after(&sent, 0)[..openai_content(&openai_frames).len()]);
    // Someone read all of the CUI rendition, so the ones behind in it are behind rendered frames.
    let mut complete = stream.subscribe(Format::Cui, 0).expect("subscribe");
    assert_cui_ids(&read_to_end(&mut complete).await, 1, last);
    assert!(cui_had < last && openai_had < last, "they are behind");

    evict(&hub, &clock, &stream);
    assert_eq!(hub.bytes(), 0, "the evicted stream gave back every byte");

    for (mut subscription, had) in [(never_read_cui, 0), (partly_read_cui, cui_had), (joined_midway_cui, last / 2)] {
        let notice = next(&mut subscription).await.expect("the lagged batch");
        assert_cui_lagged(&notice, had, last);
        assert!(next(&mut subscription).await.is_none(), "nothing after the lagged batch");
        assert!(next(&mut subscription).await.is_none(), "and it stays ended");
    }
    for (mut subscription, had) in [(unrendered_openai, 0), (partly_read_openai, openai_had)] {
        let notice = next(&mut subscription).await.expect("the lagged batch");
        assert_openai_lagged(&notice, had, last);
        assert!(next(&mut subscription).await.is_none(), "nothing after the lagged batch");
    }
    assert!(next(&mut complete).await.is_none(), "a subscriber that had ended stays ended, without a notice");
}

/// A subscriber that took every frame and saw its end (`None`) before the eviction is not told anything.
#[tokio::test]
async fn a_subscriber_that_finished_before_its_stream_is_evicted_just_ends() {
    let (hub, clock) = hub_on_clock(RETENTION, 4 << 10);
    let stream = hub.create("finished").expect("create");
    fill(&stream, 50);
    assert!(stream.end(Outcome::completed()));
    let mut finished = Vec::new();
    for format in FORMATS {
        let mut subscription = stream.subscribe(format, 0).expect("subscribe");
        read_to_end(&mut subscription).await;
        finished.push(subscription);
    }
    evict(&hub, &clock, &stream);
    for mut subscription in finished {
        assert!(next(&mut subscription).await.is_none(), "no lagged notice for a subscriber that had finished");
    }
}

/// A subscriber fully caught up at the eviction (it holds every frame, `stream_end` or `[DONE]` included)
/// needs nothing more from the history, so it ends normally: `None`, not a lagged notice, even if it had
/// not yet asked for the `None` that follows its last frame when the stream was evicted.
#[tokio::test]
async fn a_subscriber_holding_every_frame_ends_normally_when_its_stream_is_evicted() {
    let (hub, clock) = hub_on_clock(RETENTION, 4 << 10);
    let stream = hub.create("caught up").expect("create");
    fill(&stream, 50);
    assert!(stream.end(Outcome::completed()));
    let mut caught_up = Vec::new();
    for format in FORMATS {
        let mut subscription = stream.subscribe(format, 0).expect("subscribe");
        let frames = read_every_frame(&mut subscription, format).await;
        assert!(!frames.is_empty());
        caught_up.push((format, subscription));
    }
    evict(&hub, &clock, &stream);
    let mut wrong = Vec::new();
    for (format, mut subscription) in caught_up {
        if let Some(batch) = next(&mut subscription).await {
            wrong.push((format, batch.lagged, batch.frames()));
        }
    }
    assert!(
        wrong.is_empty(),
        "subscribers holding every frame got a batch after the eviction instead of their end: {wrong:?}"
    );
}

// ---------------------------------------------------------------------------------------------------------
// 3. Batching
// ---------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_backlog_comes_in_batches_bounded_by_batch_bytes_but_never_empty() {
    let batch_bytes = 2048u64;
    let hub = Hub::new(HubConfig { batch_bytes, ..HubConfig::default() });
    let stream = hub.create("batches").expect("create");
    for i in 0..300 {
        stream.append(OutputMessage::text(delta_text(i))).expect("append");
    }
    let big = stream.append(OutputMessage::text("y".repeat(8_000))).expect("append");
    for i in 0..20 {
        stream.append(OutputMessage::text(delta_text(i))).expect("append");
    }
    assert!(stream.end(Outcome::completed()));
    let last = stream.last_sequence();

    let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let mut batches = Vec::new();
    while let Some(batch) = next(&mut subscription).await {
        assert!(!batch.lagged);
        assert!(!batch.frames().is_empty(), "a batch is never empty");
        batches.push(batch);
    }
    assert!(batches[0].frames().len() > 5, "the first batch holds many frames: {}", batches[0].frames().len());
    assert!(batches.len() < 320 / 5, "many frames per batch: {} batches", batches.len());
    let mut oversized = 0;
    for (i, batch) in batches.iter().enumerate() {
        let len = batch.len() as u64;
        let last_id = cui_id(batch.frames().last().expect("frames")).expect("id");
        assert_eq!(batch.last_sequence, last_id, "last_sequence is the last frame's");
        if len > batch_bytes {
            assert_eq!(batch.frames().len(), 1, "over the bound only as a single frame");
            assert_eq!(last_id, big, "only the big frame is over the bound");
            oversized += 1;
        }
        if let Some(following) = batches.get(i + 1) {
            assert!(
                len + following.frames()[0].len() as u64 > batch_bytes,
                "batch {i} ({len} bytes) could have taken the next frame"
            );
        }
    }
    assert_eq!(oversized, 1);
    let frames: Vec<Bytes> = batches.into_iter().flat_map(|b| b.frames()).collect();
    assert_cui_ids(&frames, 1, last);
}

#[tokio::test]
async fn one_frame_larger_than_batch_bytes_reaches_a_waiting_subscriber_whole() {
    let hub = Hub::new(HubConfig { batch_bytes: 512, ..HubConfig::default() });
    let stream = hub.create("big").expect("create");
    let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
    assert_eq!(next(&mut subscription).await.expect("stream_start").last_sequence, 1);
    let waiting = tokio::spawn(async move {
        let batch = next(&mut subscription).await;
        (subscription, batch)
    });
    // Lets the reader start waiting before the append.
    tokio::task::yield_now().await;

    let sequence = stream.append(OutputMessage::text("z".repeat(4_000))).expect("append");
    let (mut subscription, batch) = waiting.await.expect("no panic");
    let batch = batch.expect("the big frame");
    assert!(!batch.lagged);
    assert_eq!(batch.frames().len(), 1, "one frame, whole, although larger than the batch bound");
    assert!(batch.len() > 4_000);
    assert_eq!(batch.last_sequence, sequence);

    assert!(stream.end(Outcome::completed()));
    let rest = read_to_end(&mut subscription).await;
    assert_eq!(stream_end_data(&rest[0])["status"], "completed");
}

// ---------------------------------------------------------------------------------------------------------
// 4. Cancel
// ---------------------------------------------------------------------------------------------------------

/// Emits ticks until cancelled, then returns.
struct Ticker {
    observed: Arc<AtomicBool>,
    returned: Arc<AtomicBool>,
}

impl Agent for Ticker {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        let cancelled = output.cancelled();
        tokio::pin!(cancelled);
        let mut tick = 0u64;
        loop {
            tokio::select! {
                biased;
                () = &mut cancelled => {
                    self.observed.store(true, Ordering::SeqCst);
                    self.returned.store(true, Ordering::SeqCst);
                    return Ok(Outcome::cancelled());
                }
                // The agent's pace: the scenario, not synchronisation.
                () = tokio::time::sleep(Duration::from_millis(2)) => {
                    // A tick racing the cancel may be refused; the next turn sees the cancel.
                    let _ = output.text(format!("tick {tick}"));
                    tick += 1;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_agent_and_ends_the_stream_cancelled() {
    let hub = Hub::default();
    let observed = Arc::new(AtomicBool::new(false));
    let returned = Arc::new(AtomicBool::new(false));
    let ticker = Ticker { observed: Arc::clone(&observed), returned: Arc::clone(&returned) };
    let stream = agent::run(&hub, Arc::new(ticker), Conversation::user("ticker", "go")).expect("run");
    let mut cui_sub = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let mut openai_sub = stream.subscribe(Format::OPENAI, 0).expect("subscribe");

    let mut frames = Vec::new();
    while frames.iter().filter(|f: &&Bytes| cui(f).1["type"] == "text").count() < 3 {
        frames.extend(next(&mut cui_sub).await.expect("open").frames());
    }
    assert_eq!(stream.status(), Status::Open);
    assert!(stream.cancel(), "the first cancel ends the open stream");
    assert!(!stream.cancel(), "a second cancel finds it ended");
    assert_eq!(stream.status(), Status::Cancelled, "ended at once, without waiting for the agent");

    eventually("the agent to return", PATIENCE, async || returned.load(Ordering::SeqCst)).await;
    assert!(observed.load(Ordering::SeqCst), "the agent saw the cancel");
    // A moment for the run to hand over the agent's outcome, which must change nothing: nothing to wait for.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(stream.status(), Status::Cancelled, "the agent's own outcome does not replace it");

    frames.extend(read_to_end(&mut cui_sub).await);
    let data = stream_end_data(frames.last().expect("frames"));
    assert_eq!(data["status"], "cancelled", "{data}");
    assert_eq!(frames.iter().filter(|f| cui(f).1["props"]["event"] == "stream_end").count(), 1);

    let frames = read_to_end(&mut openai_sub).await;
    assert!(openai_content(&frames).contains("tick 0"));
    assert_eq!(&frames.last().expect("frames")[..], DONE);
    let error = openai(&frames[frames.len() - 2]).expect("an error frame before [DONE]");
    assert_eq!(error["error"]["code"], "cancelled", "{error}");
}

/// Stops as soon as it is cancelled and reports how the run went as it sees it: a natural agent, and what
/// the built-in `DemoAgent` does too (it returns `Err(cancelled)`).
struct Quitter {
    fail: bool,
}

impl Agent for Quitter {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        output.text("working")?;
        output.cancelled().await;
        if self.fail { Err(AgentError::new("cancelled").with_code("cancelled")) } else { Ok(Outcome::completed()) }
    }
}

/// A cancel ends the stream `cancelled` before the agent, woken by the token, can end it with its own
/// outcome (it once fired the token first, and lost this race in most runs on a 2-CPU machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_the_stream_cancelled_before_the_agent_can_end_it() {
    let hub = Hub::default();
    let mut wrong = Vec::new();
    for round in 0..40 {
        let agent = Quitter { fail: round % 2 == 1 };
        let stream = agent::run(&hub, Arc::new(agent), Conversation::user("quitter", "go")).expect("run");
        let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
        while stream.last_sequence() < 2 {
            next(&mut subscription).await.expect("open");
        }
        let cancelled = stream.cancel();
        let frames = read_to_end(&mut subscription).await;
        let end = stream_end_data(frames.last().expect("frames"));
        if !cancelled || stream.status() != Status::Cancelled || end["status"] != "cancelled" {
            wrong.push((round, cancelled, stream.status(), end));
        }
    }
    assert!(wrong.is_empty(), "{} of 40 cancels lost to the agent's outcome: {wrong:?}", wrong.len());
}

/// An agent whose emit is refused because a cancel ended its stream already sees itself cancelled, so it
/// can tell a cancel from a failure: nobody sees the stream ended by a cancel before its token has fired (the
/// token once fired after the end, and an agent on another thread could fall between the two).
#[test]
fn a_stream_ended_by_a_cancel_is_seen_cancelled_by_its_agent_at_once() {
    let hub = Hub::default();
    let mut wrong = Vec::new();
    for round in 0..200 {
        let stream = hub.create("cancelled").expect("create");
        let watching = {
            let stream = Arc::clone(&stream);
            std::thread::spawn(move || {
                // What an agent does: it emits until refused, then asks whether it was cancelled.
                while stream.append(OutputMessage::text("tick")).is_ok() {}
                stream.cancellation().is_cancelled()
            })
        };
        while stream.last_sequence() < 20 {
            std::thread::yield_now();
        }
        assert!(stream.cancel());
        if !watching.join().expect("the watcher") {
            wrong.push(round);
        }
    }
    assert!(wrong.is_empty(), "{} of 200 refused emits came before the cancel's token: {wrong:?}", wrong.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_demo_agent_ends_its_stream_cancelled() {
    let hub = Hub::default();
    let mut wrong = Vec::new();
    for round in 0..40 {
        let stream =
            agent::run(&hub, Arc::new(agent::DemoAgent::default()), Conversation::user("demo", "hi")).expect("run");
        let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
        next(&mut subscription).await.expect("the first batch");
        stream.cancel();
        let frames = read_to_end(&mut subscription).await;
        let end = stream_end_data(frames.last().expect("frames"));
        if stream.status() != Status::Cancelled {
            wrong.push((round, stream.status(), end));
        }
    }
    assert!(wrong.is_empty(), "{} of 40 demo runs did not end cancelled: {wrong:?}", wrong.len());
}

/// Each emit of [`Stubborn`]: whether the test had cancelled by then, and what the emit returned.
type Emits = Arc<Mutex<Vec<(bool, Result<u64, AppendError>)>>>;

/// Ignores the cancel: keeps emitting until it has been refused `AFTER` times after the test cancelled.
struct Stubborn {
    cancel_done: Arc<AtomicBool>,
    emits: Emits,
    returned: Arc<AtomicBool>,
}

impl Stubborn {
    const AFTER: usize = 5;
}

impl Agent for Stubborn {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        for i in 0..5_000 {
            // The agent's pace: the scenario, not synchronisation.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let after_cancel = self.cancel_done.load(Ordering::SeqCst);
            let result = output.text(format!("still here {i}"));
            let mut emits = self.emits.lock().unwrap();
            emits.push((after_cancel, result));
            if emits.iter().filter(|(after, _)| *after).count() >= Self::AFTER {
                break;
            }
        }
        self.returned.store(true, Ordering::SeqCst);
        Ok(Outcome::completed())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_ignores_cancel_runs_on_but_its_emits_are_refused() {
    let hub = Hub::default();
    let cancel_done = Arc::new(AtomicBool::new(false));
    let emits = Arc::new(Mutex::new(Vec::new()));
    let returned = Arc::new(AtomicBool::new(false));
    let agent =
        Stubborn { cancel_done: Arc::clone(&cancel_done), emits: Arc::clone(&emits), returned: Arc::clone(&returned) };
    let stream = agent::run(&hub, Arc::new(agent), Conversation::user("stubborn", "go")).expect("run");
    let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
    eventually("a few emits", PATIENCE, async || emits.lock().unwrap().len() >= 3).await;

    assert!(stream.cancel());
    cancel_done.store(true, Ordering::SeqCst);
    assert_eq!(stream.status(), Status::Cancelled);
    eventually("the agent to return", PATIENCE, async || returned.load(Ordering::SeqCst)).await;

    let emits = emits.lock().unwrap().clone();
    let (before, after): (Vec<_>, Vec<_>) = emits.into_iter().partition(|(after, _)| !after);
    assert!(before.iter().take(3).all(|(_, r)| r.is_ok()), "emits before the cancel went in: {before:?}");
    assert_eq!(after.len(), Stubborn::AFTER, "the agent kept running after the cancel");
    assert!(after.iter().all(|(_, r)| *r == Err(AppendError::Ended)), "refused after the cancel: {after:?}");

    // A moment for the run to hand over the agent's outcome, which must change nothing: nothing to wait for.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(stream.status(), Status::Cancelled, "the agent's `completed` does not replace the cancel");
    let frames = read_to_end(&mut subscription).await;
    assert_eq!(stream_end_data(frames.last().expect("frames"))["status"], "cancelled");
}

// ---------------------------------------------------------------------------------------------------------
// 5. Subscribers going away do not stop the agent
// ---------------------------------------------------------------------------------------------------------

/// Emits `count` texts with short pauses.
struct Chatty {
    count: usize,
}

impl Agent for Chatty {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        for i in 0..self.count {
            if i % 10 == 0 {
                // The agent's pace: the scenario, not synchronisation.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            output.text(format!("line {i}"))?;
        }
        Ok(Outcome::completed())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_subscriber_does_not_stop_the_agent() {
    let hub = Hub::default();
    let count = 200;
    let stream = agent::run(&hub, Arc::new(Chatty { count }), Conversation::user("chatty", "go")).expect("run");
    {
        let mut cui_sub = stream.subscribe(Format::Cui, 0).expect("subscribe");
        let mut openai_sub = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
        assert!(!next(&mut cui_sub).await.expect("a batch").frames().is_empty());
        assert!(!next(&mut openai_sub).await.expect("a batch").frames().is_empty());
        assert_eq!(stream.status(), Status::Open, "dropped while the agent still runs");
    }
    eventually("the agent to complete", PATIENCE, async || stream.status() != Status::Open).await;
    assert_eq!(stream.status(), Status::Completed);

    let mut late = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let frames = read_to_end(&mut late).await;
    assert_cui_ids(&frames, 1, stream.last_sequence());
    let texts: Vec<String> = frames
        .iter()
        .map(|f| cui(f).1)
        .filter(|j| j["type"] == "text")
        .map(|j| j["props"]["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(texts, (0..count).map(|i| format!("line {i}")).collect::<Vec<_>>());
    assert_eq!(stream_end_data(frames.last().expect("frames"))["status"], "completed");

    let mut late = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let frames = read_to_end(&mut late).await;
    assert!(openai_content(&frames).contains(&format!("line {}", count - 1)));
    assert_eq!(&frames.last().expect("frames")[..], DONE);
}

// ---------------------------------------------------------------------------------------------------------
// 6. Agent failures
// ---------------------------------------------------------------------------------------------------------

struct Panicky;

impl Agent for Panicky {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        output.text("about to fail")?;
        tokio::task::yield_now().await;
        panic!("the agent fell over (expected by the test)");
    }
}

struct Failing;

impl Agent for Failing {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        output.text("trying")?;
        Err(AgentError::new("the upstream model timed out").with_code("upstream_timeout"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_agent_ends_the_stream_with_agent_panicked() {
    let hub = Hub::default();
    let stream = agent::run(&hub, Arc::new(Panicky), Conversation::user("panicky", "go")).expect("run");
    let mut cui_sub = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let mut openai_sub = stream.subscribe(Format::OPENAI, 0).expect("subscribe");

    let frames = read_to_end(&mut cui_sub).await;
    assert_eq!(stream.status(), Status::Error);
    assert!(frames.iter().any(|f| cui(f).1["props"]["content"] == "about to fail"));
    let data = stream_end_data(frames.last().expect("frames"));
    assert_eq!(data["status"], "error", "{data}");
    assert_eq!(data["error"]["code"], "agent_panicked", "{data}");

    let frames = read_to_end(&mut openai_sub).await;
    assert_eq!(&frames.last().expect("frames")[..], DONE);
    let error = openai(&frames[frames.len() - 2]).expect("an error frame");
    assert_eq!(error["error"]["code"], "agent_panicked", "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_error_ends_the_stream_with_its_message() {
    let hub = Hub::default();
    let stream = agent::run(&hub, Arc::new(Failing), Conversation::user("failing", "go")).expect("run");
    let mut cui_sub = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let mut openai_sub = stream.subscribe(Format::OPENAI, 0).expect("subscribe");

    let frames = read_to_end(&mut cui_sub).await;
    assert_eq!(stream.status(), Status::Error);
    let data = stream_end_data(frames.last().expect("frames"));
    assert_eq!(data["status"], "error", "{data}");
    assert_eq!(data["error"]["message"], "the upstream model timed out", "{data}");
    assert_eq!(data["error"]["code"], "upstream_timeout", "{data}");

    let frames = read_to_end(&mut openai_sub).await;
    assert_eq!(openai_content(&frames), "trying");
    assert_eq!(&frames.last().expect("frames")[..], DONE);
    let error = openai(&frames[frames.len() - 2]).expect("an error frame");
    assert_eq!(error["error"]["message"], "the upstream model timed out", "{error}");
    assert_eq!(error["error"]["code"], "upstream_timeout", "{error}");
}

// ---------------------------------------------------------------------------------------------------------
// 7. Retention, by the hub's clock
// ---------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_ended_stream_is_kept_for_the_retention_time_then_evicted() {
    let (hub, clock) = hub_on_clock(RETENTION, HubConfig::default().batch_bytes);
    let retention_ms = RETENTION.as_millis() as u64;
    let ended = hub.create("retained").expect("create");
    let open = hub.create("open").expect("create");
    ended.append(OutputMessage::text("kept a while")).expect("append");
    open.append(OutputMessage::text("still going")).expect("append");
    assert!(ended.end(Outcome::completed()));
    let id = ended.id().to_owned();
    assert!(ended.held_bytes() > 0 && open.held_bytes() > 0);
    assert_eq!(hub.bytes(), ended.held_bytes() + open.held_bytes(), "the hub counts what its streams hold");

    let found = hub.get(&id).expect("readable right after ending");
    assert_eq!(found.status(), Status::Completed);
    let mut subscription = found.subscribe(Format::Cui, 0).expect("subscribe");
    assert_eq!(read_to_end(&mut subscription).await.len(), 3, "stream_start, the text, stream_end");
    assert_eq!(hub.bytes(), ended.held_bytes() + open.held_bytes(), "renditions are counted with their stream");

    clock.advance(retention_ms - 1_000);
    let found = hub.get(&id).expect("still readable within its retention");
    let mut subscription = found.subscribe(Format::OPENAI, 0).expect("subscribe");
    let frames = read_to_end(&mut subscription).await;
    assert_eq!(openai_content(&frames), "kept a while");
    assert_eq!(&frames.last().expect("frames")[..], DONE);

    clock.advance(1_000);
    assert!(hub.get(&id).is_none(), "evicted once its retention has passed");
    assert!(hub.get(open.id()).is_some(), "an open stream is never evicted");
    assert_eq!(hub.len(), 1);
    assert_eq!(ended.held_bytes(), 0, "the evicted stream holds nothing, though handles to it remain");
    assert_eq!(hub.bytes(), open.held_bytes(), "the hub holds only what the remaining stream holds");

    // `create` evicts too, and an open stream stays however long it is open.
    let second = hub.create("second").expect("create");
    second.append(OutputMessage::text("short-lived")).expect("append");
    assert!(second.end(Outcome::completed()));
    clock.advance(10 * retention_ms);
    let third = hub.create("third").expect("create");
    assert_eq!(hub.len(), 2, "creating a stream evicted the one whose retention had passed");
    assert!(hub.get(second.id()).is_none());
    assert!(hub.get(open.id()).is_some(), "an open stream is never evicted");
    assert_eq!(hub.bytes(), open.held_bytes() + third.held_bytes());
}

/// An evicted stream holds nothing, even through a handle kept past the eviction (a request that looked the
/// stream up just before it was evicted): subscribing through that handle can only give the lagged notice,
/// and must not count the forgotten log against the hub's limit again.
#[tokio::test]
async fn subscribing_through_a_handle_kept_past_eviction_counts_nothing_against_the_hub() {
    let (hub, clock) = hub_on_clock(RETENTION, HubConfig::default().batch_bytes);
    let stream = hub.create("kept").expect("create");
    fill(&stream, 20);
    assert!(stream.end(Outcome::completed()));
    let last = stream.last_sequence();
    evict(&hub, &clock, &stream);
    assert_eq!(hub.bytes(), 0);

    let mut late = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let notice = next(&mut late).await.expect("the lagged batch");
    assert_openai_lagged(&notice, 0, last);
    assert!(next(&mut late).await.is_none());
    assert_eq!(
        (hub.bytes(), stream.held_bytes()),
        (0, 0),
        "bytes counted for a stream the hub no longer holds, while a handle to it lives"
    );
}
