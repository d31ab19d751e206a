//! The ceiling: a minimal hyper server, no agentmux code, that does only the transport part of fan-out.
//!
//! It speaks the subset of agentmux's API the fan-out scenarios use (create a stream, append NDJSON or one
//! JSON object, end, subscribe over SSE). Each appended message becomes one pre-rendered frame (`id:` line
//! and the producer's JSON with the `metadata` agentmux stamps, byte for byte the size of agentmux's) in a
//! log shared by every subscriber; a subscriber is a cursor, woken by a `watch` channel, that sends every
//! frame it is behind as one body chunk (so hyper writes it at once). That is the least a fan-out server
//! can do and stay fair; everything agentmux adds on top is left out: parsing and validation, the delta
//! reducer, lifecycle events, the bound on a slow subscriber, keep-alive pings, routing and tracing.
//!
//! It runs in one of two modes ([`Mode`]), each a row of the table:
//! - **coalescing** (`ceiling`, the bound): a subscriber that keeps up gathers as agentmux's do. When it is
//!   woken less than [`GATHER`] after its last write, and that write took everything there was, it waits
//!   until [`GATHER`] after that write before it takes what is pending (agentmux's feed does the same), so
//!   messages posted one at a time to many subscribers share a write. Writes are most of a delivery's cost,
//!   and this is the one thing agentmux does to them that the naive mode does not: without it the ceiling
//!   writes once per message per subscriber in the token scenarios, and stops bounding anything there.
//! - **naive** (`ceiling-naive`, `--ceiling-naive`): it looks at once at every wake-up, so a message posted
//!   on its own is written on its own to each subscriber (the ceiling of sessions 1 to 27).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

/// The most one write carries: a subscriber far behind catches up in chunks of this size.
const BATCH_BYTES: usize = 256 << 10;

/// How long a coalescing subscriber that keeps up gathers after a write (agentmux's `GATHER`,
/// `src/http/transport/sse.rs`).
const GATHER: Duration = Duration::from_micros(1500);

/// How a subscriber meets a wake-up; see the module doc.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Gathers for [`GATHER`] after a write when it keeps up with a fast producer.
    Coalescing,
    /// Looks at once at every wake-up.
    Naive,
}

type Body = BoxBody<Bytes, Infallible>;

/// A stream's frames, pre-rendered once and shared by every subscriber.
#[derive(Default)]
struct Log {
    frames: Vec<Bytes>,
    ended: bool,
}

struct Stream {
    log: Mutex<Log>,
    changes: watch::Sender<u64>,
}

impl Stream {
    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
struct Streams {
    next: AtomicU64,
    by_id: Mutex<HashMap<String, Arc<Stream>>>,
}

impl Streams {
    fn get(&self, id: &str) -> Option<Arc<Stream>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `id: n` and the message with `metadata` added, as agentmux's CUI adapter writes it.
fn frame(sequence: usize, message: &[u8]) -> Bytes {
    let without_brace = &message[..message.len() - 1];
    let metadata = format!(",\"metadata\":{{\"sequence\":{sequence},\"timestamp\":{}}}}}\n\n", now_ms());
    let id = format!("id: {sequence}\ndata: ");
    let mut out = BytesMut::with_capacity(id.len() + without_brace.len() + metadata.len());
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(without_brace);
    out.extend_from_slice(metadata.as_bytes());
    out.freeze()
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert("content-type", value);
    }
    response
}

fn json(status: StatusCode, body: String) -> Response<Body> {
    full(status, "application/json", body)
}

fn not_found() -> Response<Body> {
    json(StatusCode::NOT_FOUND, r#"{"error":{"message":"not found","code":"not_found"}}"#.into())
}

async fn handle(streams: Arc<Streams>, mode: Mode, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let response = match (&method, parts.as_slice()) {
        (&Method::GET, ["healthz"]) => full(StatusCode::OK, "text/plain", "ok"),
        (&Method::POST, ["v1", "streams"]) => {
            let id = format!("c{}", streams.next.fetch_add(1, Ordering::Relaxed) + 1);
            let mut log = Log::default();
            log.frames.push(frame(1, br#"{"type":"event","props":{"event":"stream_start"}}"#));
            let stream = Arc::new(Stream { log: Mutex::new(log), changes: watch::channel(0).0 });
            streams.by_id.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), stream);
            json(StatusCode::CREATED, format!(r#"{{"id":"{id}","epoch":"ceiling"}}"#))
        }
        (&Method::POST, ["v1", "streams", id, "messages"]) => match streams.get(id) {
            None => not_found(),
            Some(stream) => match request.into_body().collect().await {
                Err(_) => json(StatusCode::BAD_REQUEST, r#"{"error":{"message":"bad body"}}"#.into()),
                Ok(body) => append(&stream, &body.to_bytes()),
            },
        },
        (&Method::POST, ["v1", "streams", id, "end"]) => match streams.get(id) {
            None => not_found(),
            Some(stream) => {
                let mut log = stream.lock();
                let sequence = log.frames.len() + 1;
                let end = br#"{"type":"event","props":{"event":"stream_end","data":{"status":"completed"}}}"#;
                log.frames.push(frame(sequence, end));
                log.ended = true;
                drop(log);
                stream.changes.send_modify(|n| *n += 1);
                json(StatusCode::OK, format!(r#"{{"status":"completed","last_sequence":{sequence}}}"#))
            }
        },
        (&Method::GET, ["v1", "streams", id, "events"]) => match streams.get(id) {
            None => not_found(),
            Some(stream) => subscribe(stream, mode),
        },
        _ => not_found(),
    };
    Ok(response)
}

/// One frame per line (NDJSON) or for the whole body (one object).
fn append(stream: &Stream, body: &[u8]) -> Response<Body> {
    let mut log = stream.lock();
    let mut sequences = String::from("{\"sequences\":[");
    for line in body.split(|&b| b == b'\n').map(<[u8]>::trim_ascii).filter(|l| !l.is_empty()) {
        if line.last() != Some(&b'}') {
            return json(StatusCode::BAD_REQUEST, r#"{"error":{"message":"not a JSON object"}}"#.into());
        }
        let sequence = log.frames.len() + 1;
        log.frames.push(frame(sequence, line));
        if !sequences.ends_with('[') {
            sequences.push(',');
        }
        sequences.push_str(&sequence.to_string());
    }
    drop(log);
    stream.changes.send_modify(|n| *n += 1);
    sequences.push_str("]}");
    json(StatusCode::OK, sequences)
}

/// A cursor into a stream's frames.
struct Subscriber {
    stream: Arc<Stream>,
    cursor: usize,
    changes: watch::Receiver<u64>,
    mode: Mode,
    /// When the last chunk was taken, and whether it took everything there was then.
    wrote: Option<(tokio::time::Instant, bool)>,
}

impl Subscriber {
    /// Every frame past the cursor (up to [`BATCH_BYTES`]) as one chunk; `None` once the stream has ended and
    /// everything was sent. A coalescing subscriber that keeps up first gathers (see the module doc).
    async fn next(&mut self) -> Option<Bytes> {
        if self.mode == Mode::Coalescing
            && let Some((wrote, true)) = self.wrote
        {
            // Woken by the next change (or already told of it), then held if it came soon after the write.
            if matches!(self.changes.has_changed(), Ok(false)) && self.changes.changed().await.is_err() {
                return None;
            }
            let now = tokio::time::Instant::now();
            if now < wrote + GATHER {
                tokio::time::sleep_until(wrote + GATHER).await;
            }
        }
        loop {
            self.changes.borrow_and_update();
            let ended = {
                let log = self.stream.lock();
                let mut until = self.cursor;
                let mut taken = 0;
                while let Some(frame) = log.frames.get(until) {
                    if until > self.cursor && taken + frame.len() > BATCH_BYTES {
                        break;
                    }
                    taken += frame.len();
                    until += 1;
                }
                if until > self.cursor {
                    let mut out = BytesMut::with_capacity(taken);
                    log.frames[self.cursor..until].iter().for_each(|f| out.extend_from_slice(f));
                    self.cursor = until;
                    let everything = until == log.frames.len() && !log.ended;
                    self.wrote = Some((tokio::time::Instant::now(), everything));
                    return Some(out.freeze());
                }
                log.ended
            };
            if ended || self.changes.changed().await.is_err() {
                return None;
            }
        }
    }
}

fn subscribe(stream: Arc<Stream>, mode: Mode) -> Response<Body> {
    let changes = stream.changes.subscribe();
    let subscriber = Subscriber { stream, cursor: 0, changes, mode, wrote: None };
    let body = futures::stream::unfold(subscriber, |mut subscriber| async move {
        let batch = subscriber.next().await?;
        Some((Ok::<_, Infallible>(Frame::data(batch)), subscriber))
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(body)));
    let headers = response.headers_mut();
    headers.insert("content-type", hyper::header::HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", hyper::header::HeaderValue::from_static("no-cache"));
    response
}

/// `load --ceiling-server [--ceiling-naive] --addr A`: serves until killed.
pub(crate) fn main(addr: &str, mode: Mode) -> ExitCode {
    let addr: SocketAddr = match addr.parse() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("ceiling: bad --addr {addr}: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ceiling: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("ceiling: listening on {addr}: {e}");
                return ExitCode::from(2);
            }
        };
        let streams = Arc::new(Streams::default());
        loop {
            let tcp = match listener.accept().await {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, most likely: let connections close before trying again.
                    eprintln!("ceiling: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let streams = Arc::clone(&streams);
            tokio::spawn(async move {
                let service = service_fn(move |request| handle(Arc::clone(&streams), mode, request));
                let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    })
}
