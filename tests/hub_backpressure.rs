//! Backpressure, batching, cancellation, agent failures and retention, seen from the outside of the hub.
//!
//! - A subscriber that stops reading is cut off with one `lagged` notice (and can resume from the sequence
//!   it names) while the producer and every other subscriber go on at full speed.
//! - History that existed when a subscriber joined never counts against its bound.
//! - A backlog is handed out in batches bounded by `batch_bytes`, but never less than one frame.
//! - `Stream::cancel` reaches the agent, ends the stream `cancelled`, and refuses later emits.
//! - Subscribers going away do not stop an agent; a panic or an error ends the stream with status `error`.
//! - An ended stream stays readable for the retention time, then `Hub::get` no longer finds it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentmux::agent::{self, Agent, AgentError, Output};
use agentmux::conversation::ChatRequest;
use agentmux::hub::{AppendError, Batch, Format, Hub, HubConfig, Status, Stream, Subscription};
use agentmux::output::{Outcome, OutputMessage};
use bytes::Bytes;
use serde_json::Value;

/// How long any single wait in these tests may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

const DONE: &[u8] = b"data: [DONE]\n\n";

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

/// Waits until `done` holds, failing the test instead of hanging.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
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

// ---------------------------------------------------------------------------------------------------------
// 1. A slow subscriber is cut off; the producer and the fast subscribers are not slowed
// ---------------------------------------------------------------------------------------------------------

const DELTAS: usize = 20_000;
/// How many messages the producer may run ahead of the readers that keep up. The producer never waits for a
/// reader that stopped (the whole point); it only keeps the ones that read from being scheduled out of their
/// 64 KiB bound on a loaded machine, so "fast" means fast by construction, not by luck. 100 messages of
/// about 250 bytes is well under 64 KiB.
const WINDOW: u64 = 100;
/// The stalling readers stop once they have this sequence.
const STALL_AT: u64 = 500;

/// Reads until the end, publishing how far it got.
async fn read_fast(mut subscription: Subscription, progress: Arc<AtomicU64>) -> Vec<Bytes> {
    let mut frames = Vec::new();
    while let Some(batch) = next(&mut subscription).await {
        assert!(!batch.lagged, "a fast subscriber lagged at sequence {}", batch.last_sequence);
        frames.extend(batch.frames());
        progress.store(batch.last_sequence, Ordering::Release);
    }
    progress.store(u64::MAX, Ordering::Release);
    frames
}

/// Reads until it has sequence `STALL_AT`, then stops (and tells the producer not to wait for it): returns
/// the subscription, the frames it read and the `last_sequence` of its last batch.
async fn read_then_stall(
    mut subscription: Subscription,
    progress: Arc<AtomicU64>,
) -> (Subscription, Vec<Bytes>, u64, usize) {
    let (mut frames, mut last, mut batches) = (Vec::new(), 0, 0);
    while last < STALL_AT {
        let batch = next(&mut subscription).await.expect("the stream is still open");
        assert!(!batch.lagged, "lagged before stalling");
        frames.extend(batch.frames());
        last = batch.last_sequence;
        batches += 1;
        progress.store(last, Ordering::Release);
    }
    progress.store(u64::MAX, Ordering::Release);
    (subscription, frames, last, batches)
}

/// Appends `DELTAS` text deltas as fast as the readers in `readers` keep up, then ends the stream.
async fn produce(stream: Arc<Stream>, readers: Vec<Arc<AtomicU64>>) -> Vec<(u64, String)> {
    let output = Output::new(Arc::clone(&stream));
    let mut text = output.stream_text();
    let mut sent = Vec::with_capacity(DELTAS);
    let mut last = stream.last_sequence();
    for i in 0..DELTAS {
        let mut spins = 0u32;
        while last.saturating_sub(readers.iter().map(|p| p.load(Ordering::Acquire)).min().unwrap_or(u64::MAX)) >= WINDOW
        {
            spins += 1;
            if spins < 32 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let chunk = delta_text(i);
        last = text.append(chunk.clone()).expect("the producer is never refused");
        sent.push((last, chunk));
    }
    text.end().expect("end the text");
    assert!(stream.end(Outcome::completed()));
    sent
}

/// Checks a CUI lagged notice: one `error` frame without an id, code `lagged`, resume from `resume`.
fn assert_cui_lagged(batch: &Batch, resume: u64) {
    assert!(batch.lagged);
    assert_eq!(batch.last_sequence, resume);
    assert_eq!(batch.frames().len(), 1, "the notice is one frame: {:?}", batch.frames());
    let (id, json) = cui(&batch.frames()[0]);
    assert_eq!(id, None, "the notice is not part of the log, so it has no id");
    assert_eq!(json["type"], "error", "{json}");
    assert_eq!(json["props"]["code"], "lagged", "{json}");
    assert_eq!(json["props"]["details"]["resume_from"], resume, "{json}");
    assert!(json.get("metadata").is_none(), "the notice carries no sequence: {json}");
}

/// Checks an OpenAI lagged notice: an error frame with code `lagged`, then `[DONE]`.
fn assert_openai_lagged(batch: &Batch, resume: u64) {
    assert!(batch.lagged);
    assert_eq!(batch.last_sequence, resume);
    assert_eq!(batch.frames().len(), 2, "error then [DONE]: {:?}", batch.frames());
    let error = openai(&batch.frames()[0]).expect("an error frame first");
    assert_eq!(error["error"]["code"], "lagged", "{error}");
    assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains(&resume.to_string())), "{error}");
    assert_eq!(&batch.frames()[1][..], DONE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_subscriber_gets_lagged_and_resumes_while_producer_and_fast_ones_run_at_full_speed() {
    let hub = Hub::new(HubConfig { queue_bytes: 64 << 10, batch_bytes: 16 << 10, ..HubConfig::default() });
    let stream = hub.create("load").expect("create");

    // The slow ones exist before the first delta.
    let mut never_cui = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let mut never_openai = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let mut paced = Vec::new();
    let mut stalling = Vec::new();
    for format in [Format::Cui, Format::OPENAI] {
        let progress = Arc::new(AtomicU64::new(0));
        paced.push(Arc::clone(&progress));
        let subscription = stream.subscribe(format, 0).expect("subscribe");
        stalling.push(tokio::spawn(read_then_stall(subscription, progress)));
    }
    let mut fast = Vec::new();
    for i in 0..10 {
        let format = if i % 2 == 0 { Format::Cui } else { Format::OPENAI };
        let progress = Arc::new(AtomicU64::new(0));
        paced.push(Arc::clone(&progress));
        let subscription = stream.subscribe(format, 0).expect("subscribe");
        fast.push((format, tokio::spawn(read_fast(subscription, progress))));
    }

    let started = Instant::now();
    let producer = tokio::spawn(produce(Arc::clone(&stream), paced));
    let sent = tokio::time::timeout(PATIENCE, producer).await.expect("the producer finishes").expect("no panic");
    eprintln!("producer appended {DELTAS} deltas in {:?}", started.elapsed());
    assert_eq!(sent.len(), DELTAS);
    assert_eq!(stream.status(), Status::Completed);
    let last = stream.last_sequence();
    let everything = text_after(&sent, 0);

    // Every fast subscriber got every message.
    for (format, reader) in fast {
        let frames = tokio::time::timeout(PATIENCE, reader).await.expect("a fast reader ends").expect("no panic");
        if format == Format::Cui {
            assert_cui_ids(&frames, 1, last);
            assert_eq!(stream_end_data(frames.last().expect("frames"))["status"], "completed");
        } else {
            assert_eq!(openai_content(&frames), everything, "an OpenAI reader got all the text once");
            assert_eq!(&frames.last().expect("frames")[..], DONE);
            let finish = openai(&frames[frames.len() - 2]).expect("the finish chunk");
            assert_eq!(finish["choices"][0]["finish_reason"], "stop", "{finish}");
        }
    }

    // Never read: lagged at 0, then the end; resuming from 0 gives everything.
    let notice = next(&mut never_cui).await.expect("the notice");
    assert_cui_lagged(&notice, 0);
    assert!(next(&mut never_cui).await.is_none(), "nothing after the notice");
    let mut resumed = stream.subscribe(Format::Cui, 0).expect("resume");
    assert_cui_ids(&read_to_end(&mut resumed).await, 1, last);

    let notice = next(&mut never_openai).await.expect("the notice");
    assert_openai_lagged(&notice, 0);
    assert!(next(&mut never_openai).await.is_none(), "nothing after the notice");
    let mut resumed = stream.subscribe(Format::OPENAI, 0).expect("resume");
    let frames = read_to_end(&mut resumed).await;
    assert_eq!(openai_content(&frames), everything);
    assert_eq!(&frames.last().expect("frames")[..], DONE);

    // Read a few batches, then stalled: lagged at what they had, and resuming from there gives the rest once.
    let mut stalled = Vec::new();
    for reader in stalling {
        stalled.push(tokio::time::timeout(PATIENCE, reader).await.expect("stalls").expect("no panic"));
    }
    let (mut cui_sub, cui_before, cui_n, cui_batches) = stalled.remove(0);
    assert!(cui_batches >= 1 && cui_n >= STALL_AT);
    assert_cui_ids(&cui_before, 1, cui_n);
    let notice = next(&mut cui_sub).await.expect("the notice");
    assert_cui_lagged(&notice, cui_n);
    assert!(next(&mut cui_sub).await.is_none(), "nothing after the notice");
    let mut resumed = stream.subscribe(Format::Cui, cui_n).expect("resume");
    let after = read_to_end(&mut resumed).await;
    assert_cui_ids(&after, cui_n + 1, last);
    assert_eq!(stream_end_data(after.last().expect("frames"))["status"], "completed");

    let (mut openai_sub, openai_before, openai_n, _) = stalled.remove(0);
    assert!(openai_n >= STALL_AT);
    let notice = next(&mut openai_sub).await.expect("the notice");
    assert_openai_lagged(&notice, openai_n);
    assert!(next(&mut openai_sub).await.is_none(), "nothing after the notice");
    let mut resumed = stream.subscribe(Format::OPENAI, openai_n).expect("resume");
    let after = read_to_end(&mut resumed).await;
    assert_eq!(
        openai_content(&openai_before),
        text_after(&sent, 0).strip_suffix(&text_after(&sent, openai_n)).unwrap()
    );
    assert_eq!(openai_content(&after), text_after(&sent, openai_n), "the rest, once");
    assert_eq!(openai_content(&openai_before) + &openai_content(&after), everything);
    assert_eq!(&after.last().expect("frames")[..], DONE);
}

// ---------------------------------------------------------------------------------------------------------
// 2. History at join does not count
// ---------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn resuming_from_zero_through_a_history_far_larger_than_the_bound_is_not_lagged() {
    let queue_bytes = 4 << 10;
    let hub = Hub::new(HubConfig { queue_bytes, batch_bytes: 8 << 10, ..HubConfig::default() });
    let stream = hub.create("history").expect("create");
    let sent = fill(&stream, 2_000);
    assert!(stream.end(Outcome::completed()));
    let last = stream.last_sequence();

    let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let frames = read_to_end(&mut subscription).await;
    let bytes: usize = frames.iter().map(Bytes::len).sum();
    assert!(bytes as u64 > 50 * queue_bytes, "the history ({bytes} bytes) dwarfs the bound");
    assert_cui_ids(&frames, 1, last);

    let mut subscription = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let frames = read_to_end(&mut subscription).await;
    assert_eq!(openai_content(&frames), text_after(&sent, 0));
    assert_eq!(&frames.last().expect("frames")[..], DONE);

    // From the middle too.
    let mut subscription = stream.subscribe(Format::Cui, last / 2).expect("subscribe");
    assert_cui_ids(&read_to_end(&mut subscription).await, last / 2 + 1, last);
}

#[tokio::test]
async fn on_an_open_stream_only_what_is_appended_after_joining_counts() {
    let queue_bytes = 4 << 10;
    let hub = Hub::new(HubConfig { queue_bytes, batch_bytes: 8 << 10, ..HubConfig::default() });
    let stream = hub.create("history").expect("create");
    for i in 0..2_000 {
        stream.append(OutputMessage::text(delta_text(i))).expect("append");
    }
    let history = stream.last_sequence();

    // Joined at 0 with a long history, then a little more (well under the bound) before the first read.
    let mut patient = stream.subscribe(Format::Cui, 0).expect("subscribe");
    for i in 0..5 {
        stream.append(OutputMessage::text(delta_text(i))).expect("append");
    }
    let mut frames = Vec::new();
    while frames.len() as u64 != history + 5 {
        let batch = next(&mut patient).await.expect("open");
        assert!(!batch.lagged, "history at join must not count");
        frames.extend(batch.frames());
    }
    assert_cui_ids(&frames, 1, history + 5);
    assert!(stream.end(Outcome::completed()));
    let rest = read_to_end(&mut patient).await;
    assert_cui_ids(&rest, history + 6, history + 6);

    // Joined at 0 likewise, but more than the bound arrives before it reads: lagged, resume from 0.
    let stream = hub.create("history").expect("create");
    for i in 0..2_000 {
        stream.append(OutputMessage::text(delta_text(i))).expect("append");
    }
    let mut behind = stream.subscribe(Format::Cui, 0).expect("subscribe");
    for i in 0..100 {
        stream.append(OutputMessage::text(delta_text(i))).expect("append");
    }
    let notice = next(&mut behind).await.expect("the notice");
    assert_cui_lagged(&notice, 0);
    assert!(next(&mut behind).await.is_none());
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
async fn one_frame_larger_than_both_bounds_is_delivered_not_lagged() {
    let hub = Hub::new(HubConfig { queue_bytes: 1024, batch_bytes: 512, ..HubConfig::default() });
    let stream = hub.create("big").expect("create");
    let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
    assert_eq!(next(&mut subscription).await.expect("stream_start").last_sequence, 1);

    let sequence = stream.append(OutputMessage::text("z".repeat(4_000))).expect("append");
    let batch = next(&mut subscription).await.expect("the big frame");
    assert!(!batch.lagged, "a single frame is handed out even when larger than the bound");
    assert_eq!(batch.frames().len(), 1);
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
    async fn run(&self, _request: ChatRequest, output: Output) -> Result<Outcome, AgentError> {
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
    let stream = agent::run(&hub, Arc::new(ticker), ChatRequest::user("ticker", "go")).expect("run");
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

    wait_until("the agent returns", || returned.load(Ordering::SeqCst)).await;
    assert!(observed.load(Ordering::SeqCst), "the agent saw the cancel");
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
    async fn run(&self, _request: ChatRequest, output: Output) -> Result<Outcome, AgentError> {
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
        let stream = agent::run(&hub, Arc::new(agent), ChatRequest::user("quitter", "go")).expect("run");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_demo_agent_ends_its_stream_cancelled() {
    let hub = Hub::default();
    let mut wrong = Vec::new();
    for round in 0..40 {
        let stream =
            agent::run(&hub, Arc::new(agent::DemoAgent::default()), ChatRequest::user("demo", "hi")).expect("run");
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
    async fn run(&self, _request: ChatRequest, output: Output) -> Result<Outcome, AgentError> {
        for i in 0..5_000 {
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
    let stream = agent::run(&hub, Arc::new(agent), ChatRequest::user("stubborn", "go")).expect("run");
    let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
    wait_until("a few emits", || emits.lock().unwrap().len() >= 3).await;

    assert!(stream.cancel());
    cancel_done.store(true, Ordering::SeqCst);
    assert_eq!(stream.status(), Status::Cancelled);
    wait_until("the agent returns", || returned.load(Ordering::SeqCst)).await;

    let emits = emits.lock().unwrap().clone();
    let (before, after): (Vec<_>, Vec<_>) = emits.into_iter().partition(|(after, _)| !after);
    assert!(before.iter().take(3).all(|(_, r)| r.is_ok()), "emits before the cancel went in: {before:?}");
    assert_eq!(after.len(), Stubborn::AFTER, "the agent kept running after the cancel");
    assert!(after.iter().all(|(_, r)| *r == Err(AppendError::Ended)), "refused after the cancel: {after:?}");

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
    async fn run(&self, _request: ChatRequest, output: Output) -> Result<Outcome, AgentError> {
        for i in 0..self.count {
            if i % 10 == 0 {
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
    let stream = agent::run(&hub, Arc::new(Chatty { count }), ChatRequest::user("chatty", "go")).expect("run");
    {
        let mut cui_sub = stream.subscribe(Format::Cui, 0).expect("subscribe");
        let mut openai_sub = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
        assert!(!next(&mut cui_sub).await.expect("a batch").frames().is_empty());
        assert!(!next(&mut openai_sub).await.expect("a batch").frames().is_empty());
        assert_eq!(stream.status(), Status::Open, "dropped while the agent still runs");
    }
    wait_until("the agent completes", || stream.status() != Status::Open).await;
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
    async fn run(&self, _request: ChatRequest, output: Output) -> Result<Outcome, AgentError> {
        output.text("about to fail")?;
        tokio::task::yield_now().await;
        panic!("the agent fell over (expected by the test)");
    }
}

struct Failing;

impl Agent for Failing {
    async fn run(&self, _request: ChatRequest, output: Output) -> Result<Outcome, AgentError> {
        output.text("trying")?;
        Err(AgentError::new("the upstream model timed out").with_code("upstream_timeout"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_agent_ends_the_stream_with_agent_panicked() {
    let hub = Hub::default();
    let stream = agent::run(&hub, Arc::new(Panicky), ChatRequest::user("panicky", "go")).expect("run");
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
    let stream = agent::run(&hub, Arc::new(Failing), ChatRequest::user("failing", "go")).expect("run");
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
// 7. Retention
// ---------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_ended_stream_is_kept_for_the_retention_time_then_evicted() {
    let hub = Hub::new(HubConfig { retention: Duration::from_millis(200), ..HubConfig::default() });
    let ended = hub.create("retained").expect("create");
    let open = hub.create("open").expect("create");
    ended.append(OutputMessage::text("kept a while")).expect("append");
    assert!(ended.end(Outcome::completed()));
    let id = ended.id().to_owned();

    let found = hub.get(&id).expect("readable right after ending");
    assert_eq!(found.status(), Status::Completed);
    let mut subscription = found.subscribe(Format::Cui, 0).expect("subscribe");
    assert_eq!(read_to_end(&mut subscription).await.len(), 3, "stream_start, the text, stream_end");
    drop((found, subscription));

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(hub.get(&id).is_none(), "evicted after the retention time");
    assert!(hub.get(open.id()).is_some(), "an open stream is never evicted");
    assert_eq!(hub.len(), 1);
}
