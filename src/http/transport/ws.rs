//! [`WebSocketConnection`]: the loop of a WebSocket connection, which relays its subscriptions' batches and
//! hands each text message the client sends to the endpoint (`api/ws.rs`), whose ops it knows nothing of.
//!
//! The connection owns its socket (`upgrade.rs`: the service answers the upgrade itself) and speaks the
//! protocol itself, as an SSE connection writes its events itself (`event_connection.rs`): the streams'
//! WebSocket renditions render each frame whole, header included, once per stream (a server's frames are
//! not masked, so they are the same bytes for every subscriber: `crate::render::ws`), and a batch's pieces
//! go out in one vectored write, nothing copied, checked or framed per subscriber; the client's frames are
//! read by `ws_reader.rs`. A connection holds no buffer while it waits. (Behind another server's IO, when an
//! application serves the router itself, the connection reads and writes through that IO instead, and does
//! not park: `upgrade.rs`.)
//!
//! A connection's subscriptions are cursors into their streams' shared renditions, polled together by the
//! connection's one task: it takes a batch only when the socket has taken the last one, so a connection
//! has at most one batch (up to the hub's batch limit) in flight, however many streams it watches and
//! however slowly it reads, and a reader that is behind costs the server no more than an SSE one. A
//! connection opened on one stream ([`WsRelay`]) that has sent everything there was and owes no reply is
//! parked on its stream's feed (`feed.rs`) as a waiting SSE reader is: the feed writes what comes next
//! straight to the socket, gathering for the stream's readers with one timer, and the task sleeps until
//! the feed hands the relay back, the client sends something, a ping is due or the service closes. A
//! connection that watches several streams gathers for a moment between batches ([`Gathering`], the rule
//! of an SSE reader in `sse.rs`), so tokens posted one at a time go out several to a write.
//!
//! Replies go out in the order of the frames they answer, each once it is ready ([`Reply`]): an op answered at
//! once is sent at once, and one whose answer waits (a `publish`, acknowledged once its message is kept) holds
//! back the replies behind it but not the reading of the next frames, so a client that pipelines publishes is
//! acknowledged as their commits land, many to a commit. At most [`PENDING`] replies wait: past that, frames
//! are left unread (in the kernel's buffers, then the client's) until one goes out.
//!
//! What cannot be read closes the connection with the code that fits (`ws_reader.rs`): 1003 for a binary
//! frame, 1009 for a message over the limit, 1007 for text that is not UTF-8, 1002 for a frame that breaks
//! the protocol; the reason is written for the client. A client's ping is answered with a pong, its close
//! with a close. A connection opened on one stream closes with 1000 when its stream ends, or with the
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
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, Sleep};
use tokio_stream::StreamMap;

use super::feed::{Feeds, Parked, Reader};
use super::lifetime::Lifetime;
use super::socket::Kept;
use super::sse::{BUSY, GATHER};
use super::upgrade::{UpgradedIo, UpgradedSocket};
use super::ws_reader::{CLOSE, ClientFrames, Incoming, PING, PONG, code};
use super::ws_relay;
pub(crate) use super::ws_relay::WsRelay;
use crate::http::edge::metrics::SubscriberMeter;
use crate::hub::{Batch, Subscription};
use crate::render::ws::frame;

/// A subscription's batches, each with whether it took everything its stream had (the reader keeps up, see
/// `Subscription::is_live`), then `None` once when it ends.
pub(crate) type Batches = Pin<Box<dyn futures::Stream<Item = Option<(Batch, bool)>> + Send>>;

/// The subscriptions a connection took with ops, by stream id.
type Subscriptions = StreamMap<String, Batches>;

/// The reply to a client frame, a whole text frame, sent once it resolves (and every earlier reply was sent).
pub(crate) type Reply = Pin<Box<dyn Future<Output = Bytes> + Send>>;

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

/// How long a connection that sent its close frame reads what its client still sends (its own close), so
/// that closing the socket with unread bytes does not reset it before the client read the close frame.
const LINGER: Duration = Duration::from_secs(2);

/// A ping: no payload.
const PING_FRAME: [u8; 2] = [0x80 | PING, 0];

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
    /// The drain is over, the client closed its side, or the socket failed: dropped, with nothing more sent.
    Gone,
    /// Closed with this close frame.
    Close(Bytes),
    /// Nothing arrived for the idle timeout: closed with this frame, or dropped if it cannot go out soon.
    Silent(Bytes),
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
    fn fired(&mut self) -> Result<(), Bytes> {
        let now = Instant::now();
        let Liveness { ping_interval, idle_timeout } = self.liveness;
        let silent = now.saturating_duration_since(self.heard);
        if silent >= idle_timeout {
            let reason = format!("nothing arrived for {} s: a client must answer pings", idle_timeout.as_secs_f64());
            return Err(close_frame(code::POLICY, &reason));
        }
        self.timer.as_mut().reset((now + ping_interval).min(self.heard + idle_timeout));
        Ok(())
    }
}

/// The gathering of a connection's op subscriptions (a one-stream connection's own stream is gathered for by
/// its feed while it is parked), as an SSE reader's (`sse.rs`, `Relay::next`): when its last batch took
/// everything its stream had, was one frame, and went out less than [`BUSY`] after the one before, the next
/// one is taken no sooner than [`GATHER`] after it, so tokens posted one at a time to many readers share a
/// write instead of costing a write per token per reader. A message after a pause and a reader catching up
/// are never held; replies, pings and the client's frames are not held either. Nor is a reader whose batches
/// already hold several frames (1,000 readers share the cores, so each already takes several tokens a turn):
/// unlike readers parked on a feed, which their stream's feed holds with one timer (`feed.rs`), each such
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

/// A connection's replies not sent yet, in order: made with the first (a queue allocates as it is made, and
/// most connections never get an op).
#[derive(Default)]
struct Replies(Option<Box<FuturesOrdered<Reply>>>);

impl Replies {
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |replies| replies.len())
    }

    fn push(&mut self, reply: Reply) {
        self.0.get_or_insert_default().push_back(reply);
    }

    /// The next reply once it is ready (waits forever with none).
    async fn next(&mut self) -> Option<Bytes> {
        match self.0.as_mut() {
            Some(replies) => replies.next().await,
            None => std::future::pending().await,
        }
    }

    /// The next reply if it is ready now.
    fn ready(&mut self) -> Option<Bytes> {
        self.0.as_mut()?.next().now_or_never().flatten()
    }
}

/// A WebSocket connection's loop: see the module doc.
pub(crate) struct WebSocketConnection {
    /// The socket, read and written by this one task (and, while the connection is parked, written by its
    /// stream's feed).
    io: UpgradedIo,
    /// Its place under the cap and in its client's share, given back when the connection is dropped.
    _kept: Option<Kept>,
    /// The client's frames, read and parsed.
    frames: ClientFrames,
    /// The stream a connection opened on one stream watches: it closes when that one ends.
    single: Option<Single>,
    /// The streams subscribed to with ops.
    subscriptions: Subscriptions,
    /// Replies not sent yet, in the order of the frames they answer.
    replies: Replies,
    lifetime: Arc<Lifetime>,
    /// Where a one-stream connection parks while it waits, and the shard it keeps to.
    feeds: Feeds,
    shard: usize,
    /// The service closes: client frames are no longer read, and what the streams still owe goes out.
    closing: bool,
    /// The pings, and what was last heard (none: no pings).
    pings: Option<Pings>,
    /// When the last batch of an op's subscription went out, and until when the next one waits to be
    /// gathered (see [`Gathering`]).
    gathering: Gathering,
    /// Set once the loop ended.
    end: Option<End>,
}

/// The stream of a connection opened on one stream, and its relay (out of it only while the feed has it).
struct Single {
    id: String,
    relay: Option<Box<WsRelay>>,
}

/// What woke a parked connection.
enum Woke {
    HandedBack,
    Gone,
    Closing,
    Readable(io::Result<()>),
    Ping,
}

impl WebSocketConnection {
    /// A connection on `socket`, watching `lifetime`, pinging its client as `liveness` says and taking client
    /// messages of at most `max_message` bytes; `single` when it was opened on one stream, which it watches
    /// from the start (and parks on that stream's feed in `feeds` while it waits).
    pub(crate) fn new(
        socket: UpgradedSocket,
        lifetime: Arc<Lifetime>,
        liveness: Liveness,
        max_message: usize,
        feeds: Feeds,
        single: Option<(String, WsRelay)>,
    ) -> Self {
        let UpgradedSocket { io, kept, read } = socket;
        let single = single.map(|(id, relay)| Single { id, relay: Some(Box::new(relay)) });
        let shard = feeds.shard();
        WebSocketConnection {
            io,
            _kept: kept,
            frames: ClientFrames::new(read, max_message),
            single,
            subscriptions: Subscriptions::new(),
            replies: Replies::default(),
            lifetime,
            feeds,
            shard,
            closing: false,
            pings: Pings::new(liveness),
            gathering: Gathering::default(),
            end: None,
        }
    }

    /// True when the connection watches `stream`.
    pub(crate) fn watches(&self, stream: &str) -> bool {
        self.subscriptions.contains_key(stream) || self.single.as_ref().is_some_and(|single| single.id == stream)
    }

    /// Watches `stream` with an op's subscription.
    pub(crate) fn watch(&mut self, stream: String, batches: Batches) {
        self.subscriptions.insert(stream, batches);
    }

    /// Stops watching `stream`: false when it did not.
    pub(crate) fn unwatch(&mut self, stream: &str) -> bool {
        if self.single.as_ref().is_some_and(|single| single.id == stream) {
            self.single = None;
            return true;
        }
        self.subscriptions.remove(stream).is_some()
    }

    /// The client's next text message, its subscriptions' batches and the replies that are ready sent
    /// meanwhile; `None` once the connection is to close ([`WebSocketConnection::close`] then closes it).
    pub(crate) async fn next_text(&mut self) -> Option<String> {
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
    async fn run(&mut self, read: bool) -> Option<String> {
        if self.end.is_some() {
            return None;
        }
        let end = loop {
            if self.send_ready().await.is_err() {
                break End::Gone;
            }
            if !read && self.replies.is_empty() {
                return None;
            }
            if self.closing && self.single.is_none() && self.subscriptions.is_empty() && self.replies.is_empty() {
                break End::Close(close_frame(code::AWAY, "the server is shutting down"));
            }
            let reading = read && !self.closing && self.replies.len() < PENDING;
            if reading {
                match self.frames.next() {
                    Err(refusal) => break End::Close(close_frame(refusal.code, &refusal.reason)),
                    Ok(Some(incoming)) => match self.incoming(incoming).await {
                        Ok(Some(text)) => return Some(text),
                        Ok(None) => continue,
                        Err(end) => break end,
                    },
                    Ok(None) => {}
                }
            }
            if self.parks() {
                match self.parked(reading).await {
                    Some(end) => break end,
                    None => continue,
                }
            }
            // Boxed, and so held only while it runs: a waiting connection is parked (above) nearly always, and
            // holds no room for this turn's futures.
            if let Some(end) = Box::pin(self.turn(reading)).await {
                break end;
            }
        };
        self.end = Some(end);
        None
    }

    /// One turn of the loop: whatever comes first of the lifetime's phases, the client's bytes, a reply, a
    /// ping, a batch; how the connection ends, if it does.
    async fn turn(&mut self, reading: bool) -> Option<End> {
        let held = self.gathering.held();
        let single = self.single.as_ref().is_some_and(|single| single.relay.is_some());
        tokio::select! {
            () = self.lifetime.gone.cancelled() => Some(End::Gone),
            () = self.lifetime.closing.cancelled(), if !self.closing => {
                self.closing = true;
                None
            }
            read = read_from(&mut self.io, &mut self.frames), if reading => self.read_some(read),
            Some(reply) = self.replies.next(), if !self.replies.is_empty() => {
                write(&mut self.io, &[reply]).await.err().map(|_| End::Gone)
            }
            () = Self::ping_due(&mut self.pings), if self.pings.is_some() && !self.closing => self.pinged().await,
            batch = Self::single_next(&mut self.single), if single => match batch {
                Some(batch) => write(&mut self.io, batch.pieces()).await.err().map(|_| End::Gone),
                None => Some(self.single_ended()),
            },
            () = Gathering::wait(held), if held.is_some() => {
                self.gathering.until = None;
                None
            }
            Some((stream, item)) = self.subscriptions.next(), if !self.subscriptions.is_empty() && held.is_none() => {
                self.relayed(&stream, item).await.err().map(|_| End::Gone)
            }
        }
    }

    /// What the client sent: a text message for the endpoint, nothing more to do (a ping answered, a pong),
    /// or how the connection ends (the client's close answered with its code).
    async fn incoming(&mut self, incoming: Incoming) -> Result<Option<String>, End> {
        match incoming {
            Incoming::Text(text) => Ok(Some(text)),
            Incoming::Ping(payload) => match write(&mut self.io, &[frame(PONG, &payload)]).await {
                Ok(()) => Ok(None),
                Err(_) => Err(End::Gone),
            },
            Incoming::Pong => Ok(None),
            Incoming::Close(payload) => Err(End::Close(frame(CLOSE, payload.get(..2).unwrap_or_default()))),
        }
    }

    /// What a read from the client gave: how the connection ends if the client went.
    fn read_some(&mut self, read: io::Result<usize>) -> Option<End> {
        match read {
            Ok(0) => Some(End::Gone),
            Ok(_) => {
                if let Some(pings) = &mut self.pings {
                    pings.heard = Instant::now();
                }
                None
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => None,
            Err(_) => Some(End::Gone),
        }
    }

    /// True when the connection is to park on its stream's feed: on a socket of its own, opened on one
    /// stream, it has sent everything there was, owes no reply, and watches nothing else.
    fn parks(&self) -> bool {
        let waiting =
            self.single.as_ref().and_then(|single| single.relay.as_ref()).is_some_and(|relay| relay.is_waiting());
        waiting && matches!(self.io, UpgradedIo::Tcp(_)) && self.replies.is_empty() && self.subscriptions.is_empty()
    }

    /// Parks the relay on its stream's feed until the feed hands it back or something else wakes the
    /// connection; takes it back then, writes what the feed left unsent, and does what woke it. How the
    /// connection ends, if it does.
    async fn parked(&mut self, reading: bool) -> Option<End> {
        let UpgradedIo::Tcp(tcp) = &self.io else { return None };
        let tcp = Arc::clone(tcp);
        let relay = self.single.as_mut().and_then(|single| single.relay.take())?;
        let mut parked: Parked = self.feeds.park(Reader::WebSocket(relay), &tcp, self.shard);
        let woke = tokio::select! {
            () = parked.handed_back() => Woke::HandedBack,
            () = self.lifetime.gone.cancelled() => Woke::Gone,
            () = self.lifetime.closing.cancelled(), if !self.closing => Woke::Closing,
            ready = tcp.readable(), if reading => Woke::Readable(ready),
            () = Self::ping_due(&mut self.pings), if self.pings.is_some() && !self.closing => Woke::Ping,
        };
        let (relay, unsent) = parked.take_back();
        drop(parked);
        let relay = match relay {
            Some(Reader::WebSocket(relay)) => relay,
            // A feed gives back what it was given; anything else is a connection that cannot go on.
            _ => return Some(End::Gone),
        };
        if let Some(single) = self.single.as_mut() {
            single.relay = Some(relay);
        }
        if !unsent.is_empty() && write(&mut self.io, &unsent).await.is_err() {
            return Some(End::Gone);
        }
        match woke {
            Woke::HandedBack => None,
            Woke::Gone => Some(End::Gone),
            Woke::Closing => {
                self.closing = true;
                None
            }
            Woke::Readable(ready) => {
                let read = ready.and_then(|()| self.frames.read(&tcp));
                self.read_some(read)
            }
            Woke::Ping => self.pinged().await,
        }
    }

    /// The next batch of the one stream (waits forever without one).
    async fn single_next(single: &mut Option<Single>) -> Option<Batch> {
        match single.as_mut().and_then(|single| single.relay.as_mut()) {
            Some(relay) => relay.next().await,
            None => std::future::pending().await,
        }
    }

    /// The one stream ended: the connection closes with why.
    fn single_ended(&mut self) -> End {
        let lagged = self.single.take().and_then(|single| single.relay).is_some_and(|relay| relay.lagged);
        End::Close(if lagged {
            close_frame(code::NORMAL, "lagged")
        } else if self.lifetime.draining.is_cancelled() {
            close_frame(code::AWAY, "the server is shutting down")
        } else {
            close_frame(code::NORMAL, "stream ended")
        })
    }

    /// Sends the replies at the head of the queue that are ready, in one write.
    async fn send_ready(&mut self) -> io::Result<()> {
        let mut ready = Vec::new();
        while let Some(reply) = self.replies.ready() {
            ready.push(reply);
        }
        if ready.is_empty() { Ok(()) } else { write(&mut self.io, &ready).await }
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
            Ok(()) => write(&mut self.io, &[Bytes::from_static(&PING_FRAME)]).await.err().map(|_| End::Gone),
        }
    }

    /// Sends an op's subscription's batch, or notes its end.
    async fn relayed(&mut self, stream: &str, item: Option<(Batch, bool)>) -> io::Result<()> {
        match item {
            Some((batch, live)) => {
                let sent = write(&mut self.io, batch.pieces()).await;
                // Only a batch of one frame is worth gathering after: see `Gathering`.
                self.gathering.wrote(live && batch.frame_count() == 1);
                sent
            }
            None => {
                self.subscriptions.remove(stream);
                Ok(())
            }
        }
    }

    /// Queues the reply to a text frame: it goes out once it is ready and every earlier reply has (see the
    /// module doc).
    pub(crate) fn reply(&mut self, reply: Reply) {
        self.replies.push(reply);
    }

    /// Closes the connection as its loop ended: the close frame, if any, then the socket (unless the drain
    /// ends first).
    pub(crate) async fn close(self) {
        let WebSocketConnection { mut io, lifetime, end, _kept, .. } = self;
        let (close, within) = match end {
            Some(End::Close(frame)) => (frame, None),
            Some(End::Silent(frame)) => (frame, Some(IDLE_GOODBYE)),
            Some(End::Gone) | None => return,
        };
        let goodbye = async {
            if write(&mut io, &[close]).await.is_ok() {
                let _ = tokio::time::timeout(LINGER, shut_and_drain(&mut io)).await;
            }
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

/// Waits for the client's next bytes and reads them into `frames`: the bytes read (0: the client closed its
/// side).
async fn read_from(io: &mut UpgradedIo, frames: &mut ClientFrames) -> io::Result<usize> {
    match io {
        UpgradedIo::Tcp(tcp) => loop {
            tcp.readable().await?;
            match frames.read(tcp) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                read => return read,
            }
        },
        UpgradedIo::Other(other) => {
            // Small: this future is in a waiting connection's turn.
            let mut chunk = [0u8; 512];
            let read = other.read(&mut chunk).await?;
            frames.take(&chunk[..read]);
            Ok(read)
        }
    }
}

/// Writes every byte of `pieces`: to the socket in one vectored write (`ws_relay.rs`), or through another
/// server's IO.
async fn write(io: &mut UpgradedIo, pieces: &[Bytes]) -> io::Result<()> {
    match io {
        UpgradedIo::Tcp(tcp) => ws_relay::write(tcp, pieces).await,
        UpgradedIo::Other(other) => {
            for piece in pieces {
                other.write_all(piece).await?;
            }
            other.flush().await
        }
    }
}

/// Closes the connection's side, then reads and drops what the client sends until it closes its own.
async fn shut_and_drain(io: &mut UpgradedIo) {
    let mut scratch = [0u8; 256];
    match io {
        UpgradedIo::Tcp(tcp) => {
            let _ = socket2::SockRef::from(&**tcp).shutdown(std::net::Shutdown::Write);
            while tcp.readable().await.is_ok() {
                match tcp.try_read(&mut scratch) {
                    Ok(1..) => {}
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                    Ok(0) | Err(_) => return,
                }
            }
        }
        UpgradedIo::Other(other) => {
            let _ = other.shutdown().await;
            while let Ok(1..) = other.read(&mut scratch).await {}
        }
    }
}

/// A close frame with `code` and `reason` (cut to fit: a close frame's payload is at most 125 bytes).
fn close_frame(code: u16, reason: &str) -> Bytes {
    let mut end = reason.len().min(120);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(&reason.as_bytes()[..end]);
    frame(CLOSE, &payload)
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
