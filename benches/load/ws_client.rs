//! The load generator's WebSocket subscriber: the upgrade handshake, and a reader of the server's frames as
//! cheap as the SSE one in `client.rs`, whose counts ([`Sse`]) and read loop it shares.
//!
//! A server's frames are not masked, so the reader only has to find each frame's header: it keeps the bytes
//! of a header split between two reads ([`Frames::header`]) and how much of the current frame's payload is
//! still to come, and skips payloads without copying them. A text frame is an event (agentmux's
//! `{"stream", "seq", "message"}` or nchan's message body); a ping is counted apart; a close frame ends the
//! subscription, complete unless its reason says `lagged`. The latency stamp (`@@` and 13 digits, see
//! `client.rs`) is parsed from every `sample_every`-th text frame, when it lies within one read. The reader
//! sends nothing back (no pong): a run is shorter than agentmux's idle timeout.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::client::{self, Ctx, Sse, now_ns};

/// Any 16 bytes in base64 will do: the server only hashes it into `Sec-WebSocket-Accept`.
pub(crate) const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

const TEXT: u8 = 0x1;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;

/// Where a WebSocket reader is in the server's frames.
#[derive(Debug, Default, Clone)]
pub(crate) struct Frames {
    /// The start of a header that the last read cut short.
    header: Vec<u8>,
    /// Payload bytes of the current frame still to come.
    remaining: u64,
    /// The current frame's opcode.
    opcode: u8,
    /// Parse the stamp from the current frame.
    sampled: bool,
    /// A close frame came.
    pub(crate) closed: bool,
}

/// The request head of a WebSocket upgrade of `path`.
pub(crate) fn upgrade_request(path: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {WS_KEY}\r\n\r\n"
    )
    .into_bytes()
}

/// Opens a WebSocket on `path` and reads the `101`; the stream to read the frames from and the counts of
/// what came with the head.
pub(crate) async fn open_ws(
    server: SocketAddr,
    source: Ipv4Addr,
    path: &str,
    ctx: &Ctx,
) -> io::Result<(TcpStream, Sse)> {
    let mut stream = client::connect(server, source).await?;
    stream.write_all(&upgrade_request(path)).await?;
    let mut buffer = Vec::with_capacity(4096);
    let (status, _, start) = client::read_head(&mut stream, &mut buffer).await?;
    if status != 101 {
        return Err(io::Error::other(format!("GET {path} (WebSocket): status {status}, not 101")));
    }
    let mut sse = Sse::websocket();
    sse.feed(&buffer[start..], now_ns(), ctx);
    Ok((stream, sse))
}

/// The length of a complete server frame header at the start of `bytes`, and the payload length it gives;
/// `None` when `bytes` holds only part of it.
fn header(bytes: &[u8]) -> Option<(usize, u64)> {
    let second = *bytes.get(1)?;
    let masked = if second & 0x80 != 0 { 4 } else { 0 };
    let (extended, length) = match second & 0x7f {
        126 => (2, u64::from(u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?))),
        127 => (8, u64::from_be_bytes(bytes.get(2..10)?.try_into().ok()?)),
        short => (0, u64::from(short)),
    };
    let size = 2 + extended + masked;
    (bytes.len() >= size).then_some((size, length))
}

/// Counts the frames in `data`, the next bytes from the server, read at `now`.
pub(crate) fn feed(sse: &mut Sse, frames: &mut Frames, data: &[u8], now: u64, ctx: &Ctx) {
    let mut at = 0;
    while at < data.len() {
        if frames.remaining > 0 {
            let take = frames.remaining.min((data.len() - at) as u64) as usize;
            let payload = &data[at..at + take];
            if frames.sampled
                && let Some(stamp) = client::stamp(payload)
                && now >= stamp
            {
                ctx.latency.record(now - stamp);
                sse.stamps += 1;
                frames.sampled = false;
            }
            if frames.opcode == CLOSE && payload.windows(6).any(|w| w == b"lagged") {
                sse.lagged = true;
            }
            frames.remaining -= take as u64;
            at += take;
            if frames.remaining == 0 {
                frame_done(sse, frames, now);
            }
            continue;
        }
        // A header: whole in `data`, or continuing the part the last read left.
        let (size, length, first) = if frames.header.is_empty() {
            match header(&data[at..]) {
                Some((size, length)) => (size, length, data[at]),
                None => {
                    frames.header.extend_from_slice(&data[at..]);
                    return;
                }
            }
        } else {
            let had = frames.header.len();
            let wanted = (14 - had).min(data.len() - at);
            frames.header.extend_from_slice(&data[at..at + wanted]);
            match header(&frames.header) {
                Some((size, length)) => {
                    let first = frames.header[0];
                    frames.header.clear();
                    (size - had, length, first)
                }
                None => return,
            }
        };
        frames.opcode = first & 0x0f;
        at += size;
        frames.remaining = length;
        frames.sampled = false;
        if frames.opcode == TEXT && ctx.sample_every > 0 {
            sse.phase += 1;
            if sse.phase >= ctx.sample_every {
                sse.phase = 0;
                frames.sampled = true;
            }
        }
        if length == 0 {
            frame_done(sse, frames, now);
        }
    }
}

/// The current frame ended.
fn frame_done(sse: &mut Sse, frames: &mut Frames, now: u64) {
    match frames.opcode {
        TEXT | 0 => {
            sse.events += 1;
            sse.first_event_ns.get_or_insert(now);
            sse.last_event_ns = now;
        }
        PING => sse.pings += 1,
        CLOSE => frames.closed = true,
        _ => {}
    }
}
