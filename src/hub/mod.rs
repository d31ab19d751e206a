//! The hub: streams, fan-out, resume and retention.
//!
//! - [`Hub`] (this file): the streams by id, the limits, and retention: an ended stream stays readable
//!   (subscribe, resume, status) for the retention time, by the hub's clock, then is evicted.
//! - [`HubConfig`] and [`Limits`] (`config.rs`): what it may hold and how it behaves; [`HubError`]
//!   (`error.rs`): why it refused a stream; `HubState` (`state.rs`): what the hub and its streams share (the
//!   config, the byte count, and `Held` (`held.rs`): what each client holds, open or ended, and the ended
//!   streams in the order of their eviction).
//! - [`Stream`] (`stream/`): what a stream does for its producer: validate, stamp sequences and ids, add
//!   the lifecycle events (`lifecycle.rs`), reduce deltas, check limits, record the outcome, answer a repeat
//!   of a conditional append ([`Condition`], `stream/receipts.rs`); what it counts against the hub; and what
//!   it does for its readers. One file per role (see its module doc).
//! - [`Log`] (`log.rs`): what its readers need: entries after a sequence, a way to wait for more, the end.
//!   The in-memory log (`MemoryLog`) is its first implementation.
//! - [`Render`] (`render.rs`): how a subscriber wants a stream rendered, given by the caller; the hub keeps
//!   one rendition per render key (`rendition.rs`), rendered once and shared by every subscriber of it.
//! - [`Subscription`] (`subscription.rs`): a subscriber's cursor into a rendition.
//! - the injectable [`Clock`] and [`Ids`] (`clock.rs`).
//!
//! # Why the seam sits where it does
//!
//! Everything a stream must decide alone and at once (the next sequence, whether a delta applies, whether
//! a limit is passed, how it ended) stays on the producer side, behind one mutex, where it is cheap and
//! exact. Everything after that is a reader of stamped entries: renditions, subscriptions, snapshots of
//! the history, a later store's writer. Putting the seam at the stamped entry means a durable store or a
//! replicated log only has to keep and hand out entries in order; it never re-runs the reducer, and no
//! adapter or transport changes with it. The hub knows no wire format: formats come in as [`Render`]s,
//! and the stream facts a format derives its constants from are neutral ([`StreamInfo`]).
//!
//! # Memory
//!
//! Every byte a stream holds is counted against the hub's limit ([`Limits::hub_bytes`], 1 GiB by default):
//! its log entries (as JSON), once for the log and once for the producer's own reduction of it, its own first
//! and last events, the room reserved for the events that will close what is open and for the outcome (see
//! `stream/closing.rs`), and for each rendition in use its frames and
//! its renderer's state (see `stream/ledger.rs` for how). An append that would not fit in every format in use is
//! refused (`HubFull`), as is a subscription that needs a new rendition the hub could not hold. The snapshot's
//! reduction of the log counts like a rendition from its first use, but is never refused: a status request
//! must answer, and it adds at most the log once more. Subscribers
//! add only their cursor, however far behind they are. What renditions add reaches the hub's count in steps of
//! 4 KiB per stream (one atomic shared by every stream is the count), so it trails by less than that. Per-message bookkeeping outside the JSON (the `Arc`,
//! the reducers' map entries, keyed by a `message_id` of at most 256 bytes) is not counted: a few dozen bytes
//! per message. An ended stream is evicted a retention time after it ended, and gives back everything. Its
//! producer (an agent run, or an HTTP client through the service) owns ending a stream; one that has had no
//! append for [`HubConfig::idle_timeout`] is ended by [`Hub::sweep`] with the error `idle_timeout`, so
//! streams nobody ends cannot hold the hub for good.
//!
//! # Clients
//!
//! A stream made for a client ([`Hub::create_for`]) counts against that client's budget while the hub holds
//! it, open or ended and retained ([`Limits::streams_per_client`], a tenth of the stream limit by default,
//! and optionally a number per minute), so that no one client can fill the hub, whether it keeps its
//! streams open or creates and ends them. A client at its budget that creates one more gives up its own
//! oldest ended stream (evicted early: its retention would have evicted it first anyway); only a client
//! whose every held stream is open is refused ([`HubError::ClientStreams`]). When the hub as a whole holds
//! [`Limits::streams`], the oldest ended stream, whoever holds it, is evicted early to make room; only a hub
//! whose every stream is open refuses ([`HubError::TooManyStreams`]). A stream restored from a storage
//! counts against the client it was made for, when the storage kept it. A refusal says when room is
//! expected ([`HubError::retry_after`]).

mod clock;
mod committed;
mod config;
mod error;
mod held;
mod lifecycle;
mod log;
mod probes;
mod render;
mod rendition;
mod state;
mod storage;
mod stream;
mod subscription;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::output::{ErrorProps, Outcome, OutputMessage};

pub use clock::{Clock, Ids, RandomIds, SystemClock, random_secret};
pub(crate) use committed::Committed;
pub use config::{Budget, HubConfig, Limits};
pub use error::HubError;
pub use log::{Entry, Gone, Log};
pub(crate) use log::{MemoryLog, json_of, write_json};
pub use render::{Render, Renderer, StreamInfo};
pub use storage::{MemoryStorage, Storage};
pub(crate) use stream::closing::{NOT_KEPT, Part};
pub use stream::producer::{AppendError, BatchError};
pub use stream::readers::SubscribeError;
pub use stream::receipts::{Appended, Condition, KEY_BYTES, RECEIPTS};
pub use stream::{Snapshot, Status, Stream};
pub use subscription::{Batch, Subscription};

use crate::output::check_name;
use state::{HubState, NONE_OPEN};

/// The end of a stream whose producer is gone (the service stopped, or the node writing it died) with
/// `outcome` at `now_ms`, after `log`'s entries: `message_end` and `block_end` for what they left open, then
/// `stream_end`, stamped from the sequence after `last` (the log's last, as the storage knows it: entries it
/// could not read back leave less closed, never a sequence stamped twice). What a storage appends for a
/// stream that was open when its writer stopped.
pub(crate) fn ending(
    info: &StreamInfo,
    log: &[Arc<OutputMessage>],
    last: u64,
    outcome: &Outcome,
    now_ms: u64,
) -> Vec<OutputMessage> {
    let mut open = lifecycle::Lifecycle::default();
    log.iter().for_each(|entry| open.observe(entry));
    let short = info.epoch.get(..8).unwrap_or(&info.epoch);
    let closings = open.end_all(now_ms).into_iter().map(|closing| closing.event);
    let end = lifecycle::stream_end(outcome, now_ms.saturating_sub(info.created_ms));
    closings
        .chain([end])
        .zip(last + 1..)
        .map(|(mut event, sequence)| {
            event.message_id = Some(format!("m{sequence}-{short}"));
            stream::stamp(&mut event, sequence, now_ms, None);
            event
        })
        .collect()
}

/// A stream a storage kept from before a restart, ended: see [`Hub::restore`].
#[derive(Debug)]
pub struct Restored {
    /// Its id, epoch, creation time and model, as before.
    pub info: StreamInfo,
    /// Its log, holding every entry and the outcome (in memory or not: the hub counts what it says it holds
    /// in memory, [`Log::memory_bytes`]).
    pub log: Box<dyn Log>,
    /// The bytes of its entries as JSON: its size against its own limit, and what a rendition of it is
    /// estimated at.
    pub bytes: u64,
    /// When it ended (ms by the hub's clock).
    pub ended_ms: u64,
    /// The client it was made for (see [`Hub::create_for`]), when the storage kept it: it counts against
    /// that client's budget again until it is evicted.
    pub client: Option<String>,
}

/// The streams of one process; cheap to clone.
///
/// ```
/// use agentmux::hub::Hub;
/// use agentmux::render::Format;
/// use agentmux::output::{Outcome, OutputMessage};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let hub = Hub::default();
/// let stream = hub.create("demo").unwrap();
/// let mut subscriber = stream.subscribe(Format::Cui, 0).unwrap();
/// stream.append(OutputMessage::text("hello")).unwrap();
/// stream.end(Outcome::completed());
/// let mut events = 0;
/// while let Some(batch) = subscriber.next().await {
///     events += batch.frames().len();
/// }
/// assert_eq!(events, 3); // stream_start, the text, stream_end
/// # });
/// ```
#[derive(Debug, Clone, Default)]
pub struct Hub {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Arc<HubState>,
    streams: Mutex<HashMap<String, Arc<Stream>>>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner::new(HubConfig::default())
    }
}

impl Inner {
    fn new(config: HubConfig) -> Self {
        Inner { state: Arc::new(HubState::new(config)), streams: Mutex::new(HashMap::new()) }
    }
}

impl Hub {
    /// A hub with the given config.
    pub fn new(config: HubConfig) -> Self {
        Hub { inner: Arc::new(Inner::new(config)) }
    }

    /// Its config.
    pub fn config(&self) -> &HubConfig {
        &self.inner.state.config
    }

    /// Creates an open stream that reports `model` (at most [`crate::output::NAME_BYTES`] long); it starts
    /// with `stream_start`. The stream counts against no client's budget: this is for producers in the
    /// process itself.
    pub fn create(&self, model: &str) -> Result<Arc<Stream>, HubError> {
        self.create_for(None, model)
    }

    /// Creates an open stream for `client` (an opaque name: the service uses the peer's address), within
    /// that client's budget ([`Limits::streams_per_client`], [`Limits::streams_per_client_per_minute`]).
    pub fn create_for(&self, client: Option<&str>, model: &str) -> Result<Arc<Stream>, HubError> {
        check_name("model", model)?;
        self.evict_expired();
        let state = &self.inner.state;
        let limit = self.config().limits.streams;
        let mut streams = self.streams();
        let mut evicted = Vec::new();
        // The client's budget first: a client at it gives up its own oldest ended stream, which makes room
        // in the hub too.
        if let Some(client) = client
            && let Some(id) = state.admit(client)?
        {
            evicted.extend(streams.remove(&id));
        }
        while streams.len() >= limit {
            // Full: the oldest ended stream, whoever holds it, makes room before its retention is over (one
            // this node only followed may be gone already: then the next).
            let Some(id) = state.held().take_oldest() else {
                if let Some(client) = client {
                    state.unadmit(client);
                }
                drop(streams);
                self.forget_evicted(evicted);
                return Err(HubError::TooManyStreams { limit, retry_after: state.room_expected_in(true) });
            };
            evicted.extend(streams.remove(&id));
        }
        let made = Stream::new(Arc::clone(state), client, model);
        let stream = match made {
            Ok(stream) => stream,
            Err(error) => {
                if let Some(client) = client {
                    state.unadmit(client);
                }
                drop(streams);
                self.forget_evicted(evicted);
                return Err(match error {
                    HubError::HubFull { limit, .. } => {
                        HubError::HubFull { limit, retry_after: state.room_expected_in(false) }
                    }
                    other => other,
                });
            }
        };
        streams.insert(stream.id().to_owned(), Arc::clone(&stream));
        drop(streams);
        self.forget_evicted(evicted);
        state.opened(stream.info().created_ms);
        tracing::debug!(stream = stream.id(), model, "stream created");
        Ok(stream)
    }

    /// Takes back a stream its storage kept from before a restart: ended (one that was open is ended by the
    /// storage before it comes back, with the error `interrupted`), readable and resumable as before, and
    /// evicted a retention after `ended_ms`.
    pub fn restore(&self, restored: Restored) {
        let id = restored.info.id.clone();
        let held = restored.log.memory_bytes();
        let stream = Stream::restored(Arc::clone(&self.inner.state), restored.info, restored.log, restored.bytes);
        self.inner.state.force_reserve(held);
        // Held by its client again, and retained in the order of its end, as the hub's own ends are.
        self.inner.state.held().retain(&id, restored.client.as_deref(), restored.ended_ms);
        self.streams().insert(id, stream);
    }

    /// Takes in a stream written on another node, to serve its readers here, open or ended as its `log` says
    /// (whoever made `log` keeps appending to it, and calls [`Stream::follower_ended`] at the end); or the
    /// stream already held under its id.
    pub(crate) fn follow(&self, info: StreamInfo, log: Box<dyn Log>) -> Arc<Stream> {
        let mut streams = self.streams();
        if let Some(held) = streams.get(&info.id) {
            return Arc::clone(held);
        }
        let (id, held, ended) = (info.id.clone(), log.memory_bytes(), log.is_ended());
        let stream = Stream::followed(Arc::clone(&self.inner.state), info, log);
        self.inner.state.force_reserve(held);
        streams.insert(id, Arc::clone(&stream));
        drop(streams);
        if ended {
            stream.follower_ended();
        }
        stream
    }

    /// Lets go of a followed stream that nothing on this node holds but the hub and the caller (no
    /// subscriber, no request serving it): gone from the hub and its bytes given back. A later request
    /// follows it again from Redis. True when it was let go.
    pub(crate) fn let_go(&self, stream: &Arc<Stream>) -> bool {
        let mut streams = self.streams();
        // Under the hub's lock: every other holder got the stream from this map under it, or from a holder.
        let held_here = streams.get(stream.id()).is_some_and(|held| Arc::ptr_eq(held, stream));
        if !stream.is_followed() || !held_here || Arc::strong_count(stream) > 2 {
            return false;
        }
        streams.remove(stream.id());
        drop(streams);
        stream.forget();
        true
    }

    /// Lets go of a followed stream this node can no longer follow (Redis has not answered its follower for
    /// a lease, `cluster/follow.rs`), whoever holds it: gone from the hub and its bytes given back, and each
    /// of its subscribers told `lagged` where it is, to resume from there. A later request follows it again
    /// from Redis. True when it was let go.
    pub(crate) fn lose(&self, stream: &Arc<Stream>) -> bool {
        let mut streams = self.streams();
        let held_here = streams.get(stream.id()).is_some_and(|held| Arc::ptr_eq(held, stream));
        if !stream.is_followed() || !held_here {
            return false;
        }
        streams.remove(stream.id());
        drop(streams);
        stream.lose();
        true
    }

    /// The stream with this id, open or within its retention.
    pub fn get(&self, id: &str) -> Option<Arc<Stream>> {
        self.evict_expired();
        self.streams().get(id).cloned()
    }

    /// How many streams it holds with each status (every status, zero included).
    pub fn count_by_status(&self) -> [(Status, usize); 4] {
        let mut counts = [(Status::Open, 0), (Status::Completed, 0), (Status::Cancelled, 0), (Status::Error, 0)];
        for stream in self.streams().values() {
            let status = stream.status();
            if let Some(count) = counts.iter_mut().find(|(s, _)| *s == status) {
                count.1 += 1;
            }
        }
        counts
    }

    /// Messages rendered so far, by render key ([`Render::key`]), over every stream. A stream renders its log
    /// once per key in use, whatever the number of subscribers, so this grows by one per message per format
    /// watched; more only for subscribers that read from before a rendition's window (each of those renders
    /// again for itself) and for streams read again after a restart.
    pub fn rendered(&self) -> Vec<(String, u64)> {
        let renders = crate::sync::lock(&self.inner.state.renders);
        renders.iter().map(|(key, count)| (key.clone(), count.load(Ordering::Relaxed))).collect()
    }

    /// A page of the streams held, newest first (by creation, then id): at most `limit` of those that come
    /// after `after` in that order (`(created_ms, id)` of the last one of the page before; none: from the
    /// newest). Also whether more follow.
    pub fn page(&self, after: Option<(u64, &str)>, limit: usize) -> (Vec<Arc<Stream>>, bool) {
        self.evict_expired();
        let mut streams: Vec<Arc<Stream>> = self.streams().values().cloned().collect();
        let key = |s: &Arc<Stream>| (std::cmp::Reverse(s.info().created_ms), std::cmp::Reverse(s.id().to_owned()));
        streams.sort_by_cached_key(key);
        let start = match after {
            Some((created_ms, id)) => {
                let cursor = (std::cmp::Reverse(created_ms), std::cmp::Reverse(id.to_owned()));
                streams.partition_point(|s| key(s) <= cursor)
            }
            None => 0,
        };
        let mut page: Vec<Arc<Stream>> = streams.drain(start..).take(limit.saturating_add(1)).collect();
        let more = page.len() > limit;
        page.truncate(limit);
        (page, more)
    }

    /// The streams still open that this hub writes (not those it follows from another node).
    pub fn open_streams(&self) -> Vec<Arc<Stream>> {
        // A followed stream is its writer's to end, on its own node.
        self.streams().values().filter(|s| !s.is_followed() && s.status() == Status::Open).cloned().collect()
    }

    /// How many streams it holds.
    pub fn len(&self) -> usize {
        self.streams().len()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of messages held, as counted against [`Limits::hub_bytes`].
    pub fn bytes(&self) -> u64 {
        self.inner.state.bytes.load(Ordering::Acquire)
    }

    /// What a server runs about once a second: ends the streams idle for [`HubConfig::idle_timeout`], then
    /// evicts those whose retention has passed, ends those whose storage could not keep them (a disk that
    /// failed: `store_unavailable`), then gives back what ended streams no longer need (the
    /// producer's reduction, renditions nobody reads) and counts them again. Returns how many it ended.
    pub fn sweep(&self) -> usize {
        let ended = self.end_idle();
        self.evict_expired();
        let streams: Vec<Arc<Stream>> = self.streams().values().cloned().collect();
        for stream in &streams {
            stream.end_unkept();
            stream.cool();
        }
        self.inner.state.forget_idle_clients();
        ended
    }

    /// Ends, with the error `idle_timeout`, every open stream that has had no append for the idle timeout,
    /// and cancels what runs it; notes the next time one can time out.
    fn end_idle(&self) -> usize {
        let state = &self.inner.state;
        let idle = self.config().idle_timeout.as_millis() as u64;
        if idle == 0 {
            return 0;
        }
        let now_ms = self.config().clock.now_ms();
        let mut next = u64::MAX;
        let mut idle_streams = Vec::new();
        for stream in self.streams().values() {
            if let Some(active_ms) = stream.active_ms() {
                let deadline = active_ms.saturating_add(idle);
                if deadline <= now_ms {
                    idle_streams.push(Arc::clone(stream));
                } else {
                    next = next.min(deadline);
                }
            }
        }
        state.next_idle_ms.store(if next == u64::MAX { NONE_OPEN } else { next }, Ordering::Release);
        let timeout = self.config().idle_timeout;
        let mut ended = 0;
        for stream in idle_streams {
            let outcome = Outcome::failed(ErrorProps {
                message: format!("the stream had no new message for {}", humantime::format_duration(timeout)),
                code: Some("idle_timeout".into()),
                details: None,
            });
            if stream.stop(outcome) {
                tracing::info!(stream = stream.id(), "ended: idle");
                ended += 1;
            }
        }
        ended
    }

    /// Evicts the streams whose retention has passed: they are gone from the hub, their history and
    /// renditions are dropped and their bytes given back, and a subscriber still behind gets `lagged`. Runs
    /// on every `create` and `get`; a server may also call it on a timer so memory is returned when nobody
    /// calls either.
    pub fn evict_expired(&self) {
        let retention = self.config().retention.as_millis() as u64;
        let expired = {
            let mut held = self.inner.state.held();
            if held.oldest_end_ms().is_none() {
                return;
            }
            // Read only when something may expire: a test's stepping clock must not tick for nothing.
            let now_ms = self.config().clock.now_ms();
            match now_ms.checked_sub(retention) {
                Some(before_ms) => held.take_ended_before(before_ms),
                None => return,
            }
        };
        if !expired.is_empty() {
            let evicted: Vec<Arc<Stream>> = {
                let mut streams = self.streams();
                expired.iter().filter_map(|id| streams.remove(id)).collect()
            };
            self.forget_evicted(evicted);
        }
    }

    /// Lets go of streams taken out of the hub: their history and renditions are dropped, their bytes given
    /// back, their storage told, and a subscriber still behind gets `lagged`.
    fn forget_evicted(&self, evicted: Vec<Arc<Stream>>) {
        for stream in evicted {
            stream.forget();
            self.config().storage.evict(stream.id());
            tracing::debug!(stream = stream.id(), "stream evicted");
        }
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        crate::sync::lock(&self.inner.streams)
    }
}
