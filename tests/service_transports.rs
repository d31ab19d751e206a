//! The transports over real sockets (127.0.0.1): one agent run watched at once through its own OpenAI SSE
//! response, a CUI SSE subscriber, a per-stream WebSocket, a multiplexed WebSocket and a late joiner; resume
//! with `Last-Event-ID` and `from`; slow subscribers (SSE, per-stream and multiplexed WebSocket) that read every
//! message at a tenth of the producer's pace, never cut off, while the producer and a fast subscriber go on;
//! cancel over HTTP, over WebSocket and on disconnect; and bad input with its status and envelope.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentmux::agent::{Agent, AgentError, Agents, Output};
use agentmux::conversation::Conversation;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use agentmux::output::Outcome;
use common::http::{
    PATIENCE, Sse, assert_envelope, assert_sse_headers, get_json, header, parse_sse, post_json, read_body, snapshot,
};
use common::server::TestServer;
use common::wait::eventually;
use eventsource_stream::Eventsource;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

// ---------------------------------------------------------------------------------------------------------
// An agent whose pace and length the request sets, and which counts how its runs end.

/// Emits `count` messages with `pause_ms` between them (the last user message is `"<count> <pause_ms>"`):
/// the first third as one text streamed in deltas, the second third as texts inside a block, the last third
/// as `tick` events. Counts the runs that saw a cancel and the runs that completed.
#[derive(Clone, Default)]
struct Ticker {
    cancels: Arc<AtomicUsize>,
    completions: Arc<AtomicUsize>,
}

impl Ticker {
    async fn emit(output: &Output, count: u64, pause: Duration) -> Result<(), AgentError> {
        let third = count / 3;
        let mut text = Some(output.stream_text());
        let step = output.begin_block();
        for i in 0..count {
            if i < third {
                if let Some(text) = text.as_mut() {
                    text.append(format!("word{i} "))?;
                }
            } else if i < 2 * third {
                if let Some(text) = text.take() {
                    text.end()?;
                }
                step.text(format!("step {i}. "))?;
            } else {
                if i == 2 * third {
                    step.end_block()?;
                }
                output.event("tick", json!({ "i": i }))?;
            }
            // The agent's pace, as the request set it: the scenario, not synchronisation.
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = output.cancelled() => return Err(AgentError::new("cancelled").with_code("cancelled")),
            }
        }
        Ok(())
    }
}

impl Agent for Ticker {
    async fn run(&self, request: Conversation, output: Output) -> Result<Outcome, AgentError> {
        let spec = request.last_user_text().unwrap_or_default();
        let mut numbers = spec.split_whitespace().map(|n| n.parse::<u64>().unwrap_or(0));
        let count = numbers.next().unwrap_or(48);
        let pause = Duration::from_millis(numbers.next().unwrap_or(15));
        let result = Ticker::emit(&output, count, pause).await;
        if output.is_cancelled() {
            self.cancels.fetch_add(1, Ordering::SeqCst);
            return Ok(Outcome::cancelled());
        }
        result?;
        self.completions.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::completed())
    }
}

async fn server_with_ticker(config: HubConfig, settings: Settings) -> (TestServer, Ticker) {
    let ticker = Ticker::default();
    let mut agents = Agents::builtin();
    agents.register("ticker", ticker.clone());
    (TestServer::with(config, settings, agents).await, ticker)
}

fn ticker_request(count: u64, pause_ms: u64) -> Value {
    json!({
        "model": "ticker",
        "stream": true,
        "messages": [{ "role": "user", "content": format!("{count} {pause_ms}") }],
    })
}

// ---------------------------------------------------------------------------------------------------------
// SSE, HTTP and WebSocket helpers.

/// Checks that `events` are one whole CUI stream: ids 1..=last without gaps, each matching the message's
/// `metadata.sequence`, from `stream_start` to a `stream_end` with `status`; returns the last sequence.
fn assert_whole_cui(events: &[Sse], status: &str) -> u64 {
    assert!(!events.is_empty(), "no events");
    for (index, event) in events.iter().enumerate() {
        let expected = index as u64 + 1;
        assert_eq!(event.id, Some(expected), "ids go 1, 2, 3 ... without gaps: {}", event.data);
        assert_eq!(event.json()["metadata"]["sequence"], json!(expected), "{}", event.data);
    }
    assert_eq!(lifecycle(&events[0]).as_deref(), Some("stream_start"));
    let last = events.last().expect("one event");
    assert_eq!(lifecycle(last).as_deref(), Some("stream_end"), "{}", last.data);
    assert_eq!(last.json()["props"]["data"]["status"], json!(status), "{}", last.data);
    events.len() as u64
}

/// The name of a lifecycle event (`stream_start`, `stream_end`, ...), if the event is one.
fn lifecycle(event: &Sse) -> Option<String> {
    let message = event.json();
    (message["type"] == "event").then(|| message["props"]["event"].as_str().unwrap_or_default().to_owned())
}

/// Starts a streaming chat run of the ticker agent; returns its response and its stream id.
async fn start_ticker(
    client: &reqwest::Client,
    server: &TestServer,
    count: u64,
    pause_ms: u64,
) -> (reqwest::Response, String) {
    let response = client
        .post(server.url("/v1/chat/completions"))
        .json(&ticker_request(count, pause_ms))
        .send()
        .await
        .expect("chat request");
    let id = header(&response, "x-agentmux-stream-id").to_owned();
    (response, id)
}

async fn post_raw(client: &reqwest::Client, url: &str, content_type: &str, body: impl Into<String>) -> (u16, Value) {
    let response = client.post(url).header("content-type", content_type).body(body.into()).send().await.expect("POST");
    let status = response.status().as_u16();
    assert_eq!(header(&response, "content-type"), "application/json");
    (status, response.json().await.expect("JSON body"))
}

/// Polls the stream until its status is not `open`; returns the snapshot.
async fn until_ended(client: &reqwest::Client, server: &TestServer, id: &str) -> Value {
    eventually(&format!("stream {id} to end"), PATIENCE, async || {
        let body = snapshot(client, server, id).await;
        (body["status"] != "open").then_some(body)
    })
    .await
}

async fn until_count(counter: &AtomicUsize, at_least: usize, what: &str) {
    eventually(&format!("{what}: {at_least}"), PATIENCE, async || counter.load(Ordering::SeqCst) >= at_least).await;
}

/// Waits until the run on `stream` is under way: its agent has emitted something after the `stream_start`.
async fn until_under_way(stream: &agentmux::hub::Stream) {
    eventually("the run to be under way", PATIENCE, async || stream.last_sequence() > 1).await;
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn ws_connect(server: &TestServer, path: &str) -> Ws {
    let url = format!("ws://{}{path}", server.addr);
    connect_async(url.as_str()).await.unwrap_or_else(|e| panic!("connect {url}: {e}")).0
}

/// The next text or close frame (pings skipped); `None` when the connection ended.
async fn ws_next(ws: &mut Ws) -> Option<WsMessage> {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.expect("a WebSocket frame in time") {
            None => return None,
            Some(Err(error)) => panic!("WebSocket read failed: {error}"),
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => {}
            Some(Ok(message)) => return Some(message),
        }
    }
}

async fn ws_json(ws: &mut Ws) -> Value {
    match ws_next(ws).await {
        Some(WsMessage::Text(text)) => serde_json::from_str(text.as_str()).expect("a JSON text frame"),
        other => panic!("expected a JSON text frame, got {other:?}"),
    }
}

async fn ws_send(ws: &mut Ws, value: &Value) {
    ws.send(WsMessage::text(value.to_string())).await.expect("WebSocket send");
}

/// Checks WebSocket CUI frames against the CUI SSE events of the same stream: `{"stream","seq","message"}`
/// with the same message, seq for seq.
#[track_caller]
fn assert_ws_frames_match(frames: &[Value], stream: &str, events: &[Sse]) {
    assert_eq!(frames.len(), events.len(), "one frame per event");
    for (frame, event) in frames.iter().zip(events) {
        let mut keys: Vec<&str> = frame.as_object().expect("object").keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["message", "seq", "stream"], "{frame}");
        assert_eq!(frame["stream"], json!(stream));
        assert_eq!(frame["seq"], json!(event.id.expect("CUI events have ids")));
        assert_eq!(frame["message"], event.json());
    }
}

// ---------------------------------------------------------------------------------------------------------
// 1. One run, five watchers.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_watched_by_every_transport_at_once() {
    let (server, ticker) = server_with_ticker(HubConfig::default(), Settings::default()).await;
    let client = reqwest::Client::new();
    let (response, id) = start_ticker(&client, &server, 48, 15).await;
    assert_sse_headers(&response);
    assert!(id.len() >= 22 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{id}");
    // Every watcher reports its first event here, so the test knows they all joined while the run was live.
    let (joined, mut joined_rx) = tokio::sync::mpsc::channel::<&'static str>(8);

    // The run's own OpenAI response, read as an SSE client reads it.
    let openai = tokio::spawn({
        let joined = joined.clone();
        async move {
            let mut raw = Vec::new();
            let mut data = Vec::new();
            {
                let mut events = response
                    .bytes_stream()
                    .map(|chunk| {
                        if let Ok(bytes) = &chunk {
                            raw.extend_from_slice(bytes);
                        }
                        chunk
                    })
                    .eventsource();
                while let Some(event) = tokio::time::timeout(PATIENCE, events.next()).await.expect("chunk in time") {
                    let event = event.expect("a valid SSE event");
                    assert!(event.event == "message" && event.id.is_empty() && event.retry.is_none(), "{event:?}");
                    if data.is_empty() {
                        let _ = joined.send("openai").await;
                    }
                    data.push(event.data.clone());
                    if event.data == "[DONE]" {
                        break;
                    }
                }
                let after = tokio::time::timeout(PATIENCE, events.next()).await.expect("the body ends after [DONE]");
                assert!(after.is_none(), "nothing after [DONE]: {after:?}");
            }
            (raw, data)
        }
    });

    // A CUI subscriber over SSE.
    let cui = tokio::spawn({
        let (client, url, joined) = (client.clone(), server.url(&format!("/v1/streams/{id}/events")), joined.clone());
        async move {
            let response = client.get(url).send().await.expect("subscribe");
            assert_sse_headers(&response);
            let mut body = response.bytes_stream();
            let mut all = Vec::new();
            while let Some(chunk) = tokio::time::timeout(PATIENCE, body.next()).await.expect("events in time") {
                if all.is_empty() {
                    let _ = joined.send("cui").await;
                }
                all.extend_from_slice(&chunk.expect("bytes"));
            }
            all
        }
    });

    // A WebSocket on the stream itself.
    let mut one = ws_connect(&server, &format!("/v1/streams/{id}/ws")).await;
    let per_stream = tokio::spawn({
        let joined = joined.clone();
        async move {
            let mut frames = Vec::new();
            let close = loop {
                match ws_next(&mut one).await {
                    Some(WsMessage::Text(text)) => {
                        if frames.is_empty() {
                            let _ = joined.send("ws").await;
                        }
                        frames.push(serde_json::from_str::<Value>(text.as_str()).expect("JSON frame"));
                    }
                    Some(WsMessage::Close(frame)) => break frame,
                    other => panic!("unexpected frame {other:?}"),
                }
            };
            (frames, close)
        }
    });

    // A multiplexed WebSocket that subscribes with an op.
    let mut many = ws_connect(&server, "/v1/ws").await;
    ws_send(&mut many, &json!({ "op": "subscribe", "stream": id })).await;
    let multiplex = tokio::spawn({
        let (joined, id) = (joined.clone(), id.clone());
        async move {
            assert_eq!(ws_json(&mut many).await, json!({ "stream": id, "subscribed": true }));
            let mut frames = Vec::new();
            loop {
                let frame = ws_json(&mut many).await;
                if frames.is_empty() {
                    let _ = joined.send("multiplex").await;
                }
                let done = frame.get("done").is_some();
                frames.push(frame);
                if done {
                    break;
                }
            }
            // The connection stays open for more subscriptions after a stream ends.
            ws_send(&mut many, &json!({ "op": "unsubscribe", "stream": "nope" })).await;
            assert_eq!(ws_json(&mut many).await["error"]["code"], "not_subscribed");
            many.close(None).await.expect("close");
            frames
        }
    });
    drop(joined);

    let mut watchers = Vec::new();
    for _ in 0..4 {
        let name = tokio::time::timeout(PATIENCE, joined_rx.recv()).await.expect("watchers join in time");
        watchers.push(name.expect("every watcher gets a first event"));
    }
    watchers.sort_unstable();
    assert_eq!(watchers, ["cui", "multiplex", "openai", "ws"]);
    assert_eq!(snapshot(&client, &server, &id).await["status"], "open", "all four watch while the run is live");
    let (raw_openai, openai_data) = openai.await.expect("openai watcher");
    let cui_bytes = cui.await.expect("cui watcher");
    let (ws_frames, close) = per_stream.await.expect("ws watcher");
    let multiplex_frames = multiplex.await.expect("multiplex watcher");

    // CUI over SSE: ids 1..=last without gaps, stream_start to stream_end.
    let (events, used) = parse_sse(&cui_bytes);
    assert_eq!(used, cui_bytes.len(), "the body ends on an event boundary");
    let last = assert_whole_cui(&events, "completed");
    assert!(last > 48, "48 messages and their lifecycle events: {last}");
    let state = snapshot(&client, &server, &id).await;
    assert_eq!(state["status"], "completed");
    assert_eq!(state["last_sequence"], json!(last));
    assert_eq!(ticker.completions.load(Ordering::SeqCst), 1);

    // OpenAI: chunks of one completion, [DONE], then the end of the body.
    assert_eq!(openai_data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = openai_data[..openai_data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk is JSON ({e}): {d}")))
        .collect();
    assert!(chunks.len() > 2, "{chunks:?}");
    let mut content = String::new();
    for (index, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        assert_eq!(chunk["id"], chunks[0]["id"], "one id per completion");
        assert_eq!(chunk["created"], chunks[0]["created"]);
        assert_eq!(chunk["model"], "ticker");
        let delta = &chunk["choices"][0]["delta"];
        assert_eq!(delta.get("role").is_some(), index == 0, "role in the first chunk only: {chunk}");
        content.push_str(delta["content"].as_str().unwrap_or_default());
    }
    assert_eq!(chunks.last().expect("chunks")["choices"][0]["finish_reason"], "stop");
    let words: String = (0..16).map(|i| format!("word{i} ")).collect();
    assert!(content.starts_with(&words), "{content:?}");
    assert!((16..32).all(|i| content.contains(&format!("step {i}. "))), "{content:?}");

    // The per-stream WebSocket: every message, then done, then a normal close.
    let (done, frames) = ws_frames.split_last().expect("frames");
    assert_ws_frames_match(frames, &id, &events);
    assert_eq!(done, &json!({ "stream": id, "done": true, "status": "completed" }));
    let close = close.expect("a close frame");
    assert_eq!(u16::from(close.code), 1000, "{close:?}");

    // The multiplexed WebSocket: the same.
    let (done, frames) = multiplex_frames.split_last().expect("frames");
    assert_ws_frames_match(frames, &id, &events);
    assert_eq!(done, &json!({ "stream": id, "done": true, "status": "completed" }));

    // A late joiner gets the same bytes as the live subscriber, in either format.
    let late = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("late joiner");
    assert_sse_headers(&late);
    assert_eq!(String::from_utf8(read_body(late).await).expect("utf-8"), String::from_utf8(cui_bytes).expect("utf-8"));
    let late = client.get(server.url(&format!("/v1/streams/{id}/events?format=openai"))).send().await.expect("late");
    assert_sse_headers(&late);
    assert_eq!(read_body(late).await, raw_openai, "the late OpenAI joiner reads the run's own response");
    assert!(raw_openai.ends_with(b"data: [DONE]\n\n"));
}

// ---------------------------------------------------------------------------------------------------------
// 2. Resume.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_resumes_without_gap_or_duplicate() {
    let (server, _ticker) = server_with_ticker(HubConfig::default(), Settings::default()).await;
    let client = reqwest::Client::new();
    let (run, id) = start_ticker(&client, &server, 60, 10).await;
    let drain = tokio::spawn(read_body(run));
    let events_url = server.url(&format!("/v1/streams/{id}/events"));

    // Read a few events, then go away mid-stream.
    let first = reqwest::Client::new();
    let response = first.get(&events_url).send().await.expect("subscribe");
    assert_sse_headers(&response);
    let mut body = response.bytes_stream();
    let mut bytes = Vec::new();
    let (seen, used) = loop {
        let chunk = tokio::time::timeout(PATIENCE, body.next()).await.expect("events in time");
        bytes.extend_from_slice(&chunk.expect("not the end yet").expect("bytes"));
        let (events, used) = parse_sse(&bytes);
        if events.last().and_then(|e| e.id).is_some_and(|id| id >= 8) {
            break (events, used);
        }
    };
    drop(body);
    drop(first);
    let last_seen = seen.last().and_then(|e| e.id).expect("an id");
    // Away a moment, as an EventSource is between attempts: the scenario, not synchronisation.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(snapshot(&client, &server, &id).await["status"], "open", "the reconnect happens mid-stream");

    // Reconnect as EventSource does.
    let response = client.get(&events_url).header("last-event-id", last_seen.to_string()).send().await.expect("resume");
    assert_sse_headers(&response);
    // An EventSource reader's stream opens with the reconnection hint, each connection's.
    let rest = read_body(response).await;
    let rest = rest.strip_prefix(b"retry: 2000\n\n".as_slice()).expect("the retry hint first").to_vec();
    let (resumed, _) = parse_sse(&rest);
    assert_eq!(resumed.first().and_then(|e| e.id), Some(last_seen + 1), "no gap and no duplicate");
    let mut joined: Vec<Sse> = seen.clone();
    joined.extend(resumed.iter().cloned());
    let last = assert_whole_cui(&joined, "completed");
    let mut joined_bytes = bytes[..used].to_vec();
    joined_bytes.extend_from_slice(&rest);
    drain.await.expect("the run's own response");

    // After the end, within retention: the whole stream from the start, then from=N.
    let full = read_body(client.get(&events_url).send().await.expect("late joiner")).await;
    assert_eq!(joined_bytes, full, "the two connections together are the whole stream, byte for byte");
    let (all, _) = parse_sse(&full);
    let from = 5;
    let response = client.get(format!("{events_url}?from={from}")).send().await.expect("from");
    assert_sse_headers(&response);
    let tail = read_body(response).await;
    let expected: Vec<u8> =
        b"retry: 2000\n\n".iter().copied().chain(all[from as usize..].iter().flat_map(|e| e.raw.clone())).collect();
    assert_eq!(tail, expected, "from={from} gives the hint, then the events after {from}");

    // Resuming at the end of an ended stream: 204, so EventSource stops reconnecting.
    let response = client.get(format!("{events_url}?from={last}")).send().await.expect("from last");
    assert_eq!(response.status(), 204);
    let response = client.get(&events_url).header("last-event-id", last.to_string()).send().await.expect("at end");
    assert_eq!(response.status(), 204);

    // Bad resume points.
    let response = client.get(&events_url).header("last-event-id", "abc").send().await.expect("abc");
    assert_eq!(response.status(), 400);
    assert_envelope(&response.json().await.expect("json"), Some("Last-Event-ID"), "invalid_value");
}

// ---------------------------------------------------------------------------------------------------------
// 3. Slow subscribers.

/// The producer of the slow-subscriber test: `SLOW_BATCHES` POSTs of `SLOW_BATCH` texts of about
/// `SLOW_FILLER` bytes (3,000 messages, about 4 MB), with a pause of `SLOW_PAUSE` after each.
const SLOW_BATCHES: usize = 150;
const SLOW_BATCH: usize = 20;
const SLOW_FILLER: usize = 4000;
const SLOW_PAUSE: Duration = Duration::from_millis(5);

/// What one producer run measured.
struct Production {
    /// Each POST's latency, sorted.
    latencies: Vec<Duration>,
    /// From the first POST to the end of the last one.
    total: Duration,
    /// The messages' bytes as sent.
    bytes: usize,
}

impl Production {
    fn median(&self) -> Duration {
        self.latencies[self.latencies.len() / 2]
    }

    fn slowest(&self) -> Duration {
        *self.latencies.last().expect("at least one POST")
    }

    /// Bytes per second.
    fn rate(&self) -> f64 {
        self.bytes as f64 / self.total.as_secs_f64()
    }

    fn describe(&self) -> String {
        format!(
            "{} bytes in {} POSTs over {:?} ({:.1} MB/s); POST latency median {:?}, slowest {:?}",
            self.bytes,
            self.latencies.len(),
            self.total,
            self.rate() / 1e6,
            self.median(),
            self.slowest()
        )
    }
}

/// Appends the slow-subscriber test's messages to stream `id`; every POST must be accepted.
async fn produce(client: &reqwest::Client, server: &TestServer, id: &str) -> Production {
    let filler = "x".repeat(SLOW_FILLER);
    let url = server.url(&format!("/v1/streams/{id}/messages"));
    let mut latencies = Vec::with_capacity(SLOW_BATCHES);
    let mut bytes = 0;
    let started = Instant::now();
    for batch in 0..SLOW_BATCHES {
        let body: Vec<Value> = (0..SLOW_BATCH)
            .map(|i| json!({ "type": "text", "props": { "content": format!("{batch}/{i} {filler}") } }))
            .collect();
        bytes += body.iter().map(|m| m.to_string().len()).sum::<usize>();
        let posted = Instant::now();
        let (status, reply) = post_json(client, &url, &json!(body)).await;
        latencies.push(posted.elapsed());
        assert_eq!(status, 200, "batch {batch}: the producer is never refused: {reply}");
        sequences(&reply, SLOW_BATCH);
        // Pacing the producer over a few seconds, not synchronisation.
        tokio::time::sleep(SLOW_PAUSE).await;
    }
    let total = started.elapsed();
    latencies.sort_unstable();
    Production { latencies, total, bytes }
}

/// Holds a reader to `rate` bytes per second since `start`, or lets it read at full speed.
struct Pace {
    start: Instant,
    rate: Option<f64>,
    taken: usize,
}

impl Pace {
    fn new(start: Instant, rate: Option<f64>) -> Self {
        Pace { start, rate, taken: 0 }
    }

    /// Counts `bytes` as read and, for a slow reader, sleeps until reading them was due.
    async fn took(&mut self, bytes: usize) {
        self.taken += bytes;
        if let Some(rate) = self.rate {
            let due = self.start + Duration::from_secs_f64(self.taken as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
    }
}

/// Reads an SSE body to its end at `pace`, a chunk at a time; the events and when the reader finished.
async fn read_sse_paced(response: reqwest::Response, mut pace: Pace) -> (Vec<Sse>, Duration) {
    let mut body = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    while let Some(chunk) = tokio::time::timeout(PATIENCE, body.next()).await.expect("SSE bytes in time") {
        let chunk = chunk.expect("SSE bytes");
        buffer.extend_from_slice(&chunk);
        let (complete, used) = parse_sse(&buffer);
        buffer.drain(..used);
        events.extend(complete);
        pace.took(chunk.len()).await;
    }
    assert!(buffer.is_empty(), "the body ends on an event boundary");
    (events, pace.start.elapsed())
}

/// Reads one subscription's WebSocket frames at `pace` up to its `done` (or an error, which ends it too);
/// the frames, `done` or the error last, and when the reader finished.
async fn read_ws_paced(ws: &mut Ws, mut pace: Pace) -> (Vec<Value>, Duration) {
    let mut frames = Vec::new();
    loop {
        let text = match ws_next(ws).await {
            Some(WsMessage::Text(text)) => text,
            other => panic!("expected a JSON text frame after {} frames, got {other:?}", frames.len()),
        };
        let frame: Value = serde_json::from_str(text.as_str()).expect("a JSON text frame");
        let last = frame.get("done").is_some() || frame.get("error").is_some();
        frames.push(frame);
        pace.took(text.len()).await;
        if last {
            return (frames, pace.start.elapsed());
        }
    }
}

/// Checks a slow WebSocket subscriber's frames: every message of the stream (as the CUI SSE `events`), no
/// `lagged`, then `done`.
#[track_caller]
fn assert_ws_got_everything(frames: &[Value], id: &str, events: &[Sse], what: &str) {
    if let Some(error) = frames.iter().find(|f| f.get("error").is_some()) {
        panic!("{what} was cut off after {} frames: {error}", frames.len() - 1);
    }
    let (done, frames) = frames.split_last().expect("frames");
    assert_ws_frames_match(frames, id, events);
    assert_eq!(done, &json!({ "stream": id, "done": true, "status": "completed" }), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_subscribers_read_everything_while_the_producer_and_a_fast_subscriber_go_on() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();

    // The producer alone first, for comparison; its pace sets the slow readers' (a tenth of it).
    let (status, created) = post_raw(&client, &server.url("/v1/streams"), "application/json", "").await;
    assert_eq!(status, 201, "{created}");
    let alone = produce(&client, &server, created["id"].as_str().expect("id")).await;
    let slow_rate = alone.rate() / 10.0;

    let (status, created) = post_raw(&client, &server.url("/v1/streams"), "application/json", "").await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let events_url = server.url(&format!("/v1/streams/{id}/events"));

    // Four subscribers from the start, each on its own connection: a fast SSE one, and a slow SSE, a slow
    // per-stream WebSocket and a slow multiplexed WebSocket one.
    let fast_sse = reqwest::Client::new().get(&events_url).send().await.expect("fast SSE subscriber");
    assert_sse_headers(&fast_sse);
    let slow_sse = reqwest::Client::new().get(&events_url).send().await.expect("slow SSE subscriber");
    assert_sse_headers(&slow_sse);
    let mut slow_ws = ws_connect(&server, &format!("/v1/streams/{id}/ws")).await;
    let mut slow_many = ws_connect(&server, "/v1/ws").await;
    ws_send(&mut slow_many, &json!({ "op": "subscribe", "stream": id })).await;
    assert_eq!(ws_json(&mut slow_many).await, json!({ "stream": id, "subscribed": true }));

    let start = Instant::now();
    let fast = tokio::spawn(read_sse_paced(fast_sse, Pace::new(start, None)));
    let slow = tokio::spawn(read_sse_paced(slow_sse, Pace::new(start, Some(slow_rate))));
    let per_stream = tokio::spawn(async move {
        let (frames, finished) = read_ws_paced(&mut slow_ws, Pace::new(start, Some(slow_rate))).await;
        let close = match ws_next(&mut slow_ws).await {
            Some(WsMessage::Close(frame)) => frame,
            other => panic!("expected a close frame after done, got {other:?}"),
        };
        (frames, close, finished)
    });
    let multiplexed = tokio::spawn(async move {
        let (frames, finished) = read_ws_paced(&mut slow_many, Pace::new(start, Some(slow_rate))).await;
        slow_many.close(None).await.expect("close");
        (frames, finished)
    });

    let production = produce(&client, &server, &id).await;
    let (status, ended) =
        post_raw(&client, &server.url(&format!("/v1/streams/{id}/end")), "application/json", "").await;
    assert_eq!(status, 200, "{ended}");
    let last = ended["last_sequence"].as_u64().expect("last_sequence");
    assert_eq!(last, (SLOW_BATCHES * SLOW_BATCH) as u64 + 2, "stream_start, the messages, stream_end");

    // The fast subscriber: every message.
    let (fast, fast_finished) = fast.await.expect("fast subscriber");
    assert_eq!(assert_whole_cui(&fast, "completed"), last);

    // The slow SSE subscriber: every message too, byte for byte, never `lagged`.
    let (slow, slow_finished) = slow.await.expect("slow SSE subscriber");
    if let Some(cut) = slow.iter().find(|e| e.id.is_none()) {
        panic!("the slow SSE subscriber was cut off after {} events: {}", slow.len() - 1, cut.data);
    }
    assert_eq!(assert_whole_cui(&slow, "completed"), last);
    assert!(slow.iter().zip(&fast).all(|(s, f)| s.raw == f.raw), "the slow SSE subscriber reads the same bytes");

    // The slow WebSockets: every message, then done; the per-stream one then closes normally.
    let (frames, close, ws_finished) = per_stream.await.expect("slow per-stream WebSocket");
    assert_ws_got_everything(&frames, &id, &fast, "the slow per-stream WebSocket");
    let close = close.expect("a close frame");
    assert_eq!((u16::from(close.code), close.reason.as_str()), (1000, "stream ended"), "{close:?}");
    let (frames, many_finished) = multiplexed.await.expect("slow multiplexed WebSocket");
    assert_ws_got_everything(&frames, &id, &fast, "the slow multiplexed WebSocket");

    eprintln!("producer alone: {}", alone.describe());
    eprintln!("producer with 4 subscribers: {}", production.describe());
    eprintln!("fast SSE subscriber finished {fast_finished:?} after the producer started");
    eprintln!(
        "slow subscribers, paced at {:.0} kB/s: SSE finished after {slow_finished:?}, per-stream WebSocket after \
         {ws_finished:?}, multiplexed WebSocket after {many_finished:?}",
        slow_rate / 1e3
    );
}

// ---------------------------------------------------------------------------------------------------------
// 4. Cancel.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_over_http_and_websocket_reaches_the_agent() {
    let (server, ticker) = server_with_ticker(HubConfig::default(), Settings::default()).await;
    let client = reqwest::Client::new();

    // POST /v1/streams/{id}/cancel.
    let (run, id) = start_ticker(&client, &server, 500, 10).await;
    let body = tokio::spawn(read_body(run));
    let watcher = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("watch");
    until_under_way(&server.hub.get(&id).expect("the run's stream")).await;
    let (status, reply) =
        post_raw(&client, &server.url(&format!("/v1/streams/{id}/cancel")), "application/json", "").await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply, json!({ "id": id, "status": "cancelled" }));
    assert_eq!(snapshot(&client, &server, &id).await["status"], "cancelled");
    until_count(&ticker.cancels, 1, "the agent sees the HTTP cancel").await;
    let body = String::from_utf8(body.await.expect("the run's response")).expect("utf-8");
    assert!(body.ends_with("data: [DONE]\n\n"), "the run's OpenAI response ends: {body}");
    let (events, _) = parse_sse(&read_body(watcher).await);
    assert_whole_cui(&events, "cancelled");
    let (status, reply) =
        post_raw(&client, &server.url(&format!("/v1/streams/{id}/cancel")), "application/json", "").await;
    assert_eq!(status, 409, "cancelling an ended stream");
    assert_envelope(&reply, None, "stream_ended");

    // {"op":"cancel"} over a WebSocket.
    let (run, id) = start_ticker(&client, &server, 500, 10).await;
    let body = tokio::spawn(read_body(run));
    let mut ws = ws_connect(&server, "/v1/ws").await;
    ws_send(&mut ws, &json!({ "op": "cancel", "stream": id })).await;
    assert_eq!(ws_json(&mut ws).await, json!({ "stream": id, "cancelled": true }));
    assert_eq!(snapshot(&client, &server, &id).await["status"], "cancelled");
    until_count(&ticker.cancels, 2, "the agent sees the WebSocket cancel").await;
    assert!(String::from_utf8(body.await.expect("response")).expect("utf-8").ends_with("data: [DONE]\n\n"));
    ws_send(&mut ws, &json!({ "op": "cancel", "stream": id })).await;
    assert_eq!(ws_json(&mut ws).await["error"]["code"], "stream_ended");
    ws_send(&mut ws, &json!({ "op": "cancel", "stream": "no-such-stream" })).await;
    assert_eq!(ws_json(&mut ws).await["error"]["code"], "stream_not_found");
    assert_eq!(ticker.completions.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_cancels_only_when_asked() {
    let (server, ticker) = server_with_ticker(HubConfig::default(), Settings::default()).await;
    let client = reqwest::Client::new();
    let (mut cancels, mut completions) = (0, 0);

    for (streaming, cancel) in [(true, false), (true, true), (false, false), (false, true)] {
        // Its own client, so dropping the response closes its connection.
        let leaving = reqwest::Client::new();
        let mut body = ticker_request(30, 10);
        body["stream"] = json!(streaming);
        let mut request = leaving.post(server.url("/v1/chat/completions")).json(&body);
        if cancel {
            request = request.header("x-agentmux-on-disconnect", "cancel");
        }
        let id = if streaming {
            let response = request.send().await.expect("chat request");
            assert_sse_headers(&response);
            let id = header(&response, "x-agentmux-stream-id").to_owned();
            let mut body = response.bytes_stream();
            let first = tokio::time::timeout(PATIENCE, body.next()).await.expect("first chunk").expect("a chunk");
            assert!(first.expect("bytes").starts_with(b"data: {"));
            id
        } else {
            // The answer comes at the end of the run; find the run's stream in the hub and leave before.
            let pending = tokio::spawn(request.send());
            let stream = eventually("the run to start", PATIENCE, async || server.hub.open_streams().pop()).await;
            until_under_way(&stream).await;
            pending.abort();
            let _ = pending.await;
            stream.id().to_owned()
        };
        drop(leaving);
        let state = until_ended(&client, &server, &id).await;
        if cancel {
            cancels += 1;
            assert_eq!(
                state["status"], "cancelled",
                "stream {streaming}: x-agentmux-on-disconnect: cancel stops the run"
            );
            until_count(&ticker.cancels, cancels, "the agent sees the disconnect").await;
        } else {
            completions += 1;
            assert_eq!(state["status"], "completed", "stream {streaming}: a plain disconnect does not stop the run");
            // 30 messages, and the lifecycle events around them.
            assert!(state["last_sequence"].as_u64().expect("last_sequence") > 30, "{state}");
        }
        assert_eq!(ticker.completions.load(Ordering::SeqCst), completions);
        assert_eq!(ticker.cancels.load(Ordering::SeqCst), cancels);
    }
}

// ---------------------------------------------------------------------------------------------------------
// 5. Bad input, and the stream endpoints' happy path.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chat_requests_get_their_status_and_envelope() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/chat/completions");
    let user = json!([{ "role": "user", "content": "hi" }]);
    let cases: Vec<(&str, String, u16, Option<&str>, &str)> = vec![
        ("malformed JSON", r#"{"model": "echo", "messages": [{"role""#.into(), 400, None, "invalid_json"),
        ("not JSON at all", "hello".into(), 400, None, "invalid_json"),
        (
            "stream is not a boolean",
            json!({ "model": "echo", "messages": user, "stream": "yes" }).to_string(),
            400,
            Some("stream"),
            "invalid_value",
        ),
        (
            "an unknown role",
            json!({ "model": "echo", "messages": [{ "role": "robot", "content": "hi" }] }).to_string(),
            400,
            Some("messages[0].role"),
            "invalid_value",
        ),
        (
            "content that is a number",
            json!({ "model": "echo", "messages": [{ "role": "user", "content": 5 }] }).to_string(),
            400,
            Some("messages[0].content"),
            "invalid_value",
        ),
        (
            "messages that is not an array",
            json!({ "model": "echo", "messages": "hi" }).to_string(),
            400,
            Some("messages"),
            "invalid_value",
        ),
        ("missing messages", json!({ "model": "echo" }).to_string(), 400, Some("messages"), "invalid_value"),
        (
            "empty messages",
            json!({ "model": "echo", "messages": [] }).to_string(),
            400,
            Some("messages"),
            "invalid_value",
        ),
        (
            "a tool message without tool_call_id",
            json!({ "model": "echo", "messages": [{ "role": "user", "content": "hi" }, { "role": "tool", "content": "42" }] })
                .to_string(),
            400,
            Some("messages[1].tool_call_id"),
            "invalid_value",
        ),
        (
            "an unknown model",
            json!({ "model": "gpt-nope", "messages": user, "stream": true }).to_string(),
            404,
            Some("model"),
            "model_not_found",
        ),
    ];
    for (what, body, status, param, code) in cases {
        let response =
            client.post(&url).header("content-type", "application/json").body(body.clone()).send().await.expect("POST");
        assert_eq!(response.status().as_u16(), status, "{what}: {body}");
        assert_eq!(header(&response, "content-type"), "application/json", "{what}: never SSE");
        let reply: Value = response.json().await.expect("JSON");
        assert_envelope(&reply, param, code);
    }
    // Nothing was started by any of them.
    assert!(server.hub.is_empty(), "no stream for a refused request");

    // A body over the limit.
    let small =
        TestServer::with(HubConfig::default(), Settings { body_limit: 1024, ..Settings::default() }, Agents::builtin())
            .await;
    let big = json!({ "model": "echo", "messages": [{ "role": "user", "content": "x".repeat(4096) }] }).to_string();
    let (status, reply) = post_raw(&client, &small.url("/v1/chat/completions"), "application/json", big.clone()).await;
    assert_eq!(status, 413);
    assert_envelope(&reply, None, "body_too_large");
    let (status, created) = post_raw(&client, &small.url("/v1/streams"), "application/json", "").await;
    assert_eq!(status, 201);
    let id = created["id"].as_str().expect("id");
    let message = json!({ "type": "text", "props": { "content": "x".repeat(4096) } }).to_string();
    let (status, reply) =
        post_raw(&client, &small.url(&format!("/v1/streams/{id}/messages")), "application/json", message).await;
    assert_eq!(status, 413);
    assert_envelope(&reply, None, "body_too_large");
    // Under the limit, the same server answers.
    let ok = json!({ "model": "echo", "messages": [{ "role": "user", "content": "fits" }] });
    let (status, reply) = post_json(&client, &small.url("/v1/chat/completions"), &ok).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"][0]["message"]["content"], "fits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_endpoints_append_end_and_refuse() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();

    // Unknown streams: 404 on every endpoint.
    for (method, path) in [
        ("GET", "/v1/streams/nope"),
        ("GET", "/v1/streams/nope/events"),
        ("POST", "/v1/streams/nope/messages"),
        ("POST", "/v1/streams/nope/end"),
        ("POST", "/v1/streams/nope/cancel"),
    ] {
        let request = if method == "GET" { client.get(server.url(path)) } else { client.post(server.url(path)) };
        let response = request.header("content-type", "application/json").body("{}").send().await.expect("send");
        assert_eq!(response.status(), 404, "{method} {path}");
        assert_envelope(&response.json().await.expect("JSON"), None, "stream_not_found");
    }
    match connect_async(format!("ws://{}/v1/streams/nope/ws", server.addr).as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => assert_eq!(response.status(), 404),
        other => panic!("a WebSocket to an unknown stream is refused with 404: {:?}", other.map(|_| ())),
    }

    // Create.
    let (status, created) = post_raw(&client, &server.url("/v1/streams"), "application/json", "").await;
    assert_eq!(status, 201, "{created}");
    let mut keys: Vec<&str> = created.as_object().expect("object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["epoch", "id", "read_token", "write_token"]);
    let id = created["id"].as_str().expect("id").to_owned();
    assert!(created["read_token"].as_str().is_some_and(|t| t.starts_with("amr.")), "{created}");
    assert!(created["write_token"].as_str().is_some_and(|t| t.starts_with("amw.")), "{created}");
    assert!(id.len() >= 22 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{id}");
    let messages_url = server.url(&format!("/v1/streams/{id}/messages"));

    // Append: one object, an array, NDJSON.
    let (status, reply) =
        post_json(&client, &messages_url, &json!({ "type": "text", "props": { "content": "plain" } })).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply, json!({ "sequences": [2], "last_sequence": 2 }), "after stream_start");
    let array = json!([
        { "type": "text", "props": { "content": "Hel" }, "message_id": "reply-1", "delta": true },
        { "type": "text", "props": { "content": "lo" }, "message_id": "reply-1", "delta": true, "delta_action": "append" },
    ]);
    let (status, reply) = post_json(&client, &messages_url, &array).await;
    assert_eq!(status, 200, "{reply}");
    let array_sequences = sequences(&reply, 2);
    assert!(array_sequences[0] > 2 && array_sequences[1] > array_sequences[0], "{reply}");
    let ndjson = concat!(
        r#"{"type":"text","props":{"content":", world"},"message_id":"reply-1","delta":true}"#,
        "\n\n",
        r#"{"type":"text","props":{"content":"Hello, world!"},"message_id":"reply-1","delta":true,"delta_action":"replace"}"#,
        "\n",
    );
    let (status, reply) = post_raw(&client, &messages_url, "application/x-ndjson", ndjson).await;
    assert_eq!(status, 200, "{reply}");
    let ndjson_sequences = sequences(&reply, 2);
    assert_eq!(ndjson_sequences, [array_sequences[1] + 1, array_sequences[1] + 2], "{reply}");
    let state = snapshot(&client, &server, &id).await;
    assert_eq!(state["status"], "open");
    assert_eq!(state["last_sequence"], json!(ndjson_sequences[1]));
    let before = ndjson_sequences[1];

    // Subscribing past the last sequence of an open stream is refused.
    let (status, reply) = get_json(&client, &server.url(&format!("/v1/streams/{id}/events?from={}", before + 5))).await;
    assert_eq!(status, 400, "{reply}");
    assert_envelope(&reply, Some("from"), "sequence_ahead");

    // Refused batches append nothing, and name the message.
    let bad_ndjson = concat!(
        r#"{"type":"text","props":{"content":"a"}}"#,
        "\n\n",
        r#"{"type":"text","props":{"content":"b"}}"#,
        "\n",
        r#"{"type":"image","props":{"url":"ftp://example.com/x.png"}}"#,
        "\n",
        r#"{"type":"text","props":{"content":"d"}}"#,
        "\n",
    );
    let (status, reply) = post_raw(&client, &messages_url, "application/x-ndjson", bad_ndjson).await;
    assert_eq!(status, 400, "{reply}");
    assert_envelope(&reply, Some("messages[2].props.url"), "invalid_message");
    assert!(reply["error"]["message"].as_str().expect("message").contains("line 4"), "names the line: {reply}");
    // A line that is not JSON: its column, within that line (not the parser's "line 1").
    let (status, reply) = post_raw(
        &client,
        &messages_url,
        "application/x-ndjson",
        "{\"type\":\"text\",\"props\":{\"content\":\"a\"}}\n{bad}\n",
    )
    .await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("line 2: ") && message.contains("at column 2") && !message.contains("line 1"),
        "{reply}"
    );
    let bad_array = json!([
        { "type": "text", "props": { "content": "a" } },
        { "type": "image", "props": { "url": "/relative.png" } },
    ]);
    let (status, reply) = post_json(&client, &messages_url, &bad_array).await;
    assert_eq!(status, 400, "{reply}");
    assert_envelope(&reply, Some("messages[1].props.url"), "invalid_message");
    let (status, reply) = post_raw(&client, &messages_url, "application/json", r#"[{"type":"text""#).await;
    assert_eq!(status, 400, "{reply}");
    assert_envelope(&reply, None, "invalid_json");
    let (status, reply) = post_raw(&client, &messages_url, "application/x-ndjson", "{\"type\":\n").await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["param"], "messages[0]", "{reply}");
    assert_eq!(snapshot(&client, &server, &id).await["last_sequence"], json!(before), "nothing of a refused batch");

    // End; the snapshot has every message with its deltas applied.
    let (status, reply) =
        post_raw(&client, &server.url(&format!("/v1/streams/{id}/end")), "application/json", "").await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["status"], "completed");
    let state = snapshot(&client, &server, &id).await;
    assert_eq!(state["status"], "completed");
    assert_eq!(state["epoch"], created["epoch"]);
    assert_eq!(state["last_sequence"], reply["last_sequence"]);
    let messages = state["messages"].as_array().expect("messages");
    let m1: Vec<&Value> = messages.iter().filter(|m| m["message_id"] == "reply-1").collect();
    assert_eq!(m1.len(), 1, "one state per message: {state}");
    assert_eq!(m1[0]["props"]["content"], "Hello, world!", "deltas applied: {state}");
    assert!(m1[0].get("delta").is_none() && m1[0].get("delta_action").is_none(), "{state}");
    assert!(messages.iter().any(|m| m["props"]["content"] == "plain"), "{state}");
    let events: Vec<&str> = messages.iter().filter_map(|m| m["props"]["event"].as_str()).collect();
    assert!(events.contains(&"stream_start") && events.contains(&"stream_end"), "{events:?}");

    // Ended: appending, ending and cancelling again are 409.
    let (status, reply) =
        post_json(&client, &messages_url, &json!({ "type": "text", "props": { "content": "late" } })).await;
    assert_eq!(status, 409, "{reply}");
    assert_envelope(&reply, None, "stream_ended");
    for action in ["end", "cancel"] {
        let url = server.url(&format!("/v1/streams/{id}/{action}"));
        let (status, reply) = post_raw(&client, &url, "application/json", "").await;
        assert_eq!(status, 409, "{action}: {reply}");
        assert_envelope(&reply, None, "stream_ended");
    }
}

fn sequences(reply: &Value, count: usize) -> Vec<u64> {
    let sequences: Vec<u64> = reply["sequences"]
        .as_array()
        .unwrap_or_else(|| panic!("sequences: {reply}"))
        .iter()
        .map(|s| s.as_u64().expect("a sequence"))
        .collect();
    assert_eq!(sequences.len(), count, "{reply}");
    sequences
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_survives_frames_it_cannot_use() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let (_, created) = post_raw(&client, &server.url("/v1/streams"), "application/json", "").await;
    let id = created["id"].as_str().expect("id").to_owned();
    let mut ws = ws_connect(&server, "/v1/ws").await;

    ws_send(&mut ws, &json!("valid JSON, but not an op")).await;
    let reply = ws_json(&mut ws).await;
    assert_eq!(reply["error"]["code"], "invalid_op", "{reply}");
    ws.send(WsMessage::text("this is not json {")).await.expect("send");
    let reply = ws_json(&mut ws).await;
    assert_eq!(reply["error"]["code"], "invalid_json", "{reply}");
    assert!(reply["error"]["message"].is_string(), "{reply}");
    ws_send(&mut ws, &json!({ "op": "dance", "stream": id })).await;
    assert_eq!(ws_json(&mut ws).await["error"]["code"], "invalid_op");
    ws_send(&mut ws, &json!({ "op": "subscribe", "stream": "no-such-stream" })).await;
    assert_eq!(ws_json(&mut ws).await["error"]["code"], "stream_not_found");
    ws_send(&mut ws, &json!({ "op": "publish", "stream": id, "message": { "type": "image", "props": {} } })).await;
    let reply = ws_json(&mut ws).await;
    assert_eq!(reply["error"]["code"], "invalid_message", "{reply}");
    assert_eq!(reply["error"]["param"], "message.props.url", "{reply}");

    // Still usable: publish, subscribe, see it, end, see done.
    ws_send(
        &mut ws,
        &json!({ "op": "publish", "stream": id, "message": { "type": "text", "props": { "content": "via ws" } } }),
    )
    .await;
    assert_eq!(ws_json(&mut ws).await, json!({ "stream": id, "published": 2, "last_sequence": 2 }));
    ws_send(&mut ws, &json!({ "op": "subscribe", "stream": id })).await;
    assert_eq!(ws_json(&mut ws).await, json!({ "stream": id, "subscribed": true }));
    let start = ws_json(&mut ws).await;
    assert_eq!((start["seq"].as_u64(), start["message"]["props"]["event"].as_str()), (Some(1), Some("stream_start")));
    let text = ws_json(&mut ws).await;
    assert_eq!((text["seq"].as_u64(), text["message"]["props"]["content"].as_str()), (Some(2), Some("via ws")));
    let (status, _) = post_raw(&client, &server.url(&format!("/v1/streams/{id}/end")), "application/json", "").await;
    assert_eq!(status, 200);
    let end = ws_json(&mut ws).await;
    assert_eq!(end["message"]["props"]["event"], "stream_end", "{end}");
    assert_eq!(ws_json(&mut ws).await, json!({ "stream": id, "done": true, "status": "completed" }));
    ws.close(None).await.expect("close");
}

// ---------------------------------------------------------------------------------------------------------
// Bugs found while writing these tests, now fixed; each test states the contract.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_of_the_wrong_type_names_the_field() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    for role in [json!(5), json!(null), json!(true)] {
        let body = json!({ "model": "echo", "messages": [{ "role": role, "content": "hi" }] });
        let (status, reply) = post_json(&client, &server.url("/v1/chat/completions"), &body).await;
        assert_eq!(status, 400, "{reply}");
        assert_envelope(&reply, Some("messages[0].role"), "invalid_value");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_message_ids_do_not_collide_with_a_producers() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();

    // The built-in fixture `text-deltas` streams message "m1"; the stream has already named its
    // stream_start "m1", so the replay ends with an error instead of the text.
    let request = json!({ "model": "replay/text-deltas", "messages": [{ "role": "user", "content": "x" }] });
    let (status, reply) = post_json(&client, &server.url("/v1/chat/completions"), &request).await;
    assert_eq!(status, 200, "replay/text-deltas completes: {reply}");
    assert_eq!(reply["choices"][0]["message"]["content"], "The quick brown fox jumps over the lazy dog.");

    // An outside producer's new message "m2" is silently merged into the message the stream named "m2".
    let (_, created) = post_raw(&client, &server.url("/v1/streams"), "application/json", "").await;
    let id = created["id"].as_str().expect("id").to_owned();
    let messages_url = server.url(&format!("/v1/streams/{id}/messages"));
    let (status, _) =
        post_json(&client, &messages_url, &json!({ "type": "text", "props": { "content": "plain" } })).await;
    assert_eq!(status, 200);
    let mine = json!({ "type": "text", "props": { "content": "mine" }, "message_id": "m2", "delta": true });
    let (status, reply) = post_json(&client, &messages_url, &mine).await;
    assert_eq!(status, 200, "{reply}");
    let state = snapshot(&client, &server, &id).await;
    let texts: Vec<&str> = state["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["type"] == "text")
        .filter_map(|m| m["props"]["content"].as_str())
        .collect();
    assert_eq!(texts, ["plain", "mine"], "two messages, each as its producer sent it: {state}");
}

#[tokio::test]
async fn keep_alive_pings_come_only_in_silences() {
    let keep_alive = Duration::from_millis(400);
    let settings = Settings { keep_alive, ..Default::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let (_, created) = post_raw(&client, &server.url("/v1/streams"), "application/json", "").await;
    let id = created["id"].as_str().expect("id").to_owned();
    let response = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("subscribe");
    let mut body = response.bytes_stream();
    let mut seen = Vec::new();
    let mut read_for = async |span: Duration, seen: &mut Vec<u8>| {
        let until = tokio::time::Instant::now() + span;
        while let Ok(Some(chunk)) = tokio::time::timeout_at(until, body.next()).await {
            seen.extend_from_slice(&chunk.expect("body bytes"));
        }
    };
    let pings = |seen: &[u8]| String::from_utf8_lossy(seen).matches(": ping\n\n").count();

    // Messages ten times as often as the keep-alive: never a ping, however long it goes on.
    let messages_url = server.url(&format!("/v1/streams/{id}/messages"));
    for n in 0..30 {
        let (status, _) =
            post_json(&client, &messages_url, &json!({ "type": "text", "props": { "content": format!("{n}") } })).await;
        assert_eq!(status, 200);
        read_for(Duration::from_millis(40), &mut seen).await;
    }
    assert_eq!(pings(&seen), 0, "no ping while events flow: {}", String::from_utf8_lossy(&seen));

    // Then silence for three and a half periods: pings, one per period.
    seen.clear();
    read_for(keep_alive * 7 / 2, &mut seen).await;
    let count = pings(&seen);
    assert!((1..=4).contains(&count), "{count} pings in 3.5 keep-alive periods of silence");
    assert_eq!(seen.len(), count * ": ping\n\n".len(), "nothing but pings in the silence");
}
