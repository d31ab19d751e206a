//! The `stall` scenario: the first OpenAI-format subscriber to a long stream, and what it costs the producer.
//!
//! A stream is filled with text deltas of one message id in batches, then a producer appends one delta per
//! POST at a steady pace and times every POST. Some time in, one SSE subscriber joins with
//! `?format=openai`: the first of its format, so the server renders the whole log for it. The run reports
//! the producer's POST latency while that subscriber catches up and in a window before it joined, and how
//! long the catch-up took: from sending the request until the subscriber read the chunk of the message that
//! was the last acknowledged when it joined. OpenAI chunks carry no sequence, so every delta's text starts
//! with its number (`#n` and 7 digits) and the reader looks for the highest one.
//!
//! This module owns the producer, the subscriber's reader and the figures; the table's notes in `main.rs`
//! print them.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use memchr::memmem::{self, Finder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{self, Conn, now_ns, source_ip};
use crate::procfs::Server;
use crate::scenarios::{FILLER, RunResult, Settings, Window, append, create_stream, on_own_thread};

/// The text deltas' one message id.
const MESSAGE_ID: &str = "stall";
/// POSTs in the first this many nanoseconds of the producer are left out of the window before the join.
const WARM_UP_NS: u64 = 200_000_000;

/// A text delta whose content starts with its number.
fn push_delta(out: &mut Vec<u8>, number: u64) {
    use std::io::Write;
    let _ = writeln!(
        out,
        r##"{{"type":"text","props":{{"content":"#n{number:07} {FILLER}"}},"message_id":"{MESSAGE_ID}","delta":true}}"##
    );
}

/// The steady producer's POSTs: when each was sent and answered.
#[derive(Debug, Default)]
struct Producer {
    posts: Vec<(u64, u64)>,
    error: Option<String>,
}

/// Appends deltas numbered from `first` on, one per POST at `rate` per second for `seconds`, storing the
/// number of the last one answered in `acknowledged`; then ends the stream.
async fn produce(
    server: SocketAddr,
    id: String,
    first: u64,
    rate: f64,
    seconds: f64,
    acknowledged: Arc<AtomicU64>,
) -> Producer {
    let mut out = Producer::default();
    let mut conn = match Conn::open(server, source_ip(0)).await {
        Ok(conn) => conn,
        Err(e) => {
            out.error = Some(format!("producer connect: {e}"));
            return out;
        }
    };
    let path = format!("/v1/streams/{id}/messages");
    let total = (rate * seconds).round() as u64;
    let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut body = Vec::new();
    for number in first..first + total {
        every.tick().await;
        body.clear();
        push_delta(&mut body, number);
        let sent = now_ns();
        if let Err(error) = append(&mut conn, &path, "application/json", &body).await {
            out.error = Some(error);
            break;
        }
        out.posts.push((sent, now_ns()));
        acknowledged.store(number, Ordering::Release);
    }
    match conn.request("POST", &format!("/v1/streams/{id}/end"), None, b"").await {
        Ok((200, _)) => {}
        Ok((status, _)) => out.error = out.error.take().or(Some(format!("end: status {status}"))),
        Err(e) => out.error = out.error.take().or(Some(format!("end: {e}"))),
    }
    out
}

/// What the joining subscriber saw.
#[derive(Debug, Default)]
struct Reader {
    /// The response head came (the server had subscribed it).
    head_ns: Option<u64>,
    /// It read the chunk of the target delta.
    caught_up_ns: Option<u64>,
    /// Chunks read until then, and in all.
    chunks_at_catch_up: u64,
    chunks: u64,
    /// The body ended with its last chunk.
    complete: bool,
    error: Option<String>,
}

static EVENT_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n\n"));
static NUMBER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"#n"));

/// The highest delta number in `events`.
fn highest_number(events: &[u8]) -> Option<u64> {
    NUMBER
        .find_iter(events)
        .filter_map(|at| {
            let digits = events.get(at + 2..at + 9)?;
            digits.iter().try_fold(0u64, |n, &d| d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0')))
        })
        .max()
}

impl Reader {
    /// Counts the whole events at the front of `pending` and drops them; notes when `target` is reached.
    fn consume(&mut self, pending: &mut Vec<u8>, target: u64) {
        let Some(last) = memmem::rfind(pending, b"\n\n") else { return };
        let events = &pending[..last + 2];
        self.chunks += EVENT_END.find_iter(events).count() as u64;
        if self.caught_up_ns.is_none() && highest_number(events).is_some_and(|n| n >= target) {
            self.caught_up_ns = Some(now_ns());
            self.chunks_at_catch_up = self.chunks;
        }
        pending.drain(..last + 2);
    }

    /// Subscribes in the OpenAI format and reads until the body ends or `deadline`.
    async fn run(server: SocketAddr, path: &str, target: u64, deadline: Instant) -> Reader {
        let mut reader = Reader::default();
        let read = tokio::time::timeout_at(deadline.into(), reader.read(server, path, target)).await;
        match read {
            Ok(Ok(())) => {}
            Ok(Err(e)) => reader.error = Some(format!("subscriber: {e}")),
            Err(_) => reader.error = Some("subscriber timed out".into()),
        }
        reader
    }

    async fn read(&mut self, server: SocketAddr, path: &str, target: u64) -> io::Result<()> {
        let mut stream = client::connect(server, source_ip(1)).await?;
        stream.write_all(&client::request_head("GET", path, None, 0, true)).await?;
        let mut pending = Vec::with_capacity(1 << 20);
        let (status, _, start) = client::read_head(&mut stream, &mut pending).await?;
        self.head_ns = Some(now_ns());
        if status != 200 {
            return Err(io::Error::other(format!("GET {path}: status {status}")));
        }
        pending.drain(..start);
        self.consume(&mut pending, target);
        let mut buffer = vec![0u8; 256 << 10];
        loop {
            let n = stream.read(&mut buffer).await?;
            if n == 0 {
                self.complete = pending.ends_with(b"\r\n0\r\n\r\n");
                return Ok(());
            }
            pending.extend_from_slice(&buffer[..n]);
            self.consume(&mut pending, target);
        }
    }
}

/// p50, p99 and the most of POST latencies, in milliseconds, and how many there were.
fn latencies(posts: &[(u64, u64)]) -> Option<(f64, f64, f64, usize)> {
    let mut ns: Vec<u64> = posts.iter().map(|&(sent, answered)| answered.saturating_sub(sent)).collect();
    ns.sort_unstable();
    let at = |q: f64| ns.get(((q * ns.len() as f64).ceil() as usize).clamp(1, ns.len()) - 1).copied();
    let ms = |v: Option<u64>| v.unwrap_or(0) as f64 / 1e6;
    let most = ns.last().copied()?;
    Some((ms(at(0.5)), ms(at(0.99)), most as f64 / 1e6, ns.len()))
}

/// One run: fill with `messages` deltas, then a steady producer, and a subscriber `join_after` seconds in.
pub(crate) async fn stall(
    server: &Server,
    settings: &Settings,
    messages: usize,
    rate: f64,
    seconds: f64,
    join_after: f64,
    result: &mut RunResult,
) -> io::Result<()> {
    const BATCH: usize = 1000;
    let mut control = Conn::open(server.addr, source_ip(0)).await?;
    let id = create_stream(&mut control).await?;
    let path = format!("/v1/streams/{id}/messages");
    let mut body = Vec::new();
    let mut filled = 0;
    while filled < messages {
        let n = BATCH.min(messages - filled);
        body.clear();
        (filled..filled + n).for_each(|i| push_delta(&mut body, i as u64 + 1));
        append(&mut control, &path, "application/x-ndjson", &body).await.map_err(io::Error::other)?;
        filled += n;
    }

    let acknowledged = Arc::new(AtomicU64::new(messages as u64));
    let (addr, stream_id, first) = (server.addr, id.clone(), messages as u64 + 1);
    let shared = Arc::clone(&acknowledged);
    let producer = on_own_thread(move || produce(addr, stream_id, first, rate, seconds, shared));
    tokio::time::sleep(Duration::from_secs_f64(join_after)).await;

    let window = Window::start(server);
    let target = acknowledged.load(Ordering::Acquire);
    let joined_ns = now_ns();
    let events = format!("/v1/streams/{id}/events?format=openai");
    let reader = Reader::run(server.addr, &events, target, Instant::now() + settings.drain).await;
    let producer = producer.await.unwrap_or_default();
    window.end(server, result);

    result.messages = messages as u64 + producer.posts.len() as u64;
    result.deliveries = reader.chunks;
    if let Some(error) = producer.error {
        result.errors += 1;
        result.note(error);
    }
    if let Some(error) = reader.error {
        result.errors += 1;
        result.note(error);
    } else if !reader.complete {
        result.errors += 1;
        result.note("subscriber: body ended early".into());
    }
    // The stream's `stream_start` and `message_start` come before the deltas.
    result.extra.insert("log_at_join".into(), target as f64 + 2.0);
    let Some(caught_up_ns) = reader.caught_up_ns else {
        result.note(format!("the subscriber never read delta #{target}"));
        return Ok(());
    };
    let catch_up_s = caught_up_ns.saturating_sub(joined_ns) as f64 / 1e9;
    result.seconds = catch_up_s;
    result.deliveries_per_s = reader.chunks_at_catch_up as f64 / catch_up_s.max(1e-9);
    result.extra.insert("catch_up_ms".into(), catch_up_s * 1e3);
    result.extra.insert("catch_up_chunks".into(), reader.chunks_at_catch_up as f64);
    if let Some(head_ns) = reader.head_ns {
        result.extra.insert("catch_up_head_ms".into(), head_ns.saturating_sub(joined_ns) as f64 / 1e6);
    }
    // While it caught up: every POST in flight at some time between the join and the catch-up.
    let during: Vec<(u64, u64)> = producer
        .posts
        .iter()
        .copied()
        .filter(|&(sent, answered)| answered >= joined_ns && sent <= caught_up_ns)
        .collect();
    let first_ns = producer.posts.first().map_or(0, |&(sent, _)| sent);
    let before: Vec<(u64, u64)> = producer
        .posts
        .iter()
        .copied()
        .filter(|&(sent, answered)| sent >= first_ns + WARM_UP_NS && answered < joined_ns)
        .collect();
    let stalled = latencies(&during);
    for (prefix, figures) in [("stall", stalled), ("before", latencies(&before))] {
        if let Some((p50, p99, most, count)) = figures {
            result.extra.insert(format!("{prefix}_post_p50_ms"), p50);
            result.extra.insert(format!("{prefix}_post_p99_ms"), p99);
            result.extra.insert(format!("{prefix}_post_max_ms"), most);
            result.extra.insert(format!("{prefix}_posts"), count as f64);
        }
    }
    if let Some((p50, p99, _, count)) = stalled {
        result.p50_ms = Some(p50);
        result.p99_ms = Some(p99);
        result.latency_samples = count as u64;
    }
    Ok(())
}
