//! The hub: streams, fan-out, resume and retention.
//!
//! - [`Hub`] (this file): the streams by id, the limits, and retention: an ended stream stays readable
//!   (subscribe, resume, status) for the retention time, by the hub's clock, then is evicted.
//! - [`Stream`] (`stream.rs`): what a stream does for its producer: validate, stamp sequences and ids, add
//!   the lifecycle events (`lifecycle.rs`), reduce deltas, check limits, record the outcome.
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
//! `stream.rs`), and for each rendition in use its frames and
//! its renderer's state (see `stream.rs` for how). An append that would not fit in every format in use is
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
//! A stream made for a client ([`Hub::create_for`]) counts against that client's budget while it is open
//! ([`Limits::streams_per_client`], a tenth of the stream limit by default, and optionally a number per
//! minute), so that no one client can fill the hub. A refusal says when room is expected
//! ([`HubError::retry_after`]).

mod clock;
mod committed;
mod lifecycle;
mod log;
mod probes;
mod render;
mod rendition;
mod storage;
mod stream;
mod subscription;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::output::{ErrorProps, Outcome, OutputMessage};

pub use clock::{Clock, Ids, RandomIds, SystemClock};
pub(crate) use committed::Committed;
pub use log::{Entry, Gone, Log};
pub(crate) use log::{MemoryLog, json_of, write_json};
pub use render::{Render, Renderer, StreamInfo};
pub use storage::{MemoryStorage, Storage};
pub(crate) use stream::NOT_KEPT;
pub use stream::{AppendError, BatchError, Snapshot, Status, Stream, SubscribeError};
pub use subscription::{Batch, Subscription};

use crate::output::{ValidationError, check_name};

/// Limits that bound what the hub holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest message, as JSON (1 MiB).
    pub message_bytes: u64,
    /// Most messages in one stream, lifecycle events included (100,000). The places of the events that will
    /// close what is open (`stream_end` from the start) are kept for them. At least 2.
    pub messages_per_stream: usize,
    /// Most bytes of messages in one stream, with the room kept for the events that will close what is open
    /// (64 MiB). At least what a stream's first event and the room for its last take, about 1 KiB.
    pub stream_bytes: u64,
    /// Most streams, open or retained (100,000).
    pub streams: usize,
    /// Most bytes of messages in all streams, with every stream's rooms, outcome and renditions (1 GiB).
    pub hub_bytes: u64,
    /// Most streams one client may have open at once (a tenth of `streams`: 10,000), so that no one client
    /// can fill the hub. Streams made without a client ([`Hub::create`]) are not counted.
    pub streams_per_client: usize,
    /// Most streams one client may create in a minute (0: no limit, the default).
    pub streams_per_client_per_minute: u32,
    /// Clients with a budget of their own instead of the two limits above (the service's API keys, by name).
    pub client_budgets: HashMap<String, Budget>,
}

/// One client's budget of streams: open at once, and created in a minute (0: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Most streams open at once.
    pub streams: usize,
    /// Most streams created in a minute (0: no limit).
    pub streams_per_minute: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            message_bytes: 1 << 20,
            messages_per_stream: 100_000,
            stream_bytes: 64 << 20,
            streams: 100_000,
            hub_bytes: 1 << 30,
            streams_per_client: 10_000,
            streams_per_client_per_minute: 0,
            client_budgets: HashMap::new(),
        }
    }
}

/// How a hub behaves.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// What it may hold.
    pub limits: Limits,
    /// The most bytes handed to a subscriber in one batch, unless one frame is larger (256 KiB).
    pub batch_bytes: u64,
    /// How long an ended stream stays readable (10 minutes), by `clock`.
    pub retention: Duration,
    /// How long an open stream may go without an append before it is ended with the error `idle_timeout`
    /// (10 minutes; zero: never), by `clock`. Ends happen in [`Hub::sweep`].
    pub idle_timeout: Duration,
    /// Where timestamps come from.
    pub clock: Arc<dyn Clock>,
    /// Where stream ids and epochs come from.
    pub ids: Arc<dyn Ids>,
    /// Where the streams' logs live (in memory by default).
    pub storage: Arc<dyn Storage>,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            limits: Limits::default(),
            batch_bytes: 256 << 10,
            retention: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(600),
            clock: Arc::new(SystemClock),
            ids: Arc::new(RandomIds),
            storage: Arc::new(MemoryStorage),
        }
    }
}

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
}

/// Why a stream could not be created.
///
/// Each says whether waiting helps: `retry_after` is when the hub expects room (the oldest ended stream's
/// eviction, or the eviction of the first open stream that can reach its idle timeout: a retention after
/// it), and `None` when nothing the hub holds will free room by itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// The hub holds as many streams as it may.
    #[error("the service holds its limit of {limit} streams")]
    TooManyStreams {
        /// The limit.
        limit: usize,
        /// When room is expected.
        retry_after: Option<Duration>,
    },
    /// The hub holds as many bytes as it may.
    #[error("the service has reached its limit of {limit} bytes of messages")]
    HubFull {
        /// The limit.
        limit: u64,
        /// When room is expected.
        retry_after: Option<Duration>,
    },
    /// The client has as many streams open as one client may: ending one makes room.
    #[error("this client has {limit} streams open, the most one client may; end one to start another")]
    ClientStreams {
        /// The limit.
        limit: usize,
    },
    /// The client created as many streams in the last minute as one client may.
    #[error("this client created {limit} streams in the last minute, the most one client may")]
    ClientRate {
        /// The limit.
        limit: u32,
        /// When the minute is over.
        retry_after: Duration,
    },
    /// A stream's limits cannot hold even its first and last events: `messages_per_stream` under 2, or
    /// `stream_bytes` under what `stream_start` and the room for `stream_end` take (about 1 KiB). A
    /// configuration error.
    #[error(
        "a stream's limits ({messages} messages, {bytes} bytes) cannot hold its first and last events \
         (2 messages, {needed} bytes)"
    )]
    StreamLimitsTooSmall {
        /// [`Limits::messages_per_stream`].
        messages: usize,
        /// [`Limits::stream_bytes`].
        bytes: u64,
        /// What the first and last events take.
        needed: u64,
    },
    /// The model name is over [`crate::output::NAME_BYTES`] (the error's field is `model`).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

impl HubError {
    /// When a retry may succeed; `None` when waiting alone will not help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            HubError::TooManyStreams { retry_after, .. } | HubError::HubFull { retry_after, .. } => *retry_after,
            HubError::ClientRate { retry_after, .. } => Some(*retry_after),
            HubError::ClientStreams { .. } | HubError::StreamLimitsTooSmall { .. } | HubError::Invalid(_) => None,
        }
    }
}

/// What the hub and its streams share: the config, the byte count, the ended streams awaiting eviction, and
/// what each client has open.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: HubConfig,
    bytes: AtomicU64,
    /// Ended streams by when they ended (ms by the hub's clock), oldest first.
    ended: Mutex<VecDeque<(u64, String)>>,
    /// The earliest an open stream can reach its idle timeout (ms by the hub's clock), as of the last sweep;
    /// [`NONE_OPEN`] when none was open, [`NOT_SWEPT`] before the first.
    next_idle_ms: AtomicU64,
    clients: Mutex<HashMap<String, ClientUse>>,
    /// Messages rendered, by render key (see [`Hub::rendered`]).
    renders: Mutex<Vec<(String, Arc<AtomicU64>)>>,
}

/// One client's streams: open now, and created in the current minute.
#[derive(Debug, Default)]
struct ClientUse {
    open: usize,
    minute_started_ms: u64,
    created_this_minute: u32,
}

impl Shared {
    /// The count of messages rendered in `key`.
    pub(crate) fn renders_of(&self, key: &str) -> Arc<AtomicU64> {
        let mut renders = crate::sync::lock(&self.renders);
        if let Some((_, count)) = renders.iter().find(|(k, _)| k == key) {
            return Arc::clone(count);
        }
        let count = Arc::new(AtomicU64::new(0));
        renders.push((key.to_owned(), Arc::clone(&count)));
        count
    }

    /// Counts `bytes` against the hub limit; `false` (and nothing counted) when they do not fit.
    fn reserve(&self, bytes: u64) -> bool {
        let limit = self.config.limits.hub_bytes;
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n + bytes <= limit).then_some(n + bytes))
            .is_ok()
    }

    /// Counts bytes that must go in regardless (the stream's own lifecycle events).
    fn force_reserve(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    fn release(&self, bytes: u64) {
        let _ = self.bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(bytes)));
    }

    /// Records that a stream ended now; it no longer counts against its client.
    fn ended(&self, id: &str, client: Option<&str>) {
        if let Some(client) = client {
            let mut clients = crate::sync::lock(&self.clients);
            if let Some(usage) = clients.get_mut(client) {
                usage.open = usage.open.saturating_sub(1);
            }
        }
        let mut ended = crate::sync::lock(&self.ended);
        ended.push_back((self.config.clock.now_ms(), id.to_owned()));
    }

    /// Counts a new stream against `client`'s budget, or says why it does not fit.
    fn admit(&self, client: &str) -> Result<(), HubError> {
        let limits = &self.config.limits;
        let budget = limits.client_budgets.get(client).copied().unwrap_or(Budget {
            streams: limits.streams_per_client,
            streams_per_minute: limits.streams_per_client_per_minute,
        });
        let mut clients = crate::sync::lock(&self.clients);
        let usage = clients.entry(client.to_owned()).or_default();
        if usage.open >= budget.streams {
            return Err(HubError::ClientStreams { limit: budget.streams });
        }
        if budget.streams_per_minute > 0 {
            let now_ms = self.config.clock.now_ms();
            if now_ms.saturating_sub(usage.minute_started_ms) >= MINUTE_MS {
                usage.minute_started_ms = now_ms;
                usage.created_this_minute = 0;
            }
            if usage.created_this_minute >= budget.streams_per_minute {
                let left = MINUTE_MS.saturating_sub(now_ms.saturating_sub(usage.minute_started_ms));
                return Err(HubError::ClientRate {
                    limit: budget.streams_per_minute,
                    retry_after: Duration::from_millis(left.max(1)),
                });
            }
            usage.created_this_minute += 1;
        }
        usage.open += 1;
        Ok(())
    }

    /// Notes that a stream opened at `created_ms`: it can time out from then on, earlier than the last sweep
    /// knew of (or when it knew of none open).
    fn opened(&self, created_ms: u64) {
        let idle_timeout = self.config.idle_timeout.as_millis() as u64;
        if idle_timeout == 0 {
            return;
        }
        let deadline = created_ms.saturating_add(idle_timeout);
        let _ = self.next_idle_ms.fetch_update(Ordering::AcqRel, Ordering::Acquire, |known| {
            (known == NONE_OPEN || known > deadline).then_some(deadline)
        });
    }

    /// Forgets the clients with nothing open and no minute running, so that clients come and go without
    /// the map growing.
    fn forget_idle_clients(&self) {
        let mut clients = crate::sync::lock(&self.clients);
        if clients.is_empty() {
            return;
        }
        let now_ms = self.config.clock.now_ms();
        clients.retain(|_, usage| usage.open > 0 || now_ms.saturating_sub(usage.minute_started_ms) < MINUTE_MS);
    }

    /// Gives back what [`Shared::admit`] counted, for a stream that was not made after all.
    fn unadmit(&self, client: &str) {
        let mut clients = crate::sync::lock(&self.clients);
        if let Some(usage) = clients.get_mut(client) {
            usage.open = usage.open.saturating_sub(1);
            usage.created_this_minute = usage.created_this_minute.saturating_sub(1);
        }
    }

    /// When the hub expects room: the oldest ended stream's eviction, or the earliest idle timeout.
    fn room_expected_in(&self) -> Option<Duration> {
        let now_ms = self.config.clock.now_ms();
        let retention = self.config.retention.as_millis() as u64;
        let eviction = crate::sync::lock(&self.ended).front().map(|(at, _)| at.saturating_add(retention));
        // A stream that times out is retained like any ended stream: its room comes back a retention later.
        // Before the first sweep, the latest an open stream can time out stands for the earliest.
        let idle_timeout = self.config.idle_timeout.as_millis() as u64;
        let idle = match self.next_idle_ms.load(Ordering::Acquire) {
            _ if idle_timeout == 0 => None,
            NOT_SWEPT => Some(now_ms.saturating_add(idle_timeout)),
            NONE_OPEN => None,
            at => Some(at),
        };
        let idle = idle.map(|at| at.saturating_add(retention));
        let at = [eviction, idle].into_iter().flatten().min()?;
        // At least a second: `Retry-After` counts whole seconds, and the sweep that frees the room runs
        // about once a second.
        Some(Duration::from_millis(at.saturating_sub(now_ms).max(1_000)))
    }
}

const MINUTE_MS: u64 = 60_000;

/// `next_idle_ms` before the first sweep.
const NOT_SWEPT: u64 = u64::MAX;

/// `next_idle_ms` when the last sweep found no open stream.
const NONE_OPEN: u64 = 0;

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
    shared: Arc<Shared>,
    streams: Mutex<HashMap<String, Arc<Stream>>>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner::new(HubConfig::default())
    }
}

impl Inner {
    fn new(config: HubConfig) -> Self {
        Inner {
            shared: Arc::new(Shared {
                config,
                bytes: AtomicU64::new(0),
                ended: Mutex::new(VecDeque::new()),
                next_idle_ms: AtomicU64::new(NOT_SWEPT),
                clients: Mutex::new(HashMap::new()),
                renders: Mutex::new(Vec::new()),
            }),
            streams: Mutex::new(HashMap::new()),
        }
    }
}

impl Hub {
    /// A hub with the given config.
    pub fn new(config: HubConfig) -> Self {
        Hub { inner: Arc::new(Inner::new(config)) }
    }

    /// Its config.
    pub fn config(&self) -> &HubConfig {
        &self.inner.shared.config
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
        let shared = &self.inner.shared;
        let limit = self.config().limits.streams;
        let mut streams = self.streams();
        if streams.len() >= limit {
            return Err(HubError::TooManyStreams { limit, retry_after: shared.room_expected_in() });
        }
        if let Some(client) = client {
            shared.admit(client)?;
        }
        let stream = match Stream::new(Arc::clone(shared), client, model) {
            Ok(stream) => stream,
            Err(error) => {
                if let Some(client) = client {
                    shared.unadmit(client);
                }
                return Err(match error {
                    HubError::HubFull { limit, .. } => {
                        HubError::HubFull { limit, retry_after: shared.room_expected_in() }
                    }
                    other => other,
                });
            }
        };
        streams.insert(stream.id().to_owned(), Arc::clone(&stream));
        shared.opened(stream.info().created_ms);
        tracing::debug!(stream = stream.id(), model, "stream created");
        Ok(stream)
    }

    /// Takes back a stream its storage kept from before a restart: ended (one that was open is ended by the
    /// storage before it comes back, with the error `interrupted`), readable and resumable as before, and
    /// evicted a retention after `ended_ms`.
    pub fn restore(&self, restored: Restored) {
        let id = restored.info.id.clone();
        let held = restored.log.memory_bytes();
        let stream = Stream::restored(Arc::clone(&self.inner.shared), restored.info, restored.log, restored.bytes);
        self.inner.shared.force_reserve(held);
        let mut ended = crate::sync::lock(&self.inner.shared.ended);
        // Kept in order of their end, as the hub's own ends are.
        let at = ended.partition_point(|(ms, _)| *ms <= restored.ended_ms);
        ended.insert(at, (restored.ended_ms, id.clone()));
        drop(ended);
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
        let stream = Stream::followed(Arc::clone(&self.inner.shared), info, log);
        self.inner.shared.force_reserve(held);
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
        let renders = crate::sync::lock(&self.inner.shared.renders);
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
        self.inner.shared.bytes.load(Ordering::Acquire)
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
        self.inner.shared.forget_idle_clients();
        ended
    }

    /// Ends, with the error `idle_timeout`, every open stream that has had no append for the idle timeout,
    /// and cancels what runs it; notes the next time one can time out.
    fn end_idle(&self) -> usize {
        let shared = &self.inner.shared;
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
        shared.next_idle_ms.store(if next == u64::MAX { NONE_OPEN } else { next }, Ordering::Release);
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
        let mut expired = Vec::new();
        {
            let mut ended = crate::sync::lock(&self.inner.shared.ended);
            if ended.is_empty() {
                return;
            }
            // Read only when something may expire: a test's stepping clock must not tick for nothing.
            let now_ms = self.config().clock.now_ms();
            while ended.front().is_some_and(|(at, _)| now_ms.saturating_sub(*at) >= retention) {
                if let Some((_, id)) = ended.pop_front() {
                    expired.push(id);
                }
            }
        }
        if !expired.is_empty() {
            let evicted: Vec<Arc<Stream>> = {
                let mut streams = self.streams();
                expired.iter().filter_map(|id| streams.remove(id)).collect()
            };
            for stream in evicted {
                stream.forget();
                self.config().storage.evict(stream.id());
                tracing::debug!(stream = stream.id(), "stream evicted");
            }
        }
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        crate::sync::lock(&self.inner.streams)
    }
}
