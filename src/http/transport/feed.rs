//! [`Feeds`]: the writers that send a stream's new batches to its waiting event connections and one-stream
//! WebSocket connections ([`Reader`]), one task per stream and worker thread, instead of each connection's
//! own task.
//!
//! An event connection that has sent everything there was waits, nearly always, for the stream's next
//! message; when it comes, every waiting reader writes it. Woken one by one, each reader's task cost a wake,
//! a turn in the run queue, a watch registration, a poll of its body, its timers and its socket's
//! readiness, around the one `writev` it needs: about 1.6 µs of user time per delivery, where nginx (nchan)
//! spends about 1 (`docs/benchmarks-history.md`, session 23). So a connection that waits *parks* its relay here, and its
//! stream's feed writes what comes next straight to its socket (`try_write`, which never waits), the way an
//! nginx worker walks its subscribers. The connection's task sleeps meanwhile. The feed hands the relay back
//! when the socket did not take a whole write or the stream ended: what is left is the connection's to do
//! (wait for the socket, finish the body, close). The task also takes it back itself to send a ping, and
//! when the client goes away or the service stops.
//!
//! A stream has one feed per worker thread, and each connection keeps to one of them, so every core
//! writes. Readers parked on a feed keep up by definition, so a feed gathers as a keeping-up reader does
//! (`sse.rs`), where that pays: a change that comes less than [`BUSY`] after the end of its last pass is
//! written no sooner than [`GATHER`] after it, so tokens posted one at a time to many readers share writes.
//! Not for a stream's lone reader: a hold saves it nothing and delays each message (see `sse.rs`,
//! `shares_writes`).
//!
//! A WebSocket connection parks the same way (`ws.rs`): its rendition's frames are whole WebSocket frames,
//! written as they are ([`ws_relay::try_write`]) where an SSE reader's events go in chunks
//! ([`chunked::try_write`]); both kinds of reader of a stream share its feed, and so its one gathering
//! timer. A WebSocket connection keeps its pings and its client's frames to itself: it takes its relay back
//! for those.
//!
//! Nothing is missed between a relay's last look and its parking: the relay is looked at once more after it
//! is listed, and every change after that wakes the feed, whose pass looks at every listed relay.
//!
//! A pass lets the worker's other tasks run every [`DELIVERIES_PER_TURN`] deliveries, and a producer that
//! posts its next burst as soon as the last is answered would get a turn at each: several bursts appended
//! per pass over a thousand readers, each pass writing more than the last, the producer further and further
//! ahead of its readers and the gap showing as latency (`docs/benchmarks-history.md`, sessions 28 and 29).
//! So a producer is paced by the pass ([`Feeds::paced`]): once its stream has taken [`PASS_BACKLOG`]
//! messages since the pass under way began, an append's answer waits until that pass has ended. Only the
//! answer waits (the messages are in, and the readers later in the pass get them at once), and only for a
//! pass over the readers that keep up, which never waits itself: a reader whose socket is full is handed
//! back to its connection, off the pass, so a slow client holds back no producer. Token streaming appends
//! a message or a few per pass and is never held.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::chunked;
use super::sse::{BUSY, GATHER, Relay, shares_writes_of};
use super::ws_relay::{self, WsRelay};
use crate::hub::{Batch, Stream, Subscription};
use crate::sync::lock;

/// Deliveries a feed makes before it lets the worker's other tasks run (other streams, other connections).
/// (A pass of one turn, 1,024, lowered fan-out 1,000's latency but cost it CPU: `docs/benchmarks-history.md`,
/// session 28. A producer is paced by the pass instead: [`PASS_BACKLOG`].)
const DELIVERIES_PER_TURN: usize = 128;

/// Messages a stream takes while a pass of its feed is under way before an append's answer waits for that
/// pass to end ([`Feeds::paced`]). Token streaming, a message per POST, appends one to a dozen per pass
/// even over a thousand readers, and is never held; `./bench`'s bursts of 128 get two appends per pass.
/// (At 64, a burst a pass, fan-out 1,000 cost a fifth more CPU and delivered less: `docs/benchmarks-history.md`,
/// session 29.)
const PASS_BACKLOG: u64 = 256;

/// Every stream's feeds; see the module doc.
#[derive(Clone, Default)]
pub(crate) struct Feeds(Arc<Registry>);

impl std::fmt::Debug for Feeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feeds").field("feeds", &lock(&self.0.feeds).len()).finish()
    }
}

#[derive(Default)]
struct Registry {
    /// By the stream's address (a feed holds its stream, so the address is not reused while it runs) and
    /// the shard.
    feeds: Mutex<HashMap<(usize, usize), Arc<Feed>>>,
    /// The shard the next connection keeps to.
    next_shard: AtomicUsize,
}

/// One stream's writer for one shard of its connections.
struct Feed {
    key: (usize, usize),
    /// Its passes, for the producer to be paced by.
    passes: Passes,
    slots: Mutex<Vec<Arc<Slot>>>,
    /// Wakes the writer to see whether anyone is left.
    poke: Notify,
}

/// A parked relay and the socket the feed writes it to.
struct Slot {
    parking: Mutex<Parking>,
    tcp: Arc<TcpStream>,
    /// Told when the feed hands the relay back.
    handed_back: Notify,
    /// In its feed's list.
    listed: AtomicBool,
}

/// A waiting reader a feed writes for.
pub(crate) enum Reader {
    /// An SSE response's relay (`event_connection.rs`), written in chunks.
    Sse(Box<Relay>),
    /// A one-stream WebSocket connection's relay (`ws.rs`), written as rendered.
    WebSocket(Box<WsRelay>),
}

impl Reader {
    fn subscription(&self) -> &Subscription {
        match self {
            Reader::Sse(relay) => relay.subscription(),
            Reader::WebSocket(relay) => relay.subscription(),
        }
    }

    fn try_batch(&mut self, now: Instant) -> Option<Option<Batch>> {
        match self {
            Reader::Sse(relay) => relay.try_batch(now),
            Reader::WebSocket(relay) => relay.try_batch(now),
        }
    }

    /// Writes a batch's pieces as far as `tcp` takes them now: `Err` with the framed bytes it did not take.
    fn try_write(&self, tcp: &TcpStream, pieces: &[Bytes]) -> Result<(), Vec<Bytes>> {
        match self {
            Reader::Sse(_) => chunked::try_write(tcp, pieces),
            Reader::WebSocket(_) => ws_relay::try_write(tcp, pieces),
        }
    }

    /// When its ping is due: an SSE relay's; a WebSocket connection pings by itself.
    fn ping_due(&self) -> Option<Instant> {
        match self {
            Reader::Sse(relay) => relay.ping_due(),
            Reader::WebSocket(_) => None,
        }
    }
}

/// Where a feed is in its passes: a pass is under way while `ended` is behind `begun`.
struct Passes {
    /// Passes begun.
    begun: AtomicU64,
    /// The stream's last sequence when the last pass began.
    began_after: AtomicU64,
    /// Passes ended: the count begun when the last one ended.
    ended: watch::Sender<u64>,
}

struct Parking {
    /// The relay while the feed writes for it.
    relay: Option<Reader>,
    /// A chunk the feed began and the socket did not take all of: what is left of it, to go out first.
    unsent: Vec<Bytes>,
}

impl Feeds {
    /// The shard a new connection keeps to.
    pub(crate) fn shard(&self) -> usize {
        let workers = tokio::runtime::Handle::try_current().map_or(1, |runtime| runtime.metrics().num_workers());
        self.0.next_shard.fetch_add(1, Ordering::Relaxed) % workers.max(1)
    }

    /// Parks `relay`, which has sent everything there was (see [`Relay::is_waiting`], `WsRelay::is_waiting`),
    /// on its stream's feed for `shard`; the feed writes what comes next to `tcp`.
    pub(crate) fn park(&self, relay: Reader, tcp: &Arc<TcpStream>, shard: usize) -> Parked {
        let stream = Arc::clone(relay.subscription().stream());
        let changes = relay.subscription().changes();
        let key = (Arc::as_ptr(&stream) as usize, shard);
        let slot = Arc::new(Slot {
            parking: Mutex::new(Parking { relay: Some(relay), unsent: Vec::new() }),
            tcp: Arc::clone(tcp),
            handed_back: Notify::new(),
            listed: AtomicBool::new(true),
        });
        let feed = {
            let mut feeds = lock(&self.0.feeds);
            let feed = feeds.entry(key).or_insert_with(|| {
                let passes =
                    Passes { begun: AtomicU64::new(0), began_after: AtomicU64::new(0), ended: watch::channel(0).0 };
                let feed = Arc::new(Feed { key, passes, slots: Mutex::new(Vec::new()), poke: Notify::new() });
                tokio::spawn(write(Arc::clone(&feed), self.clone(), changes, stream));
                feed
            });
            lock(&feed.slots).push(Arc::clone(&slot));
            Arc::clone(feed)
        };
        // What came since the relay last looked: the feed may have been told of it already.
        slot.deliver(Instant::now());
        Parked { feed, slot }
    }

    /// Waits after an append to `stream` while the stream is ahead of its readers: when a pass of one of its
    /// feeds is under way and the stream took [`PASS_BACKLOG`] messages or more since that pass began, until
    /// that pass has ended (see the module doc). A pass never waits on a socket, so neither does this.
    pub(crate) async fn paced(&self, stream: &Arc<Stream>) {
        let workers = tokio::runtime::Handle::try_current().map_or(1, |runtime| runtime.metrics().num_workers());
        let at = Arc::as_ptr(stream) as usize;
        let last = stream.last_sequence();
        let behind: Vec<(u64, watch::Receiver<u64>)> = {
            let feeds = lock(&self.0.feeds);
            (0..workers.max(1))
                .filter_map(|shard| feeds.get(&(at, shard)))
                .filter_map(|feed| {
                    let passes = &feed.passes;
                    let begun = passes.begun.load(Ordering::Acquire);
                    let under_way = *passes.ended.borrow() < begun;
                    let ahead = last.saturating_sub(passes.began_after.load(Ordering::Acquire)) >= PASS_BACKLOG;
                    (under_way && ahead).then(|| (begun, passes.ended.subscribe()))
                })
                .collect()
        };
        for (begun, mut ended) in behind {
            // An error: the feed is gone, which it is only between passes.
            let _ = ended.wait_for(|&ended| ended >= begun).await;
        }
    }

    /// Drops `feed` when no one is parked on it: true then.
    fn retire(&self, feed: &Feed) -> bool {
        // The feed asks at each change of its stream, and nearly always has readers: it need not take the
        // lock every stream's connections park under to learn that. (One that empties its list after this
        // look pokes the feed, which asks again.)
        if !lock(&feed.slots).is_empty() {
            return false;
        }
        let mut feeds = lock(&self.0.feeds);
        if !lock(&feed.slots).is_empty() {
            return false;
        }
        feeds.remove(&feed.key);
        true
    }
}

/// A feed's task: a pass over its relays at each change of the stream, until no one is parked on it.
async fn write(feed: Arc<Feed>, feeds: Feeds, mut changes: watch::Receiver<u64>, stream: Arc<Stream>) {
    let mut last_pass: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            changed = changes.changed() => {
                if changed.is_err() {
                    // The stream is gone: its connections finish on their own.
                    for slot in std::mem::take(&mut *lock(&feed.slots)) {
                        slot.hand_back();
                    }
                    feeds.retire(&feed);
                    return;
                }
            }
            () = feed.poke.notified() => {
                if feeds.retire(&feed) {
                    return;
                }
                continue;
            }
        }
        if feeds.retire(&feed) {
            return;
        }
        if let Some(last) = last_pass
            && Instant::now() < last + BUSY
            && shares_writes_of(&stream)
        {
            tokio::time::sleep_until(last + GATHER).await;
        }
        let now = Instant::now();
        let passes = &feed.passes;
        passes.began_after.store(stream.last_sequence(), Ordering::Release);
        let begun = passes.begun.fetch_add(1, Ordering::AcqRel) + 1;
        feed.pass(now).await;
        passes.ended.send_replace(begun);
        // Its end: a pass over many readers lasts milliseconds, and a reader is written to again no sooner
        // than a gathering reader would be after its own write.
        last_pass = Some(Instant::now());
        // Everyone handed back (the stream ended): nothing is left to wake the feed for.
        if feeds.retire(&feed) {
            return;
        }
    }
}

impl Feed {
    /// Writes to every listed relay what it has not sent; drops from the list those handed back.
    async fn pass(&self, now: Instant) {
        let slots = lock(&self.slots).clone();
        let mut dropped = false;
        for (i, slot) in slots.iter().enumerate() {
            dropped |= !slot.deliver(now);
            if i % DELIVERIES_PER_TURN == DELIVERIES_PER_TURN - 1 {
                tokio::task::yield_now().await;
            }
        }
        if dropped {
            lock(&self.slots).retain(|slot| slot.listed.load(Ordering::Acquire));
        }
    }
}

impl Slot {
    /// Writes what the relay has now; false once the relay is no longer the feed's (handed back now or
    /// before, or taken back).
    fn deliver(&self, now: Instant) -> bool {
        let mut parking = lock(&self.parking);
        let Parking { relay, unsent } = &mut *parking;
        let Some(relay) = relay.as_mut() else { return false };
        loop {
            match relay.try_batch(now) {
                None => return true,
                Some(Some(batch)) => {
                    if let Err(rest) = relay.try_write(&self.tcp, batch.pieces()) {
                        *unsent = rest;
                        break;
                    }
                }
                // Ended: the connection finishes the body.
                Some(None) => break,
            }
        }
        drop(parking);
        self.hand_back();
        false
    }

    fn hand_back(&self) {
        self.listed.store(false, Ordering::Release);
        self.handed_back.notify_one();
    }
}

/// A connection's parked relay; taken back by [`Parked::take_back`], or when dropped (the relay with it).
pub(crate) struct Parked {
    feed: Arc<Feed>,
    slot: Arc<Slot>,
}

impl Parked {
    /// Completes when the feed hands the relay back.
    pub(crate) async fn handed_back(&self) {
        self.slot.handed_back.notified().await;
    }

    /// When the relay's next ping is due if nothing goes out before it.
    pub(crate) fn ping_due(&self) -> Option<Instant> {
        lock(&self.slot.parking).relay.as_ref().and_then(Reader::ping_due)
    }

    /// The relay, off the feed, with what the feed left unsent of a chunk (to go out first).
    pub(crate) fn take_back(&mut self) -> (Option<Reader>, Vec<Bytes>) {
        let taken = {
            let mut parking = lock(&self.slot.parking);
            (parking.relay.take(), std::mem::take(&mut parking.unsent))
        };
        if self.slot.listed.swap(false, Ordering::AcqRel) {
            let mut slots = lock(&self.feed.slots);
            slots.retain(|slot| !Arc::ptr_eq(slot, &self.slot));
            if slots.is_empty() {
                self.feed.poke.notify_one();
            }
        }
        taken
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        drop(self.take_back());
    }
}
