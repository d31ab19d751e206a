//! The scenarios: each starts its own server process, drives it over loopback and measures one run.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::client::{self, Conn, Ctx, Sse, now_ns, source_ip};
use crate::hist::Histogram;
use crate::procfs::{self, Server, Target};
use crate::relay::Relay;
use crate::soak::Soak;
use crate::ws_idle::WsIdle;

/// How the scenarios run.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) agentmux: PathBuf,
    /// Messages per POST in the fan-out scenarios.
    pub(crate) batch: usize,
    /// Text deltas per message id before the producer starts a new message.
    pub(crate) deltas_per_message: usize,
    /// In fan-out scenarios, parse the latency stamp of one event in this many.
    pub(crate) sample_every: u64,
    /// How long readers may take after the producer is done.
    pub(crate) drain: Duration,
    /// Run agentmux with its store (a fresh `--data-dir` per run) rather than in memory.
    pub(crate) store: bool,
    /// The fan-out producer waits for each POST's messages to be kept (committed, with the store).
    pub(crate) durable_acks: bool,
    /// nginx with nchan, when it is here and wanted: the third target of the scenarios that name it.
    pub(crate) nchan: Option<crate::nchan::Install>,
}

#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// One stream, SSE subscribers in each format (`?format=` value, `""` for CUI) as many as given,
    /// `messages` text deltas as fast as the server takes them.
    Fanout { formats: Vec<(&'static str, usize)>, messages: usize },
    /// One stream, `subscribers` CUI subscribers, one message per POST at `rate` per second.
    Latency { subscribers: usize, rate: f64, seconds: f64 },
    /// Token streaming: one stream, `subscribers` CUI subscribers, `messages` text deltas as fast as the
    /// server takes them, one at a time: a POST each, or emitted in-process through agentmux's `Output`
    /// handle (`output_server.rs`).
    Tokens { subscribers: usize, messages: usize, source: TokenSource },
    /// `streams` streams with one subscriber each, a message per stream per second.
    ManyStreams { streams: usize, seconds: f64 },
    /// `connections` SSE subscribers to one silent stream.
    Idle { connections: usize, hold: f64 },
    /// `concurrency` clients each making `requests` streaming chat requests to `echo`, `words` words each.
    Chat { concurrency: usize, requests: usize, words: usize },
    /// One stream of `messages` deltas, a producer appending one per POST at `rate` per second for
    /// `seconds`, and the first OpenAI subscriber joining `join_after` seconds in (`stall.rs`).
    Stall { messages: usize, rate: f64, seconds: f64, join_after: f64 },
    /// Subscribers that never read, SSE and WebSocket, to one large stream (`ws_idle.rs`).
    WsIdle(WsIdle),
    /// About 10,000 connections of every kind for minutes while streams come and go (`soak/`).
    Soak(Soak),
    /// agentmux and LiteLLM in front of a fast upstream, and the upstream alone (`relay/`; run by
    /// `relay::run`, not [`run`]).
    Relay(Relay),
    /// `nodes` agentmux nodes through one `redis-server` (`cluster.rs`): one stream written on the first,
    /// `subscribers` CUI subscribers spread over the nodes (over the others alone when `remote`), and a
    /// producer on the first: a steady `rate` for `seconds` when `rate` is given, else `messages` in
    /// batches.
    Cluster { nodes: usize, remote: bool, subscribers: usize, messages: usize, rate: Option<f64>, seconds: f64 },
}

/// Where a token-streaming scenario's deltas come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenSource {
    /// A POST per delta, each sent once the last was answered.
    Post,
    /// agentmux's `Output` handle inside the server, a delta per call (agentmux only).
    Output,
}

/// How a scenario's subscribers read their stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// `GET /v1/streams/{id}/events`, read as SSE (`client.rs`).
    Sse,
    /// `GET /v1/streams/{id}/ws`, read as WebSocket frames (`ws_client.rs`); CUI only.
    WebSocket,
}

impl Transport {
    /// The subscription path of stream `id` (`query`: `?format=...` or empty, SSE only).
    fn path(self, id: &str, query: &str) -> String {
        match self {
            Transport::Sse => format!("/v1/streams/{id}/events{query}"),
            Transport::WebSocket => format!("/v1/streams/{id}/ws{query}"),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) name: String,
    pub(crate) kind: Kind,
    /// How its subscribers read (the fan-out, token, latency and idle kinds; the others read SSE).
    pub(crate) transport: Transport,
    /// Also run against the ceiling server.
    pub(crate) ceiling: bool,
    /// Also run against nchan (when it is installed).
    pub(crate) nchan: bool,
}

impl Scenario {
    /// File descriptors the client needs (the server as many).
    pub(crate) fn connections(&self) -> usize {
        match self.kind {
            Kind::Fanout { ref formats, .. } => formats.iter().map(|(_, count)| count).sum(),
            Kind::Latency { subscribers, .. } => subscribers,
            Kind::Tokens { subscribers, .. } => subscribers,
            Kind::ManyStreams { streams, .. } => streams,
            Kind::Idle { connections, .. } => connections,
            Kind::Chat { concurrency, .. } => concurrency,
            Kind::Stall { .. } => 2,
            Kind::WsIdle(WsIdle { connections, .. }) => 2 * connections,
            Kind::Soak(ref soak) => soak.connections(),
            // The client's connection to each target and the proxies' to the upstream.
            Kind::Relay(ref relay) => 2 * relay.concurrency + 8,
            Kind::Cluster { subscribers, .. } => subscribers,
        }
    }
}

/// What one run of one scenario against one server measured.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RunResult {
    pub(crate) scenario: String,
    pub(crate) target: String,
    pub(crate) run: usize,
    pub(crate) connections: usize,
    /// Messages published (chat: requests made).
    pub(crate) messages: u64,
    /// SSE events received, pings and each subscriber's initial `stream_start` excluded; lifecycle events
    /// sent while publishing included (chat: every chunk, `[DONE]` included).
    pub(crate) deliveries: u64,
    /// The measured window: first publish to last event received.
    pub(crate) seconds: f64,
    pub(crate) deliveries_per_s: f64,
    /// Publish-to-receive latency (chat: time to first chunk), in milliseconds.
    pub(crate) latency_samples: u64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) p999_ms: Option<f64>,
    /// Server CPU (user + system) during the window.
    pub(crate) server_cpu_s: f64,
    /// Server `VmHWM` over its life.
    pub(crate) server_peak_rss_mib: f64,
    /// The load generator's CPU during the window.
    pub(crate) client_cpu_s: f64,
    /// Failed subscriptions, requests or reads, and bodies that ended early without a `lagged` notice.
    pub(crate) errors: u64,
    /// Subscribers cut off with a `lagged` notice.
    pub(crate) lagged: u64,
    pub(crate) extra: BTreeMap<String, f64>,
    pub(crate) notes: Vec<String>,
}

impl RunResult {
    fn new(scenario: &Scenario, target: Target, run: usize) -> Self {
        RunResult {
            scenario: scenario.name.clone(),
            target: target.name().into(),
            run,
            connections: scenario.connections(),
            ..RunResult::default()
        }
    }

    pub(crate) fn note(&mut self, note: String) {
        if self.notes.len() < 4 && !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    fn latency(&mut self, histogram: &Histogram) {
        let ms = |q| histogram.quantile(q).map(|ns| ns as f64 / 1e6);
        self.latency_samples = histogram.count();
        self.p50_ms = ms(0.5);
        self.p99_ms = ms(0.99);
        self.p999_ms = ms(0.999);
    }

    /// Adds up the readers: deliveries (less each one's initial `stream_start`), lagged, errors.
    /// Fills the figures of a run with a producer: messages, deliveries and their rate from the first
    /// publish to the last event received, latency, the publish rate, and the producer's error.
    fn published(&mut self, readers: &[Sse], published: Published, latency: &Histogram, time_bound: bool) {
        self.messages = published.messages;
        self.readers(readers, 1, time_bound);
        if let Some(error) = published.error {
            self.errors += 1;
            self.note(error);
        }
        let last = readers.iter().map(|r| r.last_event_ns).max().unwrap_or(0);
        self.seconds = last.saturating_sub(published.first_ns) as f64 / 1e9;
        self.deliveries_per_s = self.deliveries as f64 / self.seconds.max(1e-9);
        self.latency(latency);
        let publishing = published.last_ns.saturating_sub(published.first_ns) as f64 / 1e9;
        self.extra.insert("publish_msgs_per_s".into(), published.messages as f64 / publishing.max(1e-9));
    }

    /// The least time one message can take to reach all `subscribers` on this machine: the kernel CPU a
    /// delivery cost (the server's write, which on loopback also runs the receiver's TCP, plus the reader's
    /// read), times the subscribers, spread perfectly over every core. No user-space code can beat it.
    fn burst_floor(&mut self, subscribers: usize) {
        let per_delivery = |key: &str| self.extra.get(key).copied().unwrap_or(0.0) / self.deliveries.max(1) as f64;
        let (server, client) = (per_delivery("server_system_cpu_s"), per_delivery("client_system_cpu_s"));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        self.extra.insert("server_kernel_us_per_delivery".into(), server * 1e6);
        self.extra.insert("client_kernel_us_per_delivery".into(), client * 1e6);
        self.extra.insert("burst_floor_ms".into(), (server + client) * subscribers as f64 / cores * 1e3);
    }

    /// The server's CPU per message published and per delivery, in µs: what one token costs.
    fn per_message_cpu(&mut self) {
        let us = self.server_cpu_s * 1e6;
        self.extra.insert("server_us_per_message".into(), us / self.messages.max(1) as f64);
        self.extra.insert("server_us_per_delivery".into(), us / self.deliveries.max(1) as f64);
    }

    fn readers(&mut self, readers: &[Sse], initial_events: u64, time_bound: bool) {
        for sse in readers {
            self.deliveries += sse.events.saturating_sub(initial_events);
            if sse.lagged {
                self.lagged += 1;
            } else if let Some(error) = &sse.error {
                self.errors += 1;
                self.note(error.clone());
            } else if !(sse.complete || (time_bound && sse.cancelled)) {
                self.errors += 1;
                self.note(if sse.cancelled { "timed out".into() } else { "body ended early".into() });
            }
        }
    }
}

/// Runs `make()` on a thread of its own with a current-thread runtime, so the producer is not queued behind
/// thousands of reader tasks.
pub(crate) fn on_own_thread<T, F>(make: impl FnOnce() -> F + Send + 'static) -> oneshot::Receiver<T>
where
    T: Send + 'static,
    F: Future<Output = T>,
{
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        if let Ok(runtime) = runtime {
            let _ = tx.send(runtime.block_on(make()));
        }
    });
    rx
}

pub(crate) const FILLER: &str = "lorem ipsum dolor sit amet, consectetur adip";

/// A ~60-byte text delta (or whole message) whose content starts with the stamp.
fn push_message(out: &mut Vec<u8>, message_id: Option<usize>, stamp: u64) {
    use std::io::Write;
    let _ = match message_id {
        Some(id) => writeln!(
            out,
            r#"{{"type":"text","props":{{"content":"@@{stamp:013} {FILLER}"}},"message_id":"b{id}","delta":true}}"#
        ),
        None => writeln!(out, r#"{{"type":"text","props":{{"content":"@@{stamp:013} {FILLER}"}}}}"#),
    };
}

#[derive(Debug, Default)]
struct Published {
    messages: u64,
    posts: u64,
    first_ns: u64,
    last_ns: u64,
    error: Option<String>,
}

/// A message as nchan's producer publishes it: what [`push_message`] writes with the `metadata` agentmux
/// and the ceiling stamp on each message (its `sequence`, counting `stream_start` as 1, and the time in
/// milliseconds), and no newline, so that nchan, which sends each body as it came, sends the same `data:`
/// line. (nchan turns each line of a body into a `data:` line: a trailing newline would add an empty one.)
fn push_stamped_message(out: &mut Vec<u8>, message_id: usize, stamp: u64, sequence: usize) {
    let start = out.len();
    push_message(out, Some(message_id), stamp);
    // Drop the newline and the closing brace.
    out.truncate(out.len().saturating_sub(2).max(start));
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    out.extend_from_slice(format!(r#","metadata":{{"sequence":{sequence},"timestamp":{now_ms}}}}}"#).as_bytes());
}

/// One POST of messages; the error as text when it is not a 2xx (nchan answers 201 or 202).
pub(crate) async fn append(conn: &mut Conn, path: &str, content_type: &str, body: &[u8]) -> Result<(), String> {
    match conn.request("POST", path, Some(content_type), body).await {
        Ok((200..=299, _)) => Ok(()),
        Ok((status, reply)) => Err(format!("append: {status} {}", String::from_utf8_lossy(&reply))),
        Err(e) => Err(format!("append: {e}")),
    }
}

enum Pace {
    /// Batches of this many, each POST as soon as the last was answered.
    Burst { messages: usize, batch: usize },
    /// One message per POST at this rate, each stamped with the moment it was due (open loop: a POST
    /// answered late delays the ones after it, and their latency counts the delay).
    Steady { rate: f64, seconds: f64 },
}

pub(crate) async fn create_stream(conn: &mut Conn) -> io::Result<String> {
    let (status, body) = conn.request("POST", "/v1/streams", None, b"").await?;
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(io::Error::other)?;
    match (status, value["id"].as_str()) {
        (201, Some(id)) => Ok(id.to_owned()),
        _ => Err(io::Error::other(format!("POST /v1/streams: {status} {}", String::from_utf8_lossy(&body)))),
    }
}

/// nchan's form of a batch: one POST per message (the messages `first..first + count`, the `metadata`
/// added), all written at once, pipelined on the producer's connection; the error as text unless each is
/// answered 2xx.
async fn append_pipelined(
    conn: &mut Conn,
    path: &str,
    first: usize,
    count: usize,
    deltas_per_message: usize,
    requests: &mut Vec<u8>,
) -> Result<(), String> {
    requests.clear();
    let mut body = Vec::new();
    let stamp = now_ns();
    for i in first..first + count {
        body.clear();
        // `stream_start` is sequence 1.
        push_stamped_message(&mut body, i / deltas_per_message, stamp, i + 2);
        requests.extend_from_slice(&client::request_head("POST", path, Some("application/json"), body.len(), false));
        requests.extend_from_slice(&body);
    }
    match conn.pipelined(requests, count).await {
        Ok(statuses) => match statuses.iter().find(|s| !(200..=299).contains(*s)) {
            None => Ok(()),
            Some(status) => Err(format!("append: {status}")),
        },
        Err(e) => Err(format!("append: {e}")),
    }
}

/// Publishes text deltas to one stream, then ends it: to agentmux and the ceiling a batch of NDJSON per
/// POST and `POST .../end`; to nchan a message per POST (a batch's pipelined) and `DELETE` of the channel,
/// whose `:410` notice its subscribers count as the ceiling's `stream_end`.
async fn publish(
    server: SocketAddr,
    target: Target,
    id: String,
    pace: Pace,
    deltas_per_message: usize,
    durable: bool,
) -> Published {
    let mut out = Published::default();
    let mut conn = match Conn::open(server, source_ip(0)).await {
        Ok(conn) => conn,
        Err(e) => {
            out.error = Some(format!("producer connect: {e}"));
            return out;
        }
    };
    let path = format!("/v1/streams/{id}/messages{}", if durable { "" } else { "?durable=false" });
    let mut body = Vec::new();
    out.first_ns = now_ns();
    let dpm = deltas_per_message.max(1);
    match pace {
        Pace::Burst { messages, batch } => {
            let mut sent = 0;
            while sent < messages {
                let n = batch.min(messages - sent);
                let appended = if target == Target::Nchan {
                    append_pipelined(&mut conn, &path, sent, n, dpm, &mut body).await
                } else {
                    body.clear();
                    let stamp = now_ns();
                    (sent..sent + n).for_each(|i| push_message(&mut body, Some(i / dpm), stamp));
                    append(&mut conn, &path, "application/x-ndjson", &body).await
                };
                if let Err(error) = appended {
                    out.error = Some(error);
                    break;
                }
                sent += n;
                out.posts += 1;
            }
            out.messages = sent as u64;
        }
        Pace::Steady { rate, seconds } => {
            // Open loop: message i is due `i / rate` after the start and stamped with that moment, not with
            // the moment it went out. A server that answers a POST more slowly than the rate is so charged
            // for the backlog it builds, instead of being offered less load than the others.
            let total = (rate * seconds).round() as usize;
            let start = tokio::time::Instant::now();
            for i in 0..total {
                let due = Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(start + due).await;
                let stamp = out.first_ns + due.as_nanos() as u64;
                body.clear();
                if target == Target::Nchan {
                    push_stamped_message(&mut body, i / dpm, stamp, i + 2);
                } else {
                    push_message(&mut body, Some(i / dpm), stamp);
                }
                if let Err(error) = append(&mut conn, &path, "application/json", &body).await {
                    out.error = Some(error);
                    break;
                }
                out.posts += 1;
            }
            out.messages = out.posts;
        }
    }
    out.last_ns = now_ns();
    let end = match target {
        Target::Nchan => conn.request("DELETE", &path, None, b"").await,
        Target::Agentmux | Target::Ceiling | Target::CeilingNaive => {
            conn.request("POST", &format!("/v1/streams/{id}/end"), None, b"").await
        }
    };
    match end {
        Ok((200, _)) => {}
        Ok((status, _)) => out.error = out.error.take().or(Some(format!("end: status {status}"))),
        Err(e) => out.error = out.error.take().or(Some(format!("end: {e}"))),
    }
    out
}

/// Handshakes in flight at once: below the 128 connections agentmux's listen queue holds (tokio's default
/// backlog), which a burst of connects overflows, each dropped SYN costing a second.
const HANDSHAKES: usize = 64;

/// Opens a subscription per path (SSE or WebSocket) (at most [`HANDSHAKES`] at a time) and reads each in a task of its
/// own. Returns once every handshake is done.
async fn subscribe_all(
    server: SocketAddr,
    transport: Transport,
    paths: Vec<String>,
    ctx: &Arc<Ctx>,
    cancel: &CancellationToken,
) -> JoinSet<Sse> {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<()>();
    let mut readers = JoinSet::new();
    let total = paths.len();
    for (i, path) in paths.into_iter().enumerate() {
        let (handshakes, ready, ctx, cancel) =
            (Arc::clone(&handshakes), ready_tx.clone(), Arc::clone(ctx), cancel.clone());
        readers.spawn(async move {
            let permit = handshakes.acquire_owned().await;
            let opened = match transport {
                Transport::Sse => client::open_sse(server, source_ip(i), "GET", &path, b"", &ctx).await,
                Transport::WebSocket => crate::ws_client::open_ws(server, source_ip(i), &path, &ctx).await,
            };
            drop(permit);
            let _ = ready.send(());
            match opened {
                Ok((stream, sse)) => sse.read(stream, &ctx, &cancel).await,
                Err(e) => Sse::failed(format!("subscribe: {e}")),
            }
        });
    }
    for _ in 0..total {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    readers
}

/// Waits for every task until `deadline`, then cancels the rest and collects them too; a task that failed
/// becomes `failed(why)`.
async fn collect<T: Send + 'static>(
    mut tasks: JoinSet<T>,
    cancel: &CancellationToken,
    deadline: Instant,
    failed: impl Fn(String) -> T,
) -> Vec<T> {
    let mut done = Vec::with_capacity(tasks.len());
    let mut join = |joined: Result<T, tokio::task::JoinError>| match joined {
        Ok(value) => done.push(value),
        Err(e) => done.push(failed(format!("task: {e}"))),
    };
    loop {
        match tokio::time::timeout_at(deadline.into(), tasks.join_next()).await {
            Ok(Some(joined)) => join(joined),
            Ok(None) => break,
            Err(_) => {
                cancel.cancel();
                while let Some(joined) = tasks.join_next().await {
                    join(joined);
                }
                break;
            }
        }
    }
    done
}

fn failed_reader(error: String) -> Sse {
    Sse::failed(error)
}

pub(crate) struct Window {
    server_cpu: procfs::Cpu,
    client_cpu: procfs::Cpu,
}

impl Window {
    pub(crate) fn start(server: &Server) -> Self {
        Window { server_cpu: server.cpu_seconds(), client_cpu: procfs::cpu_seconds("self") }
    }

    pub(crate) fn end(self, server: &Server, result: &mut RunResult) {
        let server_cpu = server.cpu_seconds().since(self.server_cpu);
        let client_cpu = procfs::cpu_seconds("self").since(self.client_cpu);
        result.server_cpu_s = server_cpu.total();
        result.client_cpu_s = client_cpu.total();
        // The kernel's share: on loopback a write also runs the receiving side's TCP, so this is what the
        // transport itself costs, whatever the code above it does.
        result.extra.insert("server_system_cpu_s".into(), server_cpu.system);
        result.extra.insert("client_system_cpu_s".into(), client_cpu.system);
        result.server_peak_rss_mib = server.peak_rss_kib() as f64 / 1024.0;
    }
}

/// nchan publishes this share of a batched fan-out scenario's messages (see [`run`]).
pub(crate) const NCHAN_SHARE: usize = 10;

/// One run of `scenario` against `target`.
pub(crate) async fn run(scenario: &Scenario, target: Target, run: usize, settings: &Settings) -> io::Result<RunResult> {
    if let Kind::Relay(_) = scenario.kind {
        return Err(io::Error::other("the relay starts its own servers: relay::run"));
    }
    let label = format!("{}-run{run}", scenario.name);
    let mut args = match &scenario.kind {
        Kind::Soak(soak) => soak.server_args(&settings.agentmux),
        _ => Vec::new(),
    };
    let data = (settings.store && target == Target::Agentmux).then(|| procfs::DataDir::fresh(&label));
    if let Some(data) = &data {
        args.extend(["--data-dir".to_owned(), data.path().display().to_string()]);
    }
    if let Kind::Cluster { nodes, remote, subscribers, messages, rate, seconds } = scenario.kind {
        let cluster = crate::cluster::Cluster::start(&settings.agentmux, &label, nodes).await?;
        let mut result = RunResult::new(scenario, target, run);
        let readers_at = cluster.readers_at(remote);
        let pace = match rate {
            Some(rate) => Pace::Steady { rate, seconds },
            None => Pace::Burst { messages, batch: settings.batch },
        };
        let producer = Producer::Http { target, pace };
        let before = cluster.counters().await?;
        let (writer, sse) = (cluster.writer(), Transport::Sse);
        fanout(writer, &readers_at, settings, sse, &[("", subscribers)], producer, &mut result).await?;
        cluster.counters().await?.since(&before).report(&mut result);
        return Ok(result);
    }
    let mut emitter = None;
    let server = match (target, &settings.nchan, &scenario.kind) {
        (Target::Nchan, Some(install), _) => crate::nchan::start(install, &label, scenario.connections()).await?,
        (Target::Nchan, None, _) => return Err(io::Error::other("nchan is not installed")),
        (Target::Agentmux, _, Kind::Tokens { source: TokenSource::Output, .. }) => {
            let (server, control) = crate::output_server::start(&label).await?;
            emitter = Some(control);
            server
        }
        (Target::Ceiling | Target::CeilingNaive, _, Kind::Tokens { source: TokenSource::Output, .. }) => {
            return Err(io::Error::other("only agentmux emits through Output"));
        }
        _ => Server::start_with(target, &settings.agentmux, &label, &args).await?,
    };
    let mut result = RunResult::new(scenario, target, run);
    let overflows = procfs::listen_overflows();
    // nchan delivers batched fan-out at a fiftieth to a hundredth of the others' pace: the same bursts would
    // hold it for five minutes a scenario, and a run of seconds at that pace measures the same rate. (Token
    // scenarios, a message per POST, run in full: nchan is nearer the others there, and a short run flatters
    // the one that queues.)
    let share = |messages: usize| if target == Target::Nchan { messages.div_ceil(NCHAN_SHARE) } else { messages };
    match scenario.kind {
        Kind::Fanout { ref formats, messages } => {
            let messages = share(messages);
            let producer = Producer::Http { target, pace: Pace::Burst { messages, batch: settings.batch } };
            let id = fanout(&server, &[], settings, scenario.transport, formats, producer, &mut result).await?;
            if target == Target::Agentmux && formats.len() > 1 {
                renders_per_message(&server, &id, formats, &mut result).await?;
            }
        }
        Kind::Tokens { subscribers, messages, .. } => {
            let producer = match emitter {
                Some(emitter) => Producer::InProcess { emitter, messages },
                None => Producer::Http { target, pace: Pace::Burst { messages, batch: 1 } },
            };
            fanout(&server, &[], settings, scenario.transport, &[("", subscribers)], producer, &mut result).await?;
            result.per_message_cpu();
        }
        Kind::Latency { subscribers, rate, seconds } => {
            let producer = Producer::Http { target, pace: Pace::Steady { rate, seconds } };
            fanout(&server, &[], settings, scenario.transport, &[("", subscribers)], producer, &mut result).await?;
            result.burst_floor(subscribers);
        }
        Kind::ManyStreams { streams, seconds } => {
            many_streams(&server, settings, streams, seconds, &mut result).await?
        }
        Kind::Idle { connections, hold } => idle(&server, scenario.transport, connections, hold, &mut result).await?,
        Kind::Chat { concurrency, requests, words } => {
            chat(&server, settings, concurrency, requests, words, &mut result).await?;
        }
        Kind::Stall { messages, rate, seconds, join_after } => {
            crate::stall::stall(&server, settings, messages, rate, seconds, join_after, &mut result).await?;
        }
        Kind::WsIdle(ref sizes) => crate::ws_idle::ws_idle(&server, settings, &label, sizes, &mut result).await?,
        Kind::Soak(ref soak) => crate::soak::soak(&server, soak, &args, &mut result).await?,
        Kind::Relay(_) | Kind::Cluster { .. } => {}
    }
    let overflows = procfs::listen_overflows().saturating_sub(overflows);
    if overflows > 0 {
        result.extra.insert("listen_overflows".into(), overflows as f64);
    }
    Ok(result)
}

/// Who publishes a fan-out's messages.
enum Producer {
    /// The load generator, over HTTP, to `target`.
    Http { target: Target, pace: Pace },
    /// The output server itself, through agentmux's `Output` handle, as fast as it can.
    InProcess { emitter: crate::output_server::Emitter, messages: usize },
}

/// One stream, its subscribers (so many in each format), and a producer: a burst's latency is sampled (one
/// event in `settings.sample_every`), a steady producer's every event. The subscribers take turns over
/// `readers_at` (none: `server`, where the producer posts). Returns the stream's id.
#[allow(clippy::too_many_arguments)]
async fn fanout(
    server: &Server,
    readers_at: &[SocketAddr],
    settings: &Settings,
    transport: Transport,
    formats: &[(&'static str, usize)],
    producer: Producer,
    result: &mut RunResult,
) -> io::Result<String> {
    let sample_every = match producer {
        Producer::Http { pace: Pace::Steady { .. }, .. } => 1,
        _ => settings.sample_every,
    };
    let mut control = Conn::open(server.addr, source_ip(0)).await?;
    let id = create_stream(&mut control).await?;
    let ctx = Arc::new(Ctx { latency: Histogram::default(), sample_every });
    let cancel = CancellationToken::new();
    // Take the formats in turn, so that each kind of subscriber is spread over the handshakes.
    let mut left: Vec<(&str, usize)> = formats.to_vec();
    let mut paths = Vec::new();
    while left.iter().any(|(_, count)| *count > 0) {
        for (format, count) in left.iter_mut().filter(|(_, count)| *count > 0) {
            *count -= 1;
            let query = if format.is_empty() { String::new() } else { format!("?format={format}") };
            paths.push(transport.path(&id, &query));
        }
    }
    let readers_at = if readers_at.is_empty() { std::slice::from_ref(&server.addr) } else { readers_at };
    let mut reader_sets = Vec::with_capacity(readers_at.len());
    for (n, at) in readers_at.iter().enumerate() {
        let mine = paths.iter().skip(n).step_by(readers_at.len()).cloned().collect();
        reader_sets.push(subscribe_all(*at, transport, mine, &ctx, &cancel).await);
    }
    let window = Window::start(server);
    let (addr, dpm, durable) = (server.addr, settings.deltas_per_message, settings.durable_acks);
    let published = match producer {
        Producer::Http { target, pace } => {
            let id = id.clone();
            on_own_thread(move || publish(addr, target, id, pace, dpm, durable)).await.unwrap_or_default()
        }
        Producer::InProcess { emitter, messages } => match emitter.emit(&id, messages, dpm).await {
            Ok(emitted) => Published {
                messages: emitted.messages,
                posts: 0,
                first_ns: emitted.first_ns,
                last_ns: emitted.last_ns,
                error: None,
            },
            Err(error) => Published { error: Some(error), ..Published::default() },
        },
    };
    let deadline = Instant::now() + settings.drain;
    let mut readers = Vec::new();
    for set in reader_sets {
        readers.extend(collect(set, &cancel, deadline, failed_reader).await);
    }
    window.end(server, result);
    result.extra.insert("publish_posts".into(), published.posts as f64);
    result.published(&readers, published, &ctx.latency, false);
    let bytes: u64 = readers.iter().map(|r| r.bytes).sum();
    result.extra.insert("received_mib_per_s".into(), bytes as f64 / (1 << 20) as f64 / result.seconds.max(1e-9));
    Ok(id)
}

/// How many times each format rendered each message of stream `id`, from agentmux's
/// `agentmux_messages_rendered_total` (the server runs this one stream only): `renders_per_message_<format>`,
/// 1.00 when every subscriber of a format shares its one rendition, and `renders_per_message_max`.
async fn renders_per_message(
    server: &Server,
    id: &str,
    formats: &[(&'static str, usize)],
    result: &mut RunResult,
) -> io::Result<()> {
    let mut conn = Conn::open(server.addr, source_ip(0)).await?;
    let (_, snapshot) = conn.request("GET", &format!("/v1/streams/{id}"), None, b"").await?;
    let snapshot: serde_json::Value = serde_json::from_slice(&snapshot).map_err(io::Error::other)?;
    let logged = snapshot["last_sequence"].as_u64().ok_or_else(|| io::Error::other("no last_sequence"))?;
    let (_, metrics) = conn.request("GET", "/metrics", None, b"").await?;
    let metrics = String::from_utf8_lossy(&metrics);
    let mut most = 0.0f64;
    for (format, _) in formats {
        let render = if format.is_empty() { "cui" } else { format };
        let rendered: f64 = metrics
            .lines()
            .filter(|line| line.starts_with("agentmux_messages_rendered_total{"))
            .filter(|line| {
                line.contains(&format!("render=\"{render}@sse\"")) || line.contains(&format!("render=\"{render}/"))
            })
            .filter_map(|line| line.rsplit_once(' ').and_then(|(_, value)| value.parse::<f64>().ok()))
            .sum();
        let per_message = rendered / logged.max(1) as f64;
        most = most.max(per_message);
        result.extra.insert(format!("renders_per_message_{render}"), per_message);
    }
    result.extra.insert("renders_per_message_max".into(), most);
    Ok(())
}

async fn many_streams(
    server: &Server,
    settings: &Settings,
    streams: usize,
    seconds: f64,
    result: &mut RunResult,
) -> io::Result<()> {
    const PRODUCERS: usize = 8;
    // Create the streams over a few connections at once.
    let mut creators = JoinSet::new();
    for c in 0..PRODUCERS {
        let addr = server.addr;
        let count = streams / PRODUCERS + usize::from(c < streams % PRODUCERS);
        creators.spawn(async move {
            let mut conn = Conn::open(addr, source_ip(c)).await?;
            let mut ids = Vec::with_capacity(count);
            for _ in 0..count {
                ids.push(create_stream(&mut conn).await?);
            }
            io::Result::Ok(ids)
        });
    }
    let mut ids = Vec::with_capacity(streams);
    while let Some(created) = creators.join_next().await {
        ids.extend(created.map_err(io::Error::other)??);
    }
    let ctx = Arc::new(Ctx { latency: Histogram::default(), sample_every: 1 });
    let cancel = CancellationToken::new();
    let paths = ids.iter().map(|id| format!("/v1/streams/{id}/events")).collect();
    let readers = subscribe_all(server.addr, Transport::Sse, paths, &ctx, &cancel).await;

    let window = Window::start(server);
    let addr = server.addr;
    let ids = Arc::new(ids);
    let published = on_own_thread(move || async move {
        let start = tokio::time::Instant::now() + Duration::from_millis(50);
        let first_ns = now_ns() + 50_000_000;
        let producers = (0..PRODUCERS).map(|c| {
            let ids = Arc::clone(&ids);
            async move {
                // A whole text message per POST (not a delta): no lifecycle events to tell apart.
                let mut out = Published::default();
                let mine: Vec<&String> = ids.iter().skip(c).step_by(PRODUCERS).collect();
                let mut conn = match Conn::open(addr, source_ip(c)).await {
                    Ok(conn) => conn,
                    Err(e) => {
                        out.error = Some(format!("producer connect: {e}"));
                        return out;
                    }
                };
                let mut body = Vec::new();
                for round in 0..seconds.ceil() as usize {
                    for (j, id) in mine.iter().enumerate() {
                        let offset = (j as f64 + c as f64 / PRODUCERS as f64) / mine.len() as f64;
                        tokio::time::sleep_until(start + Duration::from_secs_f64(round as f64 + offset)).await;
                        body.clear();
                        push_message(&mut body, None, now_ns());
                        let path = format!("/v1/streams/{id}/messages");
                        match conn.request("POST", &path, Some("application/json"), &body).await {
                            Ok((200, _)) => out.messages += 1,
                            Ok((status, _)) => out.error = Some(format!("append: status {status}")),
                            Err(e) => {
                                out.error = Some(format!("append: {e}"));
                                return out;
                            }
                        }
                    }
                }
                out.last_ns = now_ns();
                out
            }
        });
        let all = futures::future::join_all(producers).await;
        Published {
            messages: all.iter().map(|p| p.messages).sum(),
            posts: all.iter().map(|p| p.messages).sum(),
            first_ns,
            last_ns: all.iter().map(|p| p.last_ns).max().unwrap_or(0),
            error: all.into_iter().find_map(|p| p.error),
        }
    })
    .await
    .unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cancel.cancel();
    let readers = collect(readers, &cancel, Instant::now() + settings.drain, failed_reader).await;
    window.end(server, result);
    result.published(&readers, published, &ctx.latency, true);
    result.extra.insert("target_msgs_per_s".into(), streams as f64);
    Ok(())
}

async fn idle(
    server: &Server,
    transport: Transport,
    connections: usize,
    hold: f64,
    result: &mut RunResult,
) -> io::Result<()> {
    let mut control = Conn::open(server.addr, source_ip(0)).await?;
    let id = create_stream(&mut control).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (rss0, kernel0, client0) = (server.rss_kib(), procfs::slab_kib(), procfs::status_kib("self", "VmRSS"));
    let ctx = Arc::new(Ctx::default());
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let paths = vec![transport.path(&id, ""); connections];
    let readers = subscribe_all(server.addr, transport, paths, &ctx, &cancel).await;
    let connect_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss1, kernel1, client1) = (server.rss_kib(), procfs::slab_kib(), procfs::status_kib("self", "VmRSS"));
    let window = Window::start(server);
    tokio::time::sleep(Duration::from_secs_f64(hold)).await;
    window.end(server, result);
    result.seconds = hold;
    cancel.cancel();
    let readers = collect(readers, &cancel, Instant::now() + Duration::from_secs(10), failed_reader).await;
    result.readers(&readers, 1, true);
    let open = readers.iter().filter(|r| r.error.is_none()).count().max(1) as f64;
    let per = |before: u64, after: u64| after.saturating_sub(before) as f64 / open;
    result.extra.insert("open_connections".into(), open);
    result.extra.insert("server_rss_kib_per_conn".into(), per(rss0, rss1));
    result.extra.insert("client_rss_kib_per_conn".into(), per(client0, client1));
    // Both ends of each connection are on this machine: slab growth is the kernel's memory for the pair.
    result.extra.insert("kernel_kib_per_conn_pair".into(), per(kernel0, kernel1));
    result.extra.insert("connect_per_s".into(), open / connect_s.max(1e-9));
    Ok(())
}

#[derive(Default)]
struct ChatClient {
    completed: u64,
    failed: u64,
    chunks: u64,
    error: Option<String>,
}

fn chat_body(words: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "while", "agents", "stream", "typed",
        "messages", "to", "every", "client",
    ];
    let content: Vec<&str> = (0..words).map(|i| WORDS[i % WORDS.len()]).collect();
    serde_json::json!({
        "model": "echo",
        "stream": true,
        "messages": [{"role": "user", "content": content.join(" ")}],
    })
    .to_string()
    .into_bytes()
}

async fn chat(
    server: &Server,
    settings: &Settings,
    concurrency: usize,
    requests: usize,
    words: usize,
    result: &mut RunResult,
) -> io::Result<()> {
    let body: Arc<[u8]> = chat_body(words).into();
    let rss_before = server.rss_kib();
    let ctx = Arc::new(Ctx::default());
    let first_chunk = Arc::new(Histogram::default());
    let cancel = CancellationToken::new();
    let window = Window::start(server);
    let started = now_ns();
    let mut clients = JoinSet::new();
    for c in 0..concurrency {
        let (addr, body, ctx, first_chunk, cancel) =
            (server.addr, Arc::clone(&body), Arc::clone(&ctx), Arc::clone(&first_chunk), cancel.clone());
        clients.spawn(async move {
            let mut client = ChatClient::default();
            for _ in 0..requests {
                let sent = now_ns();
                let sse = match client::open_sse(addr, source_ip(c), "POST", "/v1/chat/completions", &body, &ctx).await
                {
                    Ok((stream, sse)) => sse.read(stream, &ctx, &cancel).await,
                    Err(e) => failed_reader(format!("chat: {e}")),
                };
                if let Some(first) = sse.first_event_ns {
                    first_chunk.record(first.saturating_sub(sent));
                }
                client.chunks += sse.events;
                match (sse.complete, sse.error) {
                    (true, None) => client.completed += 1,
                    (_, error) => {
                        client.failed += 1;
                        let why = if sse.cancelled { "timed out".into() } else { "body ended early".into() };
                        client.error = client.error.take().or(error).or(Some(why));
                    }
                }
                if sse.cancelled {
                    break;
                }
            }
            client
        });
    }
    let failed = |error| ChatClient { failed: 1, error: Some(error), ..ChatClient::default() };
    let clients = collect(clients, &cancel, Instant::now() + settings.drain * 2, failed).await;
    let finished = now_ns();
    window.end(server, result);
    let completed: u64 = clients.iter().map(|c| c.completed).sum();
    result.messages = (concurrency * requests) as u64;
    result.deliveries = clients.iter().map(|c| c.chunks).sum();
    result.errors = clients.iter().map(|c| c.failed).sum();
    clients.iter().filter_map(|c| c.error.clone()).for_each(|e| result.note(e));
    result.seconds = finished.saturating_sub(started) as f64 / 1e9;
    result.deliveries_per_s = result.deliveries as f64 / result.seconds.max(1e-9);
    result.latency(&first_chunk);
    result.extra.insert("requests_per_s".into(), completed as f64 / result.seconds.max(1e-9));
    result.extra.insert("completed_requests".into(), completed as f64);
    // What the finished runs keep (they are retained, and a server gives back what an ended stream no
    // longer needs at its next sweep, about once a second): the RSS it grew by, per delta retained.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let retained_kib = server.rss_kib().saturating_sub(rss_before);
    result.extra.insert("retained_mib".into(), retained_kib as f64 / 1024.0);
    let deltas = (completed * words as u64).max(1);
    result.extra.insert("retained_bytes_per_delta".into(), (retained_kib * 1024) as f64 / deltas as f64);
    Ok(())
}
