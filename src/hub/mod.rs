//! The hub: streams, fan-out, resume, backpressure and retention.
//!
//! - [`Hub`] (this file): the streams by id, the limits, and retention: an ended stream stays readable
//!   (subscribe, resume, status) for the retention time, then is evicted.
//! - [`Stream`] (`stream.rs`): one append-only log with sequence numbers and an epoch, its materialised state
//!   (the delta reducer), and the lifecycle events it adds by itself (`lifecycle.rs`).
//! - `rendition.rs`: per format in use, the frames of the whole log, rendered once and shared by every
//!   subscriber of that format.
//! - [`Subscription`] (`subscription.rs`): a subscriber's cursor into a rendition, with the byte bound that
//!   turns a subscriber that falls behind into one `lagged` notice instead of slowing anyone.
//! - [`Format`] (`format.rs`) and the injectable [`Clock`] and [`Ids`] (`clock.rs`).
//!
//! # Memory
//!
//! Every byte a stream holds is counted against its own limit ([`Limits::stream_bytes`]) and the hub's
//! ([`Limits::hub_bytes`], 1 GiB by default); an append past either is refused. Counted is each message's
//! size as JSON. Besides the log a stream keeps the reducer's state (at most the size of the log: deltas
//! merge into it) and one rendition per format in use (CUI frames are the log plus a few dozen bytes per
//! message; OpenAI chunks at most that, and usually less). Subscribers add only their cursor. So the worst
//! case is about `hub_bytes × (2 + formats in use)` plus per-message bookkeeping: about 4 GiB with the
//! defaults and both formats in use, and the streams are gone a retention time after they end. A stream
//! whose producer never ends it stays until the process stops: its producer (an agent run, or an HTTP
//! client through the service) owns ending it.

mod clock;
mod format;
mod lifecycle;
mod rendition;
mod stream;
mod subscription;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use clock::{Clock, CountingIds, Ids, RandomIds, SteppingClock, SystemClock};
pub use format::Format;
pub use stream::{AppendError, BatchError, Snapshot, Status, Stream, SubscribeError};
pub use subscription::{Batch, Subscription};

/// Limits that bound what the hub holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest message, as JSON (1 MiB).
    pub message_bytes: u64,
    /// Most messages in one stream, lifecycle events included (100,000).
    pub messages_per_stream: usize,
    /// Most bytes of messages in one stream (64 MiB).
    pub stream_bytes: u64,
    /// Most streams, open or retained (100,000).
    pub streams: usize,
    /// Most bytes of messages in all streams (1 GiB).
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
    /// A subscriber's outbound bound: past it the subscriber gets `lagged` and ends (1 MiB).
    pub queue_bytes: u64,
    /// The most bytes handed to a subscriber in one batch, unless one frame is larger (256 KiB).
    pub batch_bytes: u64,
    /// How long an ended stream stays readable (10 minutes).
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
            queue_bytes: 1 << 20,
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
}

/// What the hub and its streams share: the config, the byte count, the ended streams awaiting eviction.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: HubConfig,
    bytes: AtomicU64,
    ended: Mutex<VecDeque<(Instant, String)>>,
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
        ended.push_back((Instant::now(), id.to_owned()));
    }
}

/// The streams of one process; cheap to clone.
///
/// ```
/// use agentmux::hub::{Format, Hub};
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

    /// Creates an open stream whose OpenAI chunks report `model`; it starts with `stream_start`.
    pub fn create(&self, model: &str) -> Result<Arc<Stream>, HubError> {
        self.evict_expired();
        let limit = self.config().limits.streams;
        let mut streams = self.streams();
        if streams.len() >= limit {
            return Err(HubError::TooManyStreams { limit });
        }
        let stream = Stream::new(Arc::clone(&self.inner.shared), model);
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

    /// Evicts the streams whose retention has passed. Runs on every `create` and `get`; a server may also
    /// call it on a timer so memory is returned when nobody calls either.
    pub fn evict_expired(&self) {
        let retention = self.config().retention;
        let mut expired = Vec::new();
        {
            let mut ended = self.inner.shared.ended.lock().unwrap_or_else(|p| p.into_inner());
            while ended.front().is_some_and(|(at, _)| at.elapsed() >= retention) {
                if let Some((_, id)) = ended.pop_front() {
                    expired.push(id);
                }
            }
        }
        if !expired.is_empty() {
            let mut streams = self.streams();
            for id in expired {
                streams.remove(&id);
                tracing::debug!(stream = id, "stream evicted");
            }
        }
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        self.inner.streams.lock().unwrap_or_else(|p| p.into_inner())
    }
}
