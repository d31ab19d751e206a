//! A connection whose first request is `GET /v1/streams/{id}/events` or a WebSocket upgrade (`GET
//! /v1/streams/{id}/ws`, `GET /v1/ws`), served without hyper: [`first_request`] reads and parses a new
//! connection's first request head, [`serve_events`] answers it.
//!
//! A subscriber to an event stream spends nearly all its life waiting. Held by hyper, a waiting subscriber
//! keeps hyper's read buffer and its write buffer (8 KiB each, one page of each touched by the request and
//! the response head) and its dispatcher: about 9 KiB of server memory per idle connection
//! (`docs/benchmarks-history.md`), with no setting in hyper for less. Every SSE client opens a connection per stream
//! (`EventSource`, the OpenAI and AI SDK clients, curl), so the first request of a connection is where an
//! event stream is asked for. That one request is read here: its head parsed (`httparse`) out of a buffer
//! sized to it and dropped once parsed, answered by the same router as every other request (every layer:
//! keys, CORS, limits, metrics), and its response written here: the head, each body chunk in chunked
//! encoding as it comes (`chunked.rs`), then the connection closed (a client reconnects, as after any end
//! of a stream). While the response waits for its next chunk, a read of a few bytes into the task's own
//! state notices a client that went away.
//!
//! An SSE response (`sse.rs`) is written from its relay rather than its body ([`serve_relay`]): whenever
//! the relay has sent everything there was, it is parked on its stream's feed (`feed.rs`), which writes
//! what comes next straight to the socket, and this task sleeps until the feed hands the relay back, a
//! ping is due, or the client goes away.
//!
//! A WebSocket upgrade is answered by the same router: the endpoint's `101` carries what serves the socket
//! (`upgrade.rs`), and once the head is written here the socket is the WebSocket connection's (`ws.rs`),
//! which never holds a buffer of hyper's either.
//!
//! Anything else goes to hyper, which sees the connection from its first byte: the bytes read here are put
//! back in front of the socket ([`Rewind`]). That is every other method or path, HTTP/1.0, a request with a
//! body or an `Expect` (or an `Upgrade` to another path), bytes after the head (a pipelined request), a head that
//! `httparse` refuses or that is longer than [`HEAD_LIMIT`] (hyper then answers as it does), and every
//! request after the first on a kept-alive connection.

use std::convert::Infallible;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version, header};
use bytes::Bytes;
use http_body::{Body as _, Frame};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

use super::chunked::{self, ChunkSize, GATHERED_FRAMES, LAST_CHUNK, write_all_to};
use super::feed::{Feeds, Parked, Reader};
use super::socket::{AdmittedSocket, Rewind};
use super::sse::{Direct, Relay};
use super::upgrade::{DirectUpgrade, UpgradedSocket, UpgradesDirectly};
use super::watched::{WakeFlag, Watched};

/// The longest first request head read here; a longer one goes to hyper, which answers it as it does.
const HEAD_LIMIT: usize = 8 * 1024;

/// Headers a request head read here may have; more go to hyper (and the service's own limit answers).
const MAX_HEADERS: usize = 64;

/// The first request of a new connection.
pub(crate) enum First {
    /// A GET of a stream's events, parsed: answered by [`serve_events`].
    Events(Box<Request<Body>>, AdmittedSocket),
    /// Anything else: hyper serves the connection, from its first byte.
    Other(Rewind),
}

/// Reads a new connection's first request head and says who serves it; `Ok(None)` when the client closed
/// the connection before sending a whole head. Nothing is allocated until the client sends something.
pub(crate) async fn first_request(socket: AdmittedSocket) -> io::Result<Option<First>> {
    let mut head = Vec::new();
    loop {
        socket.tcp.readable().await?;
        if head.len() == head.capacity() {
            head.reserve(if head.is_empty() { 1024 } else { head.capacity() });
        }
        match socket.tcp.try_read_buf(&mut head) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&head) {
            Ok(httparse::Status::Complete(length)) if length == head.len() => {
                return Ok(Some(match events_request(&parsed) {
                    Some(request) => First::Events(Box::new(request), socket),
                    None => First::Other(Rewind::new(head, socket)),
                }));
            }
            Ok(httparse::Status::Partial) if head.len() < HEAD_LIMIT => {}
            // Bytes after the head, a head too long, or one httparse refuses: hyper's.
            _ => return Ok(Some(First::Other(Rewind::new(head, socket)))),
        }
    }
}

/// The request, when it is a plain GET over HTTP/1.1 of a stream's events or of a WebSocket endpoint (an
/// upgrade, marked [`UpgradesDirectly`]).
fn events_request(parsed: &httparse::Request<'_, '_>) -> Option<Request<Body>> {
    if parsed.method != Some("GET") || parsed.version != Some(1) {
        return None;
    }
    let target = parsed.path?;
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    let stream = |suffix: &str| {
        let id = path.strip_prefix("/v1/streams/").and_then(|rest| rest.strip_suffix(suffix));
        id.is_some_and(|id| !id.is_empty() && !id.contains('/'))
    };
    let upgrade = path == "/v1/ws" || stream("/ws");
    if !upgrade && !stream("/events") {
        return None;
    }
    let bodiless = |value: &[u8]| value.iter().all(|b| b.is_ascii_whitespace() || *b == b'0');
    let mut request = Request::builder().method(Method::GET).uri(target).version(Version::HTTP_11);
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        let ours = match name {
            header::UPGRADE => upgrade,
            header::TRANSFER_ENCODING | header::EXPECT => false,
            header::CONTENT_LENGTH => bodiless(h.value),
            _ => true,
        };
        if !ours {
            return None;
        }
        request = request.header(name, HeaderValue::from_bytes(h.value).ok()?);
    }
    if upgrade {
        request = request.extension(UpgradesDirectly);
    }
    request.body(Body::empty()).ok()
}

/// Answers `request` with `service` and writes the response on `socket`, then closes it: when the body ends,
/// when the client goes away, or when `gone` fires (the shutdown's drain is over). An SSE response waits on
/// its stream's feed in `feeds`.
pub(crate) async fn serve_events<S>(
    mut socket: AdmittedSocket,
    request: Box<Request<Body>>,
    service: S,
    feeds: &Feeds,
    gone: CancellationToken,
) where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    // Boxed, as the head below: what a waiting subscriber holds is its body and its socket, nothing more.
    let Ok(response) = Box::pin(service.oneshot(*request)).await;
    let (parts, body) = response.into_parts();
    // A WebSocket upgrade the endpoint accepted: its `101`, then the socket is the WebSocket connection's.
    let upgraded = parts.extensions.get::<DirectUpgrade>().filter(|_| parts.status == StatusCode::SWITCHING_PROTOCOLS);
    if let Some(serve) = upgraded.and_then(DirectUpgrade::take) {
        let head = upgrade_head(&parts);
        drop((parts, body));
        if socket.tcp.write_all(&head).await.is_ok() {
            // A task of its own: this connection's task, sized for every request it may serve, ends here.
            tokio::spawn(serve(UpgradedSocket::direct(socket)));
        }
        return;
    }
    let bodiless = parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    let length = if bodiless { Some(0) } else { http_body::Body::size_hint(&body).exact() };
    let head = response_head(&parts, length, bodiless);
    // An SSE response's relay, written here rather than through its body, so that a feed can write it
    // while it waits (`feed.rs`).
    let direct = parts.extensions.get::<Direct>().filter(|_| length.is_none() && !bodiless);
    if let Some(relay) = direct.and_then(Direct::take) {
        drop(parts);
        // The body is not polled (the relay is taken out of it), but kept for as long as the response is
        // served: what the layers hung on it (a key's connection slot, see `edge/auth.rs`) lasts that long.
        let _body = body;
        return serve_relay(socket, head, relay, feeds, gone).await;
    }
    drop(parts);
    let (mut reader, mut writer) = socket.tcp.split();
    let relay = async {
        writer.write_all(&head).await?;
        drop(head);
        if !bodiless {
            relay_body(body, &mut writer, length.is_none()).await?;
        }
        writer.shutdown().await
    };
    let client_gone = async {
        // Bytes a client sends after its request are read and dropped; the end of the stream is the client
        // going away.
        let mut scratch = [0u8; 64];
        while let Ok(1..) = reader.read(&mut scratch).await {}
    };
    until_gone(std::pin::pin!(relay), std::pin::pin!(client_gone), &gone).await;
}

/// Runs `relay` until it completes, `client_gone` does, or `gone` fires. The two watchers are polled only
/// when they are woken (see `watched.rs`): the relay is woken for every batch, they all but never.
/// Both come pinned where they were made, so that this future does not hold them a second time.
async fn until_gone(
    relay: Pin<&mut impl Future<Output = io::Result<()>>>,
    client_gone: Pin<&mut impl Future<Output = ()>>,
    gone: &CancellationToken,
) {
    let watchers = async {
        tokio::select! {
            () = client_gone => {}
            () = gone.cancelled() => {}
        }
    };
    if let Some(Err(error)) = Watched::new(relay, std::pin::pin!(watchers)).await {
        tracing::debug!(%error, "event stream connection closed with an error");
    }
}

/// Writes `head`, then `relay`'s events in chunked encoding, parking it on `feeds` whenever it waits; closes
/// the connection when the relay ends, when the client goes away, or when `gone` fires.
async fn serve_relay(socket: AdmittedSocket, head: Vec<u8>, relay: Box<Relay>, feeds: &Feeds, gone: CancellationToken) {
    let (tcp, _kept) = socket.share();
    let relay = async {
        write_all_to(&tcp, &mut [IoSlice::new(&head)]).await?;
        drop(head);
        relay_events(&tcp, relay, feeds).await?;
        socket2::SockRef::from(&*tcp).shutdown(std::net::Shutdown::Write)
    };
    let client_gone = async {
        let mut scratch = [0u8; 64];
        while tcp.readable().await.is_ok() {
            match tcp.try_read(&mut scratch) {
                Ok(1..) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Ok(0) | Err(_) => break,
            }
        }
    };
    until_gone(std::pin::pin!(relay), std::pin::pin!(client_gone), &gone).await;
}

/// Writes `relay`'s chunks as they come, each with the rest of its batch's pieces that are ready (up to
/// [`GATHERED_FRAMES`] and [`GATHERED_BYTES`]), then the last chunk. While the relay waits, it is parked on
/// its stream's feed, which writes for it until it hands it back, or until a ping is due.
///
/// What a parked connection holds is this future, so the relay is boxed and so are the futures of the
/// active part (the relay's next chunk, a chunk's write): about 10,000 idle readers sit here.
async fn relay_events(tcp: &Arc<TcpStream>, mut relay: Box<Relay>, feeds: &Feeds) -> io::Result<()> {
    let shard = feeds.shard();
    let mut frames: Vec<Bytes> = Vec::new();
    loop {
        if relay.is_waiting() {
            let mut parked = feeds.park(Reader::Sse(relay), tcp, shard);
            let ping = ping_or_handed_back(&parked).await;
            let (taken, unsent) = parked.take_back();
            drop(parked);
            relay = match taken {
                Some(Reader::Sse(relay)) => relay,
                _ => return Err(io::Error::other("a parked relay was lost")),
            };
            if !unsent.is_empty() {
                let mut slices: Vec<IoSlice<'_>> = unsent.iter().map(|piece| IoSlice::new(piece)).collect();
                write_all_to(tcp, &mut slices).await?;
            }
            if !ping {
                continue;
            }
            frames.push(relay.ping());
        } else {
            let Some(first) = Box::pin(relay.next()).await else { break };
            let mut bytes = first.len();
            frames.push(first);
            while frames.len() < GATHERED_FRAMES && bytes < GATHERED_BYTES {
                let Some(piece) = relay.ready_piece() else { break };
                bytes += piece.len();
                frames.push(piece);
            }
        }
        Box::pin(chunked::write(tcp, &frames)).await?;
        frames.clear();
    }
    write_all_to(tcp, &mut [IoSlice::new(LAST_CHUNK)]).await
}

/// Waits until the feed hands the relay back (false) or its ping is due (true).
async fn ping_or_handed_back(parked: &Parked) -> bool {
    loop {
        let Some(due) = parked.ping_due() else {
            parked.handed_back().await;
            return false;
        };
        if due <= Instant::now() {
            return true;
        }
        tokio::select! {
            () = parked.handed_back() => return false,
            () = tokio::time::sleep_until(due) => {}
        }
    }
}

/// The status line and headers of a `101` answer to a WebSocket upgrade, as the endpoint made them.
fn upgrade_head(parts: &axum::http::response::Parts) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\n");
    for (name, value) in &parts.headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// The status line and headers, with the framing chosen here: `content-length` when the body's length is
/// known, chunked otherwise; and `connection: close`, since the connection ends with the response.
fn response_head(parts: &axum::http::response::Parts, length: Option<u64>, bodiless: bool) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(parts.status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if matches!(*name, header::CONNECTION | header::TRANSFER_ENCODING | header::CONTENT_LENGTH)
            || name.as_str() == "keep-alive"
        {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if !parts.headers.contains_key(header::DATE) {
        head.extend_from_slice(b"date: ");
        head.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    match length {
        _ if bodiless => {}
        Some(length) => head.extend_from_slice(format!("content-length: {length}\r\n").as_bytes()),
        None => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    head.extend_from_slice(b"connection: close\r\n\r\n");
    head
}

/// Writes the data frames of `body` as they come: each time one comes, it and every other one ready at
/// that moment (the rest of a batch's pieces, see `sse.rs`; up to [`GATHERED_FRAMES`] and
/// [`GATHERED_BYTES`]) go out in one write, as one chunk when `chunked`, with the last chunk at the end.
/// Nothing waits to be gathered. A body that fails ends the response without its last chunk, so the
/// client sees it cut short.
///
/// The body is polled with a [`WakeFlag`]: the look for more frames after a batch leaves the body waiting
/// with that waker, so after the write the body is polled again only if it was woken meanwhile, not once
/// more per delivery to find it still waiting.
async fn relay_body(mut body: Body, writer: &mut (impl AsyncWrite + Unpin), chunked: bool) -> io::Result<()> {
    let mut frames: Vec<Bytes> = Vec::new();
    let mut ended = false;
    let woken = WakeFlag::new();
    // The body's last poll left it waiting (with `woken`'s waker): poll it again only once woken.
    let mut waiting = false;
    while !ended {
        // `frames` is empty here: every pass ends by clearing it.
        let first = std::future::poll_fn(|cx| {
            if !woken.woken(cx) && waiting {
                return Poll::Pending;
            }
            let polled = Pin::new(&mut body).poll_frame(&mut woken.context());
            waiting = polled.is_pending();
            polled
        });
        let mut bytes = match first.await {
            None => break,
            Some(frame) => gather(frame, &mut frames)?,
        };
        while !ended && frames.len() < GATHERED_FRAMES && bytes < GATHERED_BYTES {
            match Pin::new(&mut body).poll_frame(&mut woken.context()) {
                Poll::Pending => {
                    waiting = true;
                    break;
                }
                Poll::Ready(None) => ended = true,
                Poll::Ready(Some(frame)) => bytes += gather(frame, &mut frames)?,
            }
        }
        if bytes == 0 {
            frames.clear();
            continue;
        }
        if chunked {
            let mut size = ChunkSize::default();
            let mut slices = [IoSlice::new(&[]); GATHERED_FRAMES + 2];
            let count = chunked::frame(&mut size, &frames, &mut slices);
            write_all_vectored(writer, &mut slices[..count]).await?;
        } else {
            let mut slices = [IoSlice::new(&[]); GATHERED_FRAMES];
            for (slice, frame) in slices.iter_mut().zip(&frames) {
                *slice = IoSlice::new(frame);
            }
            write_all_vectored(writer, &mut slices[..frames.len()]).await?;
        }
        frames.clear();
    }
    if chunked {
        writer.write_all(LAST_CHUNK).await?;
    }
    Ok(())
}

/// Frames ready at once are gathered into one write up to about this many bytes (see [`relay_body`]); at
/// most [`GATHERED_FRAMES`] of them.
const GATHERED_BYTES: usize = 256 << 10;

/// Keeps a body's frame if it is data and not empty (trailers are not sent): the bytes it kept. An error
/// when the body failed.
fn gather(frame: Result<Frame<Bytes>, axum::Error>, frames: &mut Vec<Bytes>) -> io::Result<usize> {
    let Ok(frame) = frame else {
        return Err(io::Error::other("the response body failed"));
    };
    match frame.into_data() {
        Ok(data) if !data.is_empty() => {
            let len = data.len();
            frames.push(data);
            Ok(len)
        }
        _ => Ok(0),
    }
}

/// Writes every byte of `slices`, in as few writes as the socket takes.
async fn write_all_vectored(writer: &mut (impl AsyncWrite + Unpin), mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !slices.is_empty() {
        let written = writer.write_vectored(slices).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, written);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use axum::body::Body;
    use bytes::Bytes;
    use tokio::io::AsyncWrite;

    use std::time::Duration;

    use super::relay_body;
    use crate::http::transport::chunked::GATHERED_FRAMES;

    /// Records every write it is given, whole.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl AsyncWrite for Writes {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.get_mut().0.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let len = all.len();
            self.get_mut().0.push(all);
            Poll::Ready(Ok(len))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Frames ready together (a batch's pieces) go out in one write under one chunk header; empty frames
    /// are not sent; the last chunk ends the body.
    #[tokio::test]
    async fn frames_ready_at_once_are_one_write_and_one_chunk() {
        let frames = ["data: a\n\n", "", "data: bb\n\n", "data: c\n\n"].map(|f| Ok::<_, io::Error>(Bytes::from(f)));
        let body = Body::from_stream(futures::stream::iter(frames));
        let mut writes = Writes::default();
        relay_body(body, &mut writes, true).await.expect("relayed");
        let writes: Vec<String> = writes.0.iter().map(|w| String::from_utf8_lossy(w).into_owned()).collect();
        assert_eq!(writes, ["1c\r\ndata: a\n\ndata: bb\n\ndata: c\n\n\r\n", "0\r\n\r\n"]);
    }

    /// More frames ready at once than one write takes go out in several writes, without a wake in between:
    /// a write that stops at its limit leaves the body's frames to the next one, not to the next wake (an
    /// empty frame and a pass with nothing to send likewise). A body that waits between its frames has each
    /// one sent as it comes.
    #[tokio::test]
    async fn frames_past_one_writes_limit_go_out_without_a_wake() {
        let count = GATHERED_FRAMES * 3 + 1;
        let mut frames: Vec<Bytes> = (0..count).map(|n| Bytes::from(format!("data: {n}\n\n"))).collect();
        frames.insert(GATHERED_FRAMES, Bytes::new());
        let stream = futures::stream::iter(frames.into_iter().map(Ok::<_, io::Error>));
        let mut writes = Writes::default();
        let relayed = relay_body(Body::from_stream(stream), &mut writes, false);
        tokio::time::timeout(Duration::from_secs(5), relayed).await.expect("no wake needed").expect("relayed");
        let sent: String = writes.0.iter().map(|w| String::from_utf8_lossy(w)).collect();
        let expected: String = (0..count).map(|n| format!("data: {n}\n\n")).collect();
        assert_eq!(sent, expected);
        assert_eq!(writes.0.len(), count.div_ceil(GATHERED_FRAMES));

        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(1);
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver));
        let mut writes = Writes::default();
        let producer = async move {
            for n in 0..3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let _ = sender.send(Ok(Bytes::from(format!("data: {n}\n\n")))).await;
            }
        };
        let (relayed, ()) = tokio::join!(relay_body(body, &mut writes, false), producer);
        relayed.expect("relayed");
        assert_eq!(writes.0, [b"data: 0\n\n".to_vec(), b"data: 1\n\n".to_vec(), b"data: 2\n\n".to_vec()]);
    }
}
