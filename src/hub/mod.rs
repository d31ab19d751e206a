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
//! per message. An ended stream is evicted a
//! retention time after it ended, and gives back everything; a stream whose producer never ends it stays
//! until the process stops: its producer (an agent run, or an HTTP client through the service) owns ending it.

mod clock;
mod lifecycle;
mod log;
mod render;
mod rendition;
mod stream;
mod subscription;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use clock::{Clock, Ids, RandomIds, SystemClock};
#[cfg(test)]
pub(crate) use log::MemoryLog;
pub use log::{Entry, Gone, Log};
pub use render::{Render, Renderer, StreamInfo};
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            message_bytes: 1 << 20,
            messages_per_stream: 100_000,
            stream_bytes: 64 << 20,
            streams: 100_000,
            hub_bytes: 1 << 30,
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
    /// Where timestamps come from.
    pub clock: Arc<dyn Clock>,
    /// Where stream ids and epochs come from.
    pub ids: Arc<dyn Ids>,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            limits: Limits::default(),
            batch_bytes: 256 << 10,
            retention: Duration::from_secs(600),
            clock: Arc::new(SystemClock),
            ids: Arc::new(RandomIds),
        }
    }
}

/// Why a stream could not be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// The hub holds as many streams as it may.
    #[error("the service holds its limit of {limit} streams")]
    TooManyStreams {
        /// The limit.
        limit: usize,
    },
    /// The hub holds as many bytes as it may.
    #[error("the service has reached its limit of {limit} bytes of messages")]
    HubFull {
        /// The limit.
        limit: u64,
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

/// What the hub and its streams share: the config, the byte count, the ended streams awaiting eviction.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: HubConfig,
    bytes: AtomicU64,
    /// Ended streams by when they ended (ms by the hub's clock), oldest first.
    ended: Mutex<VecDeque<(u64, String)>>,
}

impl Shared {
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

    /// Records that a stream ended now.
    fn ended(&self, id: &str) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        ended.push_back((self.config.clock.now_ms(), id.to_owned()));
    }
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
            shared: Arc::new(Shared { config, bytes: AtomicU64::new(0), ended: Mutex::new(VecDeque::new()) }),
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
    /// with `stream_start`.
    pub fn create(&self, model: &str) -> Result<Arc<Stream>, HubError> {
        check_name("model", model)?;
        self.evict_expired();
        let limit = self.config().limits.streams;
        let mut streams = self.streams();
        if streams.len() >= limit {
            return Err(HubError::TooManyStreams { limit });
        }
        let stream = Stream::new(Arc::clone(&self.inner.shared), model)?;
        streams.insert(stream.id().to_owned(), Arc::clone(&stream));
        tracing::debug!(stream = stream.id(), model, "stream created");
        Ok(stream)
    }

    /// The stream with this id, open or within its retention.
    pub fn get(&self, id: &str) -> Option<Arc<Stream>> {
        self.evict_expired();
        self.streams().get(id).cloned()
    }

    /// The streams still open.
    pub fn open_streams(&self) -> Vec<Arc<Stream>> {
        self.streams().values().filter(|s| s.status() == Status::Open).cloned().collect()
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

    /// Evicts the streams whose retention has passed: they are gone from the hub, their history and
    /// renditions are dropped and their bytes given back, and a subscriber still behind gets `lagged`. Runs
    /// on every `create` and `get`; a server may also call it on a timer so memory is returned when nobody
    /// calls either.
    pub fn evict_expired(&self) {
        let retention = self.config().retention.as_millis() as u64;
        let mut expired = Vec::new();
        {
            let mut ended = self.inner.shared.ended.lock().unwrap_or_else(|p| p.into_inner());
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
                tracing::debug!(stream = stream.id(), "stream evicted");
            }
        }
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        self.inner.streams.lock().unwrap_or_else(|p| p.into_inner())
    }
}
