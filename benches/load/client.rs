//! The load generator's HTTP/1.1 over raw loopback sockets: a keep-alive request connection for producers,
//! and SSE readers built to cost the client as little as possible.
//!
//! An SSE reader holds no buffer of its own: it waits until its socket is readable, then reads into its
//! worker thread's 256 KiB buffer and scans it in place: events are counted by `\n\n`, pings (`: ping`) are
//! told apart by their last bytes and the reconnection hint (`retry: ...`) by its first, and the latency
//! stamp (`@@` and 13 digits: nanoseconds since [`now_ns`]'s base, written by the producer) is parsed from
//! every `sample_every`-th event only. The chunked transfer
//! encoding is left in place: a chunk is a batch of whole frames, so its size lines never hold `\n\n`. The
//! body is over when the server closes after the last chunk (`0\r\n\r\n`): readers send
//! `Connection: close`. nchan's EventSource is not chunked: its body is over when nginx closes after the
//! `:410` comment that tells its subscribers the channel was deleted. A WebSocket subscriber (`ws_client.rs`)
//! shares the read loop and the counts; only its parsing of what it reads differs.

use std::cell::RefCell;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use memchr::memmem::Finder;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::hist::Histogram;

/// Source addresses are spread over 127.0.0.2 ..= 127.0.0.(1 + SOURCES).
const SOURCES: usize = 16;
const READ_BUFFER: usize = 256 << 10;

static EVENT_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n\n"));
static STAMP: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"@@"));
static LAGGED: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"lagged\""));
static HEAD_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\r\n\r\n"));
static CHANNEL_DELETED: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b":410: "));

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0; READ_BUFFER]);
}

/// Nanoseconds since the process's base instant: the clock producers stamp with and readers compare to.
pub(crate) fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The `i`-th connection's source address.
pub(crate) fn source_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 2 + (i % SOURCES) as u8)
}

/// A TCP connection from `source` (any port) to `server`.
pub(crate) async fn connect(server: SocketAddr, source: Ipv4Addr) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    match tokio::time::timeout(Duration::from_secs(10), socket.connect(server)).await {
        Ok(stream) => stream,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// The status code of a response head, and whether its body is chunked.
fn parse_head(head: &[u8]) -> io::Result<(u16, Option<usize>)> {
    let text = std::str::from_utf8(head).map_err(|_| io::Error::other("response head is not UTF-8"))?;
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line: {:?}", text.lines().next())))?;
    let length = text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
    });
    Ok((status, length))
}

/// Reads a response head from `stream` into `buffer`; returns the status, the content length and where the
/// body starts in `buffer`.
pub(crate) async fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> io::Result<(u16, Option<usize>, usize)> {
    read_head_from(stream, buffer, 0).await
}

/// The same for a head that starts at `from` in `buffer` (what came before it was read already).
async fn read_head_from(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
    from: usize,
) -> io::Result<(u16, Option<usize>, usize)> {
    loop {
        if let Some(end) = buffer.get(from..).and_then(|unread| HEAD_END.find(unread)).map(|end| from + end) {
            let (status, length) = parse_head(&buffer[from..end])?;
            return Ok((status, length, end + 4));
        }
        if buffer.len().saturating_sub(from) > 64 << 10 {
            return Err(io::Error::other("response head over 64 KiB"));
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before the response head"));
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

pub(crate) fn request_head(
    method: &str,
    path: &str,
    content_type: Option<&str>,
    length: usize,
    close: bool,
) -> Vec<u8> {
    request_head_accepting(method, path, content_type, None, length, close)
}

/// The same with an `Accept` header.
pub(crate) fn request_head_accepting(
    method: &str,
    path: &str,
    content_type: Option<&str>,
    accept: Option<&str>,
    length: usize,
    close: bool,
) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n");
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if let Some(accept) = accept {
        head.push_str(&format!("Accept: {accept}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// A keep-alive connection for request/response calls (bodies with a `Content-Length`).
pub(crate) struct Conn {
    stream: TcpStream,
    /// What was read; the bytes before `read` belong to responses already returned.
    buffer: Vec<u8>,
    read: usize,
    out: Vec<u8>,
}

impl Conn {
    pub(crate) async fn open(server: SocketAddr, source: Ipv4Addr) -> io::Result<Conn> {
        let stream = connect(server, source).await?;
        stream.set_nodelay(true)?;
        Ok(Conn { stream, buffer: Vec::with_capacity(4096), read: 0, out: Vec::new() })
    }

    /// One request; the status and the body.
    pub(crate) async fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> io::Result<(u16, Vec<u8>)> {
        self.out.clear();
        self.out.extend_from_slice(&request_head(method, path, content_type, body.len(), false));
        self.out.extend_from_slice(body);
        self.stream.write_all(&self.out).await?;
        self.response().await
    }

    /// Requests written back to back in one write (`requests`, `count` of them: HTTP/1.1 pipelining), then
    /// their responses in order; the status of each.
    pub(crate) async fn pipelined(&mut self, requests: &[u8], count: usize) -> io::Result<Vec<u16>> {
        self.stream.write_all(requests).await?;
        let mut statuses = Vec::with_capacity(count);
        for _ in 0..count {
            statuses.push(self.response().await?.0);
        }
        Ok(statuses)
    }

    /// The next response: its status and body. What came after it stays in the buffer for the next one.
    async fn response(&mut self) -> io::Result<(u16, Vec<u8>)> {
        if self.read == self.buffer.len() {
            self.buffer.clear();
            self.read = 0;
        }
        let (status, length, start) = read_head_from(&mut self.stream, &mut self.buffer, self.read).await?;
        let length = match (length, status) {
            (Some(length), _) => length,
            (None, 204 | 304) => 0,
            (None, _) => return Err(io::Error::other(format!("status {status} without a Content-Length"))),
        };
        while self.buffer.len() < start + length {
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed inside a response body"));
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
        self.read = start + length;
        Ok((status, self.buffer[start..self.read].to_vec()))
    }
}

/// What readers share: the latency histogram and how often to parse a stamp.
#[derive(Default)]
pub(crate) struct Ctx {
    pub(crate) latency: Histogram,
    /// Parse the stamp of one event in this many; 0: never.
    pub(crate) sample_every: u64,
}

/// One SSE connection's counts.
#[derive(Debug, Default, Clone)]
pub(crate) struct Sse {
    /// Events other than pings.
    pub(crate) events: u64,
    pub(crate) pings: u64,
    pub(crate) bytes: u64,
    /// Latency samples taken.
    pub(crate) stamps: u64,
    pub(crate) first_event_ns: Option<u64>,
    pub(crate) last_event_ns: u64,
    /// A `lagged` notice came.
    pub(crate) lagged: bool,
    /// The body ended with its last chunk.
    pub(crate) complete: bool,
    /// Stopped by the harness (a time-bound scenario, or a deadline).
    pub(crate) cancelled: bool,
    /// The server closed the connection.
    closed: bool,
    /// nchan said the channel was deleted (`:410: ...`), how its streams end.
    channel_deleted: bool,
    pub(crate) error: Option<String>,
    tail: [u8; 8],
    /// Events since the last latency sample.
    pub(crate) phase: u64,
    /// A WebSocket subscriber's place in the frames (`ws_client.rs`); none for SSE.
    pub(crate) ws: Option<Box<crate::ws_client::Frames>>,
}

impl Sse {
    /// A WebSocket reader, before its first frame.
    pub(crate) fn websocket() -> Sse {
        Sse { ws: Some(Box::default()), ..Sse::default() }
    }

    /// A reader that never got going.
    pub(crate) fn failed(error: String) -> Sse {
        Sse { error: Some(error), ..Sse::default() }
    }

    /// Counts the events in `data`, the next bytes of the body (or of a WebSocket's frames), read at `now`
    /// (see [`is_retry_hint`]).
    pub(crate) fn feed(&mut self, data: &[u8], now: u64, ctx: &Ctx) {
        if let Some(mut frames) = self.ws.take() {
            self.bytes += data.len() as u64;
            crate::ws_client::feed(self, &mut frames, data, now, ctx);
            self.ws = Some(frames);
            return;
        }
        let Some(&first) = data.first() else { return };
        self.bytes += data.len() as u64;
        let before = self.events;
        // `\n\n` split between two reads.
        if self.tail[7] == b'\n' && first == b'\n' && self.tail[6] != b'\n' {
            self.events += 1;
        }
        let mut start = 0;
        for end in EVENT_END.find_iter(data) {
            if end >= 6 && &data[end - 6..end] == b": ping" {
                self.pings += 1;
            } else if is_retry_hint(&data[start.min(end)..end]) {
                // The reconnection hint a CUI event stream opens with: not an event.
            } else {
                self.events += 1;
                if ctx.sample_every > 0 {
                    self.phase += 1;
                    if self.phase >= ctx.sample_every {
                        self.phase = 0;
                        if let Some(stamp) = stamp(&data[start..end])
                            && now >= stamp
                        {
                            ctx.latency.record(now - stamp);
                            self.stamps += 1;
                        }
                    }
                }
            }
            start = end + 2;
        }
        if self.events > before {
            self.first_event_ns.get_or_insert(now);
            self.last_event_ns = now;
        }
        if LAGGED.find(data).is_some() {
            self.lagged = true;
        }
        if CHANNEL_DELETED.find(data).is_some() {
            self.channel_deleted = true;
        }
        if data.len() >= 8 {
            self.tail.copy_from_slice(&data[data.len() - 8..]);
        } else {
            self.tail.rotate_left(data.len());
            self.tail[8 - data.len()..].copy_from_slice(data);
        }
    }

    /// Reads the body until it ends, fails or `cancel` fires.
    pub(crate) async fn read(mut self, stream: TcpStream, ctx: &Ctx, cancel: &CancellationToken) -> Sse {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => {
                self.cancelled = true;
                Ok(())
            }
            outcome = read_loop(&stream, &mut self, ctx) => outcome,
        };
        match outcome {
            Ok(()) => self.closed = !self.cancelled,
            Err(e) => self.error = Some(e.to_string()),
        }
        let ws_closed = self.ws.as_ref().is_some_and(|frames| frames.closed);
        self.complete = self.tail.ends_with(b"\r\n0\r\n\r\n")
            || (self.closed && self.channel_deleted)
            || (ws_closed && !self.lagged);
        self
    }
}

/// Reads until the server closes (`Ok`) or the read fails.
async fn read_loop(stream: &TcpStream, sse: &mut Sse, ctx: &Ctx) -> io::Result<()> {
    loop {
        stream.readable().await?;
        // A read shorter than the buffer drained the socket: answering `WouldBlock` makes tokio clear the
        // readiness (as its own `poll_read` does), so the next wait parks at once instead of costing a read
        // that only finds the socket empty, which doubled the reader's system calls.
        let read = stream.try_io(Interest::READABLE, || {
            BUFFER.with_borrow_mut(|buffer| {
                let n = stream.try_read(buffer)?;
                if n == 0 {
                    return Ok(true);
                }
                sse.feed(&buffer[..n], now_ns(), ctx);
                // A WebSocket is over at its close frame: the reader does not wait for the server to close.
                if sse.ws.as_ref().is_some_and(|frames| frames.closed) {
                    return Ok(true);
                }
                if n < buffer.len() { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(false) }
            })
        });
        match read {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// The stamp in an event: `@@` and 13 digits.
pub(crate) fn stamp(event: &[u8]) -> Option<u64> {
    let at = STAMP.find(event)?;
    let digits = event.get(at + 2..at + 15)?;
    digits.iter().try_fold(0u64, |n, &d| d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0')))
}

/// Sends a request that answers with SSE and reads the response head. The stream to read the body from and
/// the counts of what came with the head; an error for a status other than 200.
pub(crate) async fn open_sse(
    server: SocketAddr,
    source: Ipv4Addr,
    method: &str,
    path: &str,
    body: &[u8],
    ctx: &Ctx,
) -> io::Result<(TcpStream, Sse)> {
    let mut stream = connect(server, source).await?;
    let content_type = (!body.is_empty()).then_some("application/json");
    // What a browser's EventSource sends; nchan serves EventSource only to a request that accepts it.
    let accept = Some("text/event-stream");
    let mut request = request_head_accepting(method, path, content_type, accept, body.len(), true);
    request.extend_from_slice(body);
    stream.write_all(&request).await?;
    let mut buffer = Vec::with_capacity(4096);
    let (status, _, start) = read_head(&mut stream, &mut buffer).await?;
    if status != 200 {
        return Err(io::Error::other(format!("{method} {path}: status {status}")));
    }
    let mut sse = Sse::default();
    sse.feed(&buffer[start..], now_ns(), ctx);
    Ok((stream, sse))
}

/// Whether an SSE block (with the chunk-size line that may precede it) is the `retry:` hint alone: a short
/// block, so an event costs one length check.
fn is_retry_hint(block: &[u8]) -> bool {
    block.len() <= 32 && block.windows(7).any(|w| w == b"retry: ") && !block.windows(5).any(|w| w == b"data:")
}
