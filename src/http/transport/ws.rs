//! [`WebSocketConnection`]: the loop of a WebSocket connection, which relays its subscriptions' batches and
//! hands each text frame the client sends to the endpoint (`api/ws.rs`), whose ops it knows nothing of.
//!
//! A connection's subscriptions ([`Subscriptions`]) are cursors into their streams' shared renditions,
//! polled together by the connection's one task: it takes a batch only when the socket has taken the last
//! one, so a connection has at most one batch (up to the hub's batch limit) in flight, however many streams
//! it watches and however slowly it reads, and a reader that is behind costs the server no more than an SSE
//! one. The bytes it writes were encoded once per stream for every WebSocket subscriber of that format;
//! nothing is parsed or re-wrapped here. A connection that keeps up with a fast producer gathers for a moment
//! between batches ([`Gathering`], the rule of an SSE reader in `sse.rs`), so tokens posted one at a time go
//! out several to a write.
//!
//! Replies go out in the order of the frames they answer, each once it is ready ([`Reply`]): an op answered at
//! once is sent at once, and one whose answer waits (a `publish`, acknowledged once its message is kept) holds
//! back the replies behind it but not the reading of the next frames, so a client that pipelines publishes is
//! acknowledged as their commits land, many to a commit. At most [`PENDING`] replies wait: past that, frames
//! are left unread (in the kernel's buffers, then the client's) until one goes out.
//!
//! What cannot be read closes the connection with the code that fits: 1003 for a binary frame, 1009 for a
//! message over the limit, 1007 for text that is not UTF-8, 1002 for a broken frame; the reason is written
//! for the client. A connection opened on one stream closes with 1000 when its stream ends, or with the
//! reason `lagged` when its history is gone. On shutdown a connection stops reading, sends what its streams
//! still owe (their `done` included) and the replies it owes, and closes with 1001; once the drain is over it
//! is dropped.
//!
//! A connection is pinged every `--ws-ping-interval` ([`Liveness`]); one from which nothing arrived (no pong,
//! no frame of any kind) for `--ws-idle-timeout` is closed with 1008 (policy violation: a client must answer
//! pings) and its reason, and dropped if even that close frame cannot go out within a few seconds. So a
//! client that went away without a word, or one that holds a connection open and answers nothing, gives its
//! place back (its client's share of connections, its key's slot: `edge/admission.rs`, `edge/auth.rs`).
//! The timer is checked between batches and frames: while a send waits for a client that does not read, the
//! connection waits with it (as an SSE one does), within its client's share.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, close_code};
use futures::stream::FuturesOrdered;
use futures::{FutureExt, SinkExt, StreamExt};
use tokio::time::{Instant, Sleep};
use tokio_stream::StreamMap;

use super::lifetime::Lifetime;
use super::sse::{BUSY, GATHER};
use crate::http::edge::metrics::SubscriberMeter;
use crate::hub::{Batch, Subscription};

/// A subscription's batches, each with whether it took everything its stream had (the reader keeps up, see
/// `Subscription::is_live`), then `None` once when it ends.
pub(crate) type Batches = Pin<Box<dyn futures::Stream<Item = Option<(Batch, bool)>> + Send>>;

/// A connection's subscriptions, by stream id.
pub(crate) type Subscriptions = StreamMap<String, Batches>;

/// The reply to a client frame, sent once it resolves (and every earlier reply was sent).
pub(crate) type Reply = Pin<Box<dyn Future<Output = Message> + Send>>;

/// The most replies a connection holds back waiting for the ones before them: frames are read again once one
/// goes out. Each is small (a `publish` acknowledgement waiting for its commit), and a client that pipelines
/// more than this still has its publishes committed many to a commit.
const PENDING: usize = 1024;

/// A subscription as the connection polls it, counted in the metrics while it is polled.
pub(crate) fn batches(subscription: Subscription, meter: SubscriberMeter) -> Batches {
    let batches = futures::stream::unfold((subscription, meter), |(mut subscription, mut meter)| async move {
        let batch = subscription.next().await?;
        meter.delivered(&batch);
        let live = subscription.is_live();
        Some((Some((batch, live)), (subscription, meter)))
    });
    Box::pin(batches.chain(futures::stream::once(async { None })))
}

/// How long the close frame of a connection closed for silence may take to go out before it is dropped.
const IDLE_GOODBYE: Duration = Duration::from_secs(5);

/// How a connection checks that its client is still there (see the module doc).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Liveness {
    /// A ping goes out this long after the last one (zero: never, and no idle timeout either).
    pub(crate) ping_interval: Duration,
    /// The connection closes once nothing arrived from the client for this long.
    pub(crate) idle_timeout: Duration,
}

/// How a connection's loop ended.
enum End {
    /// The drain is over: dropped, with nothing more sent.
    Gone,
    /// Closed, with this close frame first (none: the client closed, or the socket failed).
    Close(Option<CloseFrame>),
    /// Nothing arrived for the idle timeout: closed with this frame, or dropped if it cannot go out soon.
    Silent(CloseFrame),
}

/// A connection's pings and what it last heard from its client.
struct Pings {
    liveness: Liveness,
    /// When something last arrived from the client.
    heard: Instant,
    /// Fires when the next ping is due, or the idle timeout is up if that comes first.
    timer: Pin<Box<Sleep>>,
}

impl Pings {
    /// `None` when `liveness` sends no pings.
    fn new(liveness: Liveness) -> Option<Pings> {
        let now = Instant::now();
        let first = now + liveness.ping_interval.min(liveness.idle_timeout);
        (!liveness.ping_interval.is_zero()).then(|| Pings {
            liveness,
            heard: now,
            timer: Box::pin(tokio::time::sleep_until(first)),
        })
    }

    /// The timer fired: the close frame when the client has been silent for the idle timeout; otherwise
    /// the timer is set again, and a ping is to go out.
    fn fired(&mut self) -> Result<(), CloseFrame> {
        let now = Instant::now();
        let Liveness { ping_interval, idle_timeout } = self.liveness;
        let silent = now.saturating_duration_since(self.heard);
        if silent >= idle_timeout {
            let reason = format!("nothing arrived for {} s: a client must answer pings", idle_timeout.as_secs_f64());
            return Err(close_frame(close_code::POLICY, &reason));
        }
        self.timer.as_mut().reset((now + ping_interval).min(self.heard + idle_timeout));
        Ok(())
    }
}

/// A connection's gathering, as an SSE reader's (`sse.rs`, `Relay::next`): when its last batch took
/// everything its stream had, was one frame, and went out less than [`BUSY`] after the one before, the next
/// one is taken no sooner than [`GATHER`] after it, so tokens posted one at a time to many readers share a
/// write instead of costing a write per token per reader. A message after a pause and a reader catching up
/// are never held; replies, pings and the client's frames are not held either. Nor is a reader whose batches
/// already hold several frames (1,000 readers share the cores, so each already takes several tokens a turn):
/// unlike SSE's parked readers, which their stream's feed holds with one timer (`feed.rs`), each WebSocket
/// connection holds with its own, and at 1,000 readers of one token per POST those timers cost more than the
/// writes they saved (2.3× the server CPU per delivery, `docs/benchmarks-history.md`, session 28).
#[derive(Default)]
struct Gathering {
    /// When the last batch went out.
    wrote: Option<Instant>,
    /// The next batch is not taken before this.
    until: Option<Instant>,
}

impl Gathering {
    /// A batch went out; `live`: it took everything its stream had and was worth gathering after.
    fn wrote(&mut self, live: bool) {
        self.wrote_at(live, Instant::now());
    }

    /// A batch went out at `now`.
    fn wrote_at(&mut self, live: bool, now: Instant) {
        let soon = self.wrote.is_some_and(|before| now < before + BUSY);
        self.until = (soon && live).then_some(now + GATHER);
        self.wrote = Some(now);
    }

    /// Until when the next batch is held, if it is.
    fn held(&self) -> Option<Instant> {
        self.held_at(Instant::now())
    }

    /// The same at `now`.
    fn held_at(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|until| now < *until)
    }

    /// Waits until `until` (forever without one).
    async fn wait(until: Option<Instant>) {
        match until {
            Some(until) => tokio::time::sleep_until(until).await,
            None => std::future::pending().await,
        }
    }
}

/// A WebSocket connection's loop: see the module doc.
pub(crate) struct WebSocketConnection {
    /// The socket, read and written by this one task: not split, so a frame goes out without the lock a
    /// split's two halves share (`SplitSink`'s `BiLock`, taken twice per message). Boxed, as the split kept
    /// it behind its `Arc`: inline, the futures that hold a connection each reserved room for it, and an idle
    /// connection cost 0.56 KiB more (`docs/benchmarks-history.md`, session 28).
    socket: Box<WebSocket>,
    subscriptions: Subscriptions,
    /// Replies not sent yet, in the order of the frames they answer.
    replies: FuturesOrdered<Reply>,
    lifetime: Arc<Lifetime>,
    /// The stream a connection opened on one stream watches: it closes when that one ends.
    single: Option<String>,
    /// A batch said its subscriber lagged.
    lagged: bool,
    /// The service closes: client frames are no longer read, and what the streams still owe goes out.
    closing: bool,
    /// The pings, and what was last heard (none: no pings).
    pings: Option<Pings>,
    /// When the last batch went out, and until when the next one waits to be gathered (see [`Gathering`]).
    gathering: Gathering,
    /// Set once the loop ended.
    end: Option<End>,
}

impl WebSocketConnection {
    /// A connection on `socket`, watching `lifetime` and pinging its client as `liveness` says; `single`
    /// when it was opened on one stream, which it watches from the start.
    pub(crate) fn new(
        socket: WebSocket,
        lifetime: Arc<Lifetime>,
        liveness: Liveness,
        single: Option<(String, Batches)>,
    ) -> Self {
        let mut subscriptions = Subscriptions::new();
        let single = single.map(|(id, batches)| {
            subscriptions.insert(id.clone(), batches);
            id
        });
        let replies = FuturesOrdered::new();
        let pings = Pings::new(liveness);
        WebSocketConnection {
            socket: Box::new(socket),
            subscriptions,
            replies,
            lifetime,
            single,
            lagged: false,
            closing: false,
            pings,
            gathering: Gathering::default(),
            end: None,
        }
    }

    /// The connection's subscriptions, for an op to change.
    pub(crate) fn subscriptions(&mut self) -> &mut Subscriptions {
        &mut self.subscriptions
    }

    /// The client's next text frame, its subscriptions' batches and the replies that are ready sent meanwhile;
    /// `None` once the connection is to close ([`WebSocketConnection::close`] then closes it).
    pub(crate) async fn next_text(&mut self) -> Option<Utf8Bytes> {
        self.run(true).await
    }

    /// Sends every reply queued so far, as each is ready, relaying the subscriptions meanwhile but reading no
    /// frame: what an op that subscribes waits for first, so that its reply comes after theirs and before
    /// anything its subscription sends. At once when nothing waits.
    pub(crate) async fn settle(&mut self) {
        self.run(false).await;
    }

    /// The loop of [`WebSocketConnection::next_text`] (`read`) and [`WebSocketConnection::settle`] (not
    /// `read`: it returns once no reply waits).
    async fn run(&mut self, read: bool) -> Option<Utf8Bytes> {
        if self.end.is_some() {
            return None;
        }
        let end = loop {
            if self.send_ready().await.is_err() {
                break End::Close(None);
            }
            if !read && self.replies.is_empty() {
                return None;
            }
            if self.closing && self.subscriptions.is_empty() && self.replies.is_empty() {
                break End::Close(Some(close_frame(close_code::AWAY, "the server is shutting down")));
            }
            let reading = read && !self.closing && self.replies.len() < PENDING;
            let held = self.gathering.held();
            tokio::select! {
                () = self.lifetime.gone.cancelled() => break End::Gone,
                () = self.lifetime.closing.cancelled(), if !self.closing => self.closing = true,
                incoming = self.socket.next(), if reading => match incoming {
                    None => break End::Close(None),
                    Some(Err(error)) => break End::Close(read_failed(&error)),
                    Some(Ok(message)) => {
                        if let Some(pings) = &mut self.pings {
                            pings.heard = Instant::now();
                        }
                        match message {
                            Message::Close(_) => break End::Close(None),
                            Message::Text(text) => return Some(text),
                            Message::Binary(_) => {
                                let reason = "binary frames are not supported; send JSON text";
                                break End::Close(Some(close_frame(close_code::UNSUPPORTED, reason)));
                            }
                            Message::Ping(_) | Message::Pong(_) => {}
                        }
                    }
                },
                Some(reply) = self.replies.next(), if !self.replies.is_empty() => {
                    if send(&mut self.socket, [reply]).await.is_err() {
                        break End::Close(None);
                    }
                }
                () = Self::ping_due(&mut self.pings), if self.pings.is_some() && !self.closing => {
                    if let Some(end) = self.pinged().await {
                        break end;
                    }
                }
                () = Gathering::wait(held), if held.is_some() => self.gathering.until = None,
                Some((stream, item)) = self.subscriptions.next(), if !self.subscriptions.is_empty() && held.is_none() => {
                    if let Some(end) = self.relayed(&stream, item).await {
                        break end;
                    }
                }
            }
        };
        self.end = Some(end);
        None
    }

    /// Sends the replies at the head of the queue that are ready, in one write.
    async fn send_ready(&mut self) -> Result<(), axum::Error> {
        let mut ready = Vec::new();
        while let Some(Some(reply)) = self.replies.next().now_or_never() {
            ready.push(reply);
        }
        if ready.is_empty() { Ok(()) } else { send(&mut self.socket, ready).await }
    }

    /// Waits for the ping timer (forever without pings).
    async fn ping_due(pings: &mut Option<Pings>) {
        match pings {
            Some(pings) => pings.timer.as_mut().await,
            None => std::future::pending().await,
        }
    }

    /// The ping timer fired: a ping sent, or how the connection ends (silent for too long, or the socket
    /// failed).
    async fn pinged(&mut self) -> Option<End> {
        let pings = self.pings.as_mut()?;
        match pings.fired() {
            Err(frame) => Some(End::Silent(frame)),
            Ok(()) => {
                let ping = Message::Ping(axum::body::Bytes::new());
                send(&mut self.socket, [ping]).await.err().map(|_| End::Close(None))
            }
        }
    }

    /// Sends a subscription's batch, or notes its end: how the connection ends, if it does.
    async fn relayed(&mut self, stream: &str, item: Option<(Batch, bool)>) -> Option<End> {
        match item {
            Some((batch, live)) => {
                self.lagged |= batch.lagged;
                let frames = batch.frames();
                // Only a batch of one frame is worth gathering after: see `Gathering`.
                let lone = frames.len() == 1;
                let sent = send(&mut self.socket, frames.into_iter().filter_map(text)).await;
                self.gathering.wrote(live && lone);
                sent.err().map(|_| End::Close(None))
            }
            None => {
                self.subscriptions.remove(stream);
                (self.single.as_deref() == Some(stream)).then(|| {
                    End::Close(Some(if self.lagged {
                        close_frame(close_code::NORMAL, "lagged")
                    } else if self.lifetime.draining.is_cancelled() {
                        close_frame(close_code::AWAY, "the server is shutting down")
                    } else {
                        close_frame(close_code::NORMAL, "stream ended")
                    }))
                })
            }
        }
    }

    /// Queues the reply to a text frame: it goes out once it is ready and every earlier reply has (see the
    /// module doc).
    pub(crate) fn reply(&mut self, reply: Reply) {
        self.replies.push_back(reply);
    }

    /// Closes the connection as its loop ended: the close frame, if any, then the socket (unless the drain
    /// ends first).
    pub(crate) async fn close(self) {
        let WebSocketConnection { mut socket, lifetime, end, .. } = self;
        let (close, within) = match end {
            Some(End::Gone) => return,
            Some(End::Close(frame)) => (frame, None),
            Some(End::Silent(frame)) => (Some(frame), Some(IDLE_GOODBYE)),
            None => (None, None),
        };
        let goodbye = async {
            if let Some(frame) = close {
                let _ = socket.send(Message::Close(Some(frame))).await;
            }
            let _ = socket.close().await;
        };
        let bound = async {
            match within {
                Some(within) => tokio::time::sleep(within).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = goodbye => {}
            () = lifetime.gone.cancelled() => {}
            () = bound => {}
        }
    }
}

/// The close frame for a client frame that could not be read, by its cause; `None` when the connection
/// itself failed (nothing can be sent on it).
fn read_failed(error: &axum::Error) -> Option<CloseFrame> {
    use tungstenite::error::{CapacityError, Error as WsError};
    tracing::debug!(%error, "websocket read failed");
    let cause = std::error::Error::source(error).and_then(|e| e.downcast_ref::<WsError>());
    match cause {
        Some(WsError::Capacity(CapacityError::MessageTooLong { max_size, .. })) => {
            Some(close_frame(close_code::SIZE, &format!("a message is over the limit of {max_size} bytes")))
        }
        Some(WsError::Capacity(_)) => Some(close_frame(close_code::SIZE, "a frame is over the size limit")),
        Some(WsError::Utf8(_)) => Some(close_frame(close_code::INVALID, "a text frame is not valid UTF-8")),
        Some(WsError::Protocol(_)) => {
            Some(close_frame(close_code::PROTOCOL, "the frame breaks the WebSocket protocol"))
        }
        _ => None,
    }
}

/// A batch's frame as a text message: each frame is one JSON object (see `crate::render`).
fn text(frame: axum::body::Bytes) -> Option<Message> {
    Utf8Bytes::try_from(frame).ok().map(Message::Text)
}

fn close_frame(code: u16, reason: &str) -> CloseFrame {
    // A close reason is at most 123 bytes.
    let mut end = reason.len().min(120);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame { code, reason: Utf8Bytes::from(&reason[..end]) }
}

/// Writes `messages` through the socket's write buffer (a write each time it fills), then flushes it.
async fn send(socket: &mut WebSocket, messages: impl IntoIterator<Item = Message>) -> Result<(), axum::Error> {
    for message in messages {
        socket.feed(message).await?;
    }
    socket.flush().await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{BUSY, GATHER, Gathering};

    /// A reader that keeps up (its batches took everything) and whose batches come less than `BUSY` apart
    /// holds the next one for `GATHER`; one catching up, or the first batch after a pause, is never held.
    #[test]
    fn a_reader_that_keeps_up_with_a_fast_producer_gathers() {
        let start = Instant::now();
        let at = |micros: u64| start + Duration::from_micros(micros);
        let mut gathering = Gathering::default();
        gathering.wrote_at(true, at(0));
        assert_eq!(gathering.held_at(at(1)), None, "the first batch holds nothing");
        let soon = (BUSY / 4).as_micros() as u64;
        gathering.wrote_at(true, at(soon));
        assert_eq!(gathering.held_at(at(soon + 1)), Some(at(soon) + GATHER), "a second batch soon after holds");
        assert_eq!(gathering.held_at(at(soon) + GATHER), None, "the hold ends after GATHER");

        let later = soon + (GATHER + BUSY / 4).as_micros() as u64;
        gathering.wrote_at(false, at(later));
        assert_eq!(gathering.held_at(at(later + 1)), None, "a reader catching up is not held");

        let paused = later + BUSY.as_micros() as u64 + 1000;
        gathering.wrote_at(true, at(paused));
        assert_eq!(gathering.held_at(at(paused + 1)), None, "a batch after a pause is not held");
    }
}
