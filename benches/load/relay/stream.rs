//! The relay benchmark's client: one keep-alive HTTP/1.1 connection per target over a raw loopback socket,
//! streaming chat requests sent one after another, each answer read as it arrives.
//!
//! A request is written in one `write`; from then on every read is timed (wall clock, the upstream's clock)
//! and its bytes go through the body's framing (chunked, a `Content-Length`, or up to the close) and the SSE
//! parser. Each `data:` event is parsed as JSON, and every `@@` stamp in `choices[0].delta.content` (a proxy
//! may merge chunks) is one per-chunk latency sample: the read's time less the stamp. The first stamped
//! event gives the time to first token: that read's time less the write's; less, too, the upstream's own
//! time to it (the first stamp less the `^^` stamp beside it, when the request was received), it gives what
//! the path between client and upstream added to that one request. The connection is reopened
//! (not timed) when the server closed it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::wall_ns;
use crate::client::{self, source_ip};

/// What one streamed answer gave.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    /// Request written to first content chunk read, in nanoseconds.
    pub(crate) ttft_ns: Option<u64>,
    /// That, less the upstream's own time to first token (request received to first chunk made): what the
    /// proxy (and the loopback hops, as the direct target's figure shows) added to this request.
    pub(crate) added_ttft_ns: Option<u64>,
    /// Per content chunk: read time less the stamp, in nanoseconds.
    pub(crate) chunk_ns: Vec<u64>,
    /// `[DONE]` came.
    pub(crate) done: bool,
}

/// A keep-alive connection to one target.
pub(crate) struct Client {
    addr: SocketAddr,
    /// Sent as `Authorization: Bearer`.
    key: Option<String>,
    conn: Option<TcpStream>,
    read: Vec<u8>,
}

impl Client {
    pub(crate) fn new(addr: SocketAddr, key: Option<String>) -> Client {
        Client { addr, key, conn: None, read: vec![0; 64 << 10] }
    }

    /// One streamed request of `body` to `path`, within `limit`.
    pub(crate) async fn stream(&mut self, path: &str, body: &[u8], limit: Duration) -> io::Result<Answer> {
        let auth = self.key.as_ref().map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n\
             {auth}Content-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        // A kept connection the server closed meanwhile fails at once, before any byte of an answer: once more
        // on a new one.
        for attempt in 0..2 {
            let reused = self.conn.is_some();
            let conn = match self.conn.take() {
                Some(conn) => conn,
                None => {
                    let conn = client::connect(self.addr, source_ip(0)).await?;
                    conn.set_nodelay(true)?;
                    conn
                }
            };
            match tokio::time::timeout(limit, exchange(conn, &request, &mut self.read)).await {
                Err(_) => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no full answer within {limit:?}")));
                }
                Ok(Ok((answer, keep))) => {
                    self.conn = keep;
                    return Ok(answer);
                }
                Ok(Err(Exchange::Unanswered(_))) if reused && attempt == 0 => continue,
                Ok(Err(Exchange::Unanswered(e) | Exchange::Failed(e))) => return Err(e),
            }
        }
        Err(io::Error::other("unreachable: two attempts"))
    }
}

enum Exchange {
    /// Nothing came back: the request may be tried again on a new connection.
    Unanswered(io::Error),
    Failed(io::Error),
}

/// Writes `request`, reads the answer; the connection back when it may be used again.
async fn exchange(
    mut conn: TcpStream,
    request: &[u8],
    read: &mut [u8],
) -> Result<(Answer, Option<TcpStream>), Exchange> {
    let failed =
        |nothing_yet: bool, e: io::Error| if nothing_yet { Exchange::Unanswered(e) } else { Exchange::Failed(e) };
    let sent = wall_ns();
    conn.write_all(request).await.map_err(Exchange::Unanswered)?;
    let mut head = Vec::with_capacity(1024);
    let mut answer = Answer::default();
    let mut sse = Sse::default();
    let (mut body, close) = loop {
        let n = conn.read(read).await.map_err(|e| failed(head.is_empty(), e))?;
        let now = wall_ns();
        if n == 0 {
            let e = io::Error::new(io::ErrorKind::UnexpectedEof, "closed before the response head");
            return Err(failed(head.is_empty(), e));
        }
        head.extend_from_slice(&read[..n]);
        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
            if head.len() > 64 << 10 {
                return Err(Exchange::Failed(io::Error::other("response head over 64 KiB")));
            }
            continue;
        };
        let (status, framing, close) = parse_head(&head[..end]).map_err(Exchange::Failed)?;
        let mut body = Body::new(framing);
        body.feed(&head[end + 4..], &mut sse).map_err(Exchange::Failed)?;
        if status != 200 {
            let text = String::from_utf8_lossy(&sse.pending).chars().take(300).collect::<String>();
            return Err(Exchange::Failed(io::Error::other(format!("status {status}: {text}"))));
        }
        sse.events(now, sent, &mut answer).map_err(Exchange::Failed)?;
        break (body, close);
    };
    while !body.done {
        let n = conn.read(read).await.map_err(Exchange::Failed)?;
        let now = wall_ns();
        if n == 0 {
            if body.framing == Framing::UntilClose {
                return Ok((answer, None));
            }
            return Err(Exchange::Failed(io::Error::new(io::ErrorKind::UnexpectedEof, "closed inside the body")));
        }
        body.feed(&read[..n], &mut sse).map_err(Exchange::Failed)?;
        sse.events(now, sent, &mut answer).map_err(Exchange::Failed)?;
    }
    Ok((answer, (!close).then_some(conn)))
}

/// How the body's end is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Chunked,
    Length(usize),
    UntilClose,
}

/// The status, the framing and whether the server will close the connection.
fn parse_head(head: &[u8]) -> io::Result<(u16, Framing, bool)> {
    let text = std::str::from_utf8(head).map_err(|_| io::Error::other("response head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line: {status_line:?}")))?;
    let mut framing = Framing::UntilClose;
    let mut close = status_line.starts_with("HTTP/1.0");
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") && value.to_ascii_lowercase().contains("chunked") {
            framing = Framing::Chunked;
        } else if name.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked {
            framing = Framing::Length(value.parse().map_err(|_| io::Error::other("bad content-length"))?);
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    if framing == Framing::UntilClose {
        close = true;
    }
    Ok((status, framing, close))
}

/// Where the chunked decoder is.
#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// Reading a size line.
    Size,
    /// This many bytes of data left in the chunk.
    Data(usize),
    /// The `\r\n` after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk, up to the empty one.
    Trailer,
}

/// The body's framing: undoes the chunked encoding, finds the end.
struct Body {
    framing: Framing,
    state: Chunk,
    /// Bytes of a size or trailer line not complete yet.
    raw: Vec<u8>,
    /// Bytes of a `Content-Length` body still to come.
    left: usize,
    done: bool,
}

impl Body {
    fn new(framing: Framing) -> Body {
        let left = if let Framing::Length(n) = framing { n } else { 0 };
        Body { framing, state: Chunk::Size, raw: Vec::new(), left, done: framing == Framing::Length(0) }
    }

    /// The next bytes of the body: their data goes to `sse`.
    fn feed(&mut self, mut data: &[u8], sse: &mut Sse) -> io::Result<()> {
        match self.framing {
            Framing::UntilClose => {
                sse.pending.extend_from_slice(data);
                return Ok(());
            }
            Framing::Length(_) => {
                let take = data.len().min(self.left);
                sse.pending.extend_from_slice(&data[..take]);
                self.left -= take;
                self.done = self.left == 0;
                return Ok(());
            }
            Framing::Chunked => {}
        }
        while !data.is_empty() && !self.done {
            match self.state {
                Chunk::Size | Chunk::Trailer | Chunk::DataEnd => {
                    let Some(at) = data.iter().position(|&b| b == b'\n') else {
                        self.raw.extend_from_slice(data);
                        return Ok(());
                    };
                    self.raw.extend_from_slice(&data[..at]);
                    data = &data[at + 1..];
                    let line = std::mem::take(&mut self.raw);
                    let line = line.strip_suffix(b"\r").unwrap_or(&line);
                    self.state = match self.state {
                        Chunk::Size => {
                            let size = std::str::from_utf8(line)
                                .ok()
                                .and_then(|l| usize::from_str_radix(l.split(';').next().unwrap_or("").trim(), 16).ok())
                                .ok_or_else(|| io::Error::other(format!("bad chunk size line {line:?}")))?;
                            if size == 0 { Chunk::Trailer } else { Chunk::Data(size) }
                        }
                        Chunk::DataEnd if line.is_empty() => Chunk::Size,
                        Chunk::DataEnd => return Err(io::Error::other("chunk data longer than its size")),
                        _ if line.is_empty() => {
                            self.done = true;
                            Chunk::Trailer
                        }
                        _ => Chunk::Trailer,
                    };
                }
                Chunk::Data(left) => {
                    let take = data.len().min(left);
                    sse.pending.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    self.state = if take == left { Chunk::DataEnd } else { Chunk::Data(left - take) };
                }
            }
        }
        Ok(())
    }
}

/// The SSE parser: the body's bytes not yet split into whole events.
#[derive(Default)]
struct Sse {
    pending: Vec<u8>,
}

impl Sse {
    /// Takes every whole event out of `pending`, read at `now`, into `answer`.
    fn events(&mut self, now: u64, sent: u64, answer: &mut Answer) -> io::Result<()> {
        let mut start = 0;
        let mut data = String::new();
        let mut consumed = 0;
        while let Some(at) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let line = &self.pending[start..start + at];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            start += at + 1;
            if line.is_empty() {
                if !data.is_empty() {
                    event(&data, now, sent, answer)?;
                    data.clear();
                }
                consumed = start;
            } else if let Some(value) = line.strip_prefix(b"data:") {
                let value = std::str::from_utf8(value).map_err(|_| io::Error::other("an event is not UTF-8"))?;
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value.strip_prefix(' ').unwrap_or(value));
            }
        }
        self.pending.drain(..consumed);
        Ok(())
    }
}

/// One event's data.
fn event(data: &str, now: u64, sent: u64, answer: &mut Answer) -> io::Result<()> {
    if data.trim() == "[DONE]" {
        answer.done = true;
        return Ok(());
    }
    let chunk: serde_json::Value =
        serde_json::from_str(data).map_err(|e| io::Error::other(format!("an event is not JSON: {e}")))?;
    let Some(content) = chunk["choices"][0]["delta"]["content"].as_str() else { return Ok(()) };
    let mut first = None;
    for piece in content.split("@@").skip(1) {
        let (stamp, rest) = number(piece);
        if let Some(stamp) = stamp {
            answer.chunk_ns.push(now.saturating_sub(stamp));
            // The first chunk's stamp, and when the upstream had received the request (`^^`, after it).
            first = first.or(Some((stamp, rest.strip_prefix("^^").and_then(|r| number(r).0))));
        }
    }
    if let Some((stamp, received)) = first
        && answer.ttft_ns.is_none()
    {
        let ttft = now.saturating_sub(sent);
        answer.ttft_ns = Some(ttft);
        answer.added_ttft_ns = received.map(|received| ttft.saturating_sub(stamp.saturating_sub(received)));
    }
    Ok(())
}

/// The decimal number `text` starts with, and what follows it.
fn number(text: &str) -> (Option<u64>, &str) {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    (text[..digits].parse().ok(), &text[digits..])
}
