//! [`Stream`]: what a stream does for its producer, over a [`Log`] that its readers read.
//!
//! This file holds the handle and what it holds: its construction (a new stream, one restored from a
//! store, one followed from another node), its status, its snapshot and history, and the producer's state.
//! What the handle does in each of its roles is in a file of its own:
//!
//! - `producer.rs`: appending: validate, stamp, reduce, count, all or nothing.
//! - `receipts.rs`: safe retries: an append's condition, and the receipts of the last conditional appends.
//! - `closing.rs`: the events that close what is open, and the end (the room kept for them).
//! - `ledger.rs`: what a stream counts against the hub, and what an ended stream keeps.
//! - `readers.rs`: subscriptions and the renditions they read, and eviction.
//!
//! Those files import the handle and its state from here; this one imports none of them (the hub takes
//! their public items straight from them), so the handle and its roles make no import circle.
//!
//! The producer's state sits behind a `std::sync::Mutex`: no `.await` happens while it is held and every
//! critical section is short (stamping and reducing one batch), which a tokio mutex would only make slower.
//! The snapshot, here, is a reader like any other (`readers.rs` says why readers never touch the producer's
//! state): it reads the log, and keeps its own reduction of it behind a mutex of its own.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::error::HubError;
use super::lifecycle::Lifecycle;
use super::log::{Entry, Log};
use super::probes::Probes;
use super::render::StreamInfo;
use super::rendition::Rendition;
use super::state::HubState;
use crate::output::{EndStatus, LifecycleEvent, Metadata, Outcome, OutputMessage, Reducer, StreamStart};
use crate::sync::lock;

pub(super) mod closing;
mod ledger;
pub(super) mod producer;
pub(super) mod readers;
pub(super) mod receipts;

/// A stream's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Messages may still come.
    Open,
    /// Ended normally.
    Completed,
    /// Ended by a cancel.
    Cancelled,
    /// Ended with an error.
    Error,
}

impl Status {
    /// Its name, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Open => "open",
            Status::Completed => "completed",
            Status::Cancelled => "cancelled",
            Status::Error => "error",
        }
    }

    /// The status of a stream that ended with `outcome`, or is open (`None`).
    pub fn of(outcome: Option<&Outcome>) -> Status {
        match outcome.map(|o| o.status) {
            None => Status::Open,
            Some(EndStatus::Completed) => Status::Completed,
            Some(EndStatus::Cancelled) => Status::Cancelled,
            Some(EndStatus::Error) => Status::Error,
        }
    }
}

/// What `GET /v1/streams/{id}` shows: the status and every message's current state.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Snapshot {
    /// The stream id.
    pub id: String,
    /// Its status.
    pub status: Status,
    /// Its epoch.
    pub epoch: String,
    /// The last sequence appended (0 when empty).
    pub last_sequence: u64,
    /// Every message with its deltas applied, in order of first appearance.
    pub messages: Vec<OutputMessage>,
}

/// What the producer side keeps.
struct Producer {
    /// The last sequence appended.
    last: u64,
    /// Bytes against the stream's limit: the log as JSON, and the room reserved for the events that will
    /// close what is open (`stream_end` while the stream is open).
    bytes: u64,
    /// Closing events reserved: one per open message and block, and `stream_end` while the stream is open.
    closings: u64,
    /// Bytes counted against the hub (once) for the outcome the log keeps beside `stream_end`: the widest an
    /// internal end keeps while the stream is open, the outcome's own size once it ended.
    outcome_bytes: u64,
    reducer: Reducer,
    lifecycle: Lifecycle,
    /// The outcome, shared with the log's last entry.
    end: Option<Arc<Outcome>>,
    started_ms: u64,
    /// Readers holding a copy of the whole log (renditions, the snapshot's reduction): each entry is counted
    /// once more per reader.
    readers: u64,
    /// The last conditional appends, for their repeats.
    receipts: receipts::Receipts,
    /// What is to be told of the end once it is recorded ([`Stream::when_ended`]).
    on_end: Vec<OnEnd>,
}

/// A callback told how a stream ended ([`Stream::when_ended`]).
type OnEnd = Box<dyn FnOnce(&Outcome) + Send>;

impl Producer {
    /// How many times an entry is counted: the log, the producer's own reduction (`reducer`, at most the
    /// entries it came from), and each reader.
    #[inline]
    fn copies(&self) -> u64 {
        2 + self.readers
    }
}

/// One stream; see the module doc. Shared as `Arc<Stream>` by the hub, its producer and its subscribers.
pub struct Stream {
    info: StreamInfo,
    hub: Arc<HubState>,
    producer: Mutex<Producer>,
    log: Box<dyn Log>,
    renditions: Mutex<Vec<(String, Arc<Mutex<Rendition>>)>>,
    /// The snapshot's own reduction of the log, made when first asked for.
    state_view: Mutex<Option<StateView>>,
    /// Bytes counted against the hub for this stream.
    held: AtomicU64,
    /// Renditions' changes not yet applied to `held` and the hub (see [`Stream::count`]).
    pending: AtomicI64,
    forgotten: AtomicBool,
    /// Holds something [`Stream::cool`] may give back: set at the end and whenever a reader makes a copy.
    warm: AtomicBool,
    cancel: CancellationToken,
    next_id: AtomicU64,
    /// The client whose budget it counts against, if any.
    client: Option<String>,
    /// When its producer last appended (ms by the hub's clock), for the idle timeout.
    active_ms: AtomicU64,
    /// When a sample of its messages were published, for the publish-to-deliver histogram.
    probes: Probes,
    /// Its live subscriptions (see [`Stream::subscribers`]).
    subscribers: AtomicUsize,
    /// Written on another node and followed here: its producer's side refuses everything, and its status is
    /// its log's.
    followed: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("id", &self.info.id).field("epoch", &self.info.epoch).finish_non_exhaustive()
    }
}

impl Stream {
    /// A new open stream starting with `stream_start`, with room reserved for its `stream_end` and outcome;
    /// refused when the hub cannot hold that, or a stream's limits could not.
    pub(crate) fn new(hub: Arc<HubState>, client: Option<&str>, model: &str) -> Result<Arc<Self>, HubError> {
        let id = hub.config.ids.stream_id();
        let epoch = hub.config.ids.epoch();
        let now_ms = hub.config.clock.now_ms();
        let info = StreamInfo { id, epoch, created_ms: now_ms, model: model.to_owned() };
        let log = hub.config.storage.log(&info, client);
        let stream = Arc::new(Stream {
            info,
            hub,
            producer: Mutex::new(Producer {
                last: 0,
                bytes: 0,
                closings: 0,
                outcome_bytes: 0,
                reducer: Reducer::default(),
                lifecycle: Lifecycle::default(),
                end: None,
                started_ms: now_ms,
                readers: 0,
                receipts: receipts::Receipts::default(),
                on_end: Vec::new(),
            }),
            log,
            renditions: Mutex::new(Vec::new()),
            state_view: Mutex::new(None),
            held: AtomicU64::new(0),
            pending: AtomicI64::new(0),
            forgotten: AtomicBool::new(false),
            subscribers: AtomicUsize::new(0),
            warm: AtomicBool::new(false),
            cancel: CancellationToken::new(),
            next_id: AtomicU64::new(1),
            client: client.map(str::to_owned),
            active_ms: AtomicU64::new(now_ms),
            probes: Probes::default(),
            followed: false,
        });
        let (stream_id, epoch) = (stream.info.id.clone(), stream.info.epoch.clone());
        let start = StreamStart { stream_id, epoch, model: model.to_owned() }.event();
        let limits = &stream.hub.config.limits;
        let mut producer = stream.lock();
        let id = stream.new_id("m");
        let entry = stream.stamp_event(&mut producer, start, id, now_ms);
        let bytes = entry.bytes();
        let (end, outcome) = stream.widest_end();
        if limits.messages_per_stream < 2 || bytes + end > limits.stream_bytes {
            return Err(HubError::StreamLimitsTooSmall {
                messages: limits.messages_per_stream,
                bytes: limits.stream_bytes,
                needed: bytes + end,
            });
        }
        if !stream.reserve((bytes + end) * producer.copies() + outcome) {
            return Err(HubError::HubFull { limit: limits.hub_bytes, retry_after: None });
        }
        producer.bytes += bytes + end;
        producer.closings = 1;
        producer.outcome_bytes = outcome;
        stream.log.append(vec![entry]);
        drop(producer);
        Ok(stream)
    }

    /// A stream kept from before a restart, ended, of `bytes` of entries, holding what its log holds in
    /// memory; see [`super::Hub::restore`].
    pub(crate) fn restored(hub: Arc<HubState>, info: StreamInfo, log: Box<dyn Log>, bytes: u64) -> Arc<Self> {
        let end = log.outcome();
        let stream = Stream::over(hub, info, log, bytes, end, false);
        stream.cancel.cancel();
        stream
    }

    /// A stream written on another node, followed here through `log` (which its follower appends to, the
    /// end included: [`Stream::follower_ended`]); see [`super::Hub::follow`].
    pub(crate) fn followed(hub: Arc<HubState>, info: StreamInfo, log: Box<dyn Log>) -> Arc<Self> {
        Stream::over(hub, info, log, 0, None, true)
    }

    /// A stream over a log with entries already in it, whose producer appends nothing here (`restored`,
    /// `followed`).
    fn over(
        hub: Arc<HubState>,
        info: StreamInfo,
        log: Box<dyn Log>,
        bytes: u64,
        end: Option<Arc<Outcome>>,
        followed: bool,
    ) -> Arc<Self> {
        let last = log.last_sequence();
        let held = log.memory_bytes();
        Arc::new(Stream {
            producer: Mutex::new(Producer {
                last,
                bytes,
                closings: 0,
                outcome_bytes: 0,
                reducer: Reducer::default(),
                lifecycle: Lifecycle::default(),
                end,
                started_ms: info.created_ms,
                readers: 0,
                receipts: receipts::Receipts::default(),
                on_end: Vec::new(),
            }),
            log,
            renditions: Mutex::new(Vec::new()),
            state_view: Mutex::new(None),
            held: AtomicU64::new(held),
            pending: AtomicI64::new(0),
            forgotten: AtomicBool::new(false),
            subscribers: AtomicUsize::new(0),
            warm: AtomicBool::new(false),
            cancel: CancellationToken::new(),
            next_id: AtomicU64::new(last + 1),
            client: None,
            active_ms: AtomicU64::new(info.created_ms),
            probes: Probes::default(),
            followed,
            info,
            hub,
        })
    }

    /// True for a stream written on another node and followed here.
    pub fn is_followed(&self) -> bool {
        self.followed
    }

    /// The follower's entries of a followed stream, in order after its last, counted against the hub.
    pub(crate) fn follow_append(&self, entries: Vec<Entry>) {
        let bytes = entries.iter().map(Entry::bytes).sum();
        self.force(bytes);
        self.log.append(entries);
    }

    /// The follower appended the end of a followed stream: its retention starts.
    pub(crate) fn follower_ended(&self) {
        if self.followed {
            self.warm.store(true, Ordering::Release);
            self.hub.ended(&self.info.id, None);
        }
    }

    /// Waits until the entry `sequence` is where readers can read it: at once in memory; once committed in a
    /// durable store. What an acknowledgement that means "kept" waits for. False when the store could not keep
    /// it (its disk failed): readers have it, a restart would not.
    pub async fn readable(&self, sequence: u64) -> bool {
        if self.log.last_sequence() < sequence {
            self.log.hasten();
        }
        self.kept(sequence).await
    }

    /// Waits as [`Stream::readable`] does, but leaves the commit to the store's writer rather than making it
    /// on the caller's thread: for a caller that goes on appending while it waits (a WebSocket's pipelined
    /// publishes), whose messages the writer then commits many at a time, in parallel with it.
    pub(crate) async fn kept(&self, sequence: u64) -> bool {
        let mut changes = self.log.acknowledgements();
        loop {
            changes.borrow_and_update();
            if !self.log.keeps() {
                self.end_unkept();
                return false;
            }
            if self.log.last_sequence() >= sequence || self.log.is_ended() {
                return true;
            }
            if changes.changed().await.is_err() {
                return self.log.keeps();
            }
        }
    }

    /// The stream's id: URL-safe and unguessable.
    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// This incarnation's epoch: a client that kept another epoch must start over, its history is gone.
    pub fn epoch(&self) -> &str {
        &self.info.epoch
    }

    /// The model (agent) name the stream reports.
    pub fn model(&self) -> &str {
        &self.info.model
    }

    /// The facts every format derives what it needs from.
    pub fn info(&self) -> &StreamInfo {
        &self.info
    }

    /// The log its readers read.
    pub fn log(&self) -> &dyn Log {
        &*self.log
    }

    /// The token that fires when someone cancels the stream.
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// A new id unique in this stream, with a prefix (`m` for messages, `b` for blocks): `m7-<epoch>`. The
    /// epoch keeps the stream's own ids apart from any a producer picks (`m1` is a common choice).
    pub fn new_id(&self, prefix: &str) -> String {
        let short = self.info.epoch.get(..8).unwrap_or(&self.info.epoch);
        format!("{prefix}{}-{short}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, Producer> {
        lock(&self.producer)
    }

    /// When a sample of its messages were published.
    #[inline]
    pub(crate) fn probes(&self) -> &Probes {
        &self.probes
    }

    /// What it shares with the hub: the config, the byte count.
    #[inline]
    pub(crate) fn hub_state(&self) -> &HubState {
        &self.hub
    }

    /// The status now.
    pub fn status(&self) -> Status {
        if self.followed {
            return Status::of(self.log.outcome().as_deref());
        }
        Status::of(self.lock().end.as_deref())
    }

    /// The status, the epoch and every message's current state, as the log says: a reader like any other,
    /// it reduces the log's entries into its own state, caught up on each call (made on the first).
    pub fn snapshot(&self) -> Snapshot {
        let mut view = lock(&self.state_view);
        let view = view.get_or_insert_with(|| {
            // Never refused: a status request must answer, and this adds at most the log once more.
            self.add_reader(false);
            StateView::default()
        });
        // The status first: if it says ended, the reduction below reaches the end.
        let status = Status::of(self.log.outcome().as_deref());
        let mut entries = Vec::new();
        while self.log.read(view.read, CHUNK, &mut entries).is_ok() {
            let before = view.read;
            for entry in entries.drain(..) {
                if let Entry::Message { message, .. } = entry {
                    // The log holds only what the producer's reducer accepted: this cannot be refused.
                    let _ = view.reducer.apply(&message);
                    view.read += 1;
                }
            }
            if view.read == before {
                break;
            }
        }
        Snapshot {
            id: self.info.id.clone(),
            status,
            epoch: self.info.epoch.clone(),
            last_sequence: view.read,
            messages: view.reducer.messages().to_vec(),
        }
    }

    /// Every message the log still keeps, as stamped, in order.
    pub fn history(&self) -> Vec<OutputMessage> {
        let mut entries = Vec::new();
        let _ = self.log.read(0, usize::MAX, &mut entries);
        entries
            .into_iter()
            .filter_map(|entry| match entry {
                Entry::Message { message, .. } => Some(Arc::unwrap_or_clone(message)),
                Entry::End(_) => None,
            })
            .collect()
    }

    /// How the stream ended, once it has.
    pub fn outcome(&self) -> Option<Outcome> {
        if self.followed {
            return self.log.outcome().as_deref().cloned();
        }
        self.lock().end.as_deref().cloned()
    }

    /// Waits until the producer has appended its first message (anything after `stream_start`) or the
    /// stream has ended. Returns the outcome when the stream ended with an error having said nothing: a
    /// client that has received nothing yet can be told that as an HTTP status rather than a stream.
    ///
    /// It waits for the producer, not for the readers: a first message that is not the end is seen as soon
    /// as it is appended, while a store commits it, so that what the caller does next (a front door: its
    /// response and the subscription behind it) happens beside the commit rather than after it, and the
    /// subscription reads the message once committed. Only an end, where the answer hangs on whether the
    /// stream said anything before it, is read from the log, and so waits for its commit.
    pub async fn first_message(&self) -> Option<Outcome> {
        if !self.followed {
            let mut appended = self.log.appended();
            loop {
                appended.borrow_and_update();
                let (last, ended) = {
                    let producer = self.lock();
                    (producer.last, producer.end.is_some())
                };
                if ended {
                    break;
                }
                if last > 1 || appended.changed().await.is_err() {
                    return None;
                }
            }
        }
        let mut changes = self.log.changes();
        loop {
            changes.borrow_and_update();
            // The outcome first: it is appended with `stream_end`, so a log that has only those said nothing.
            if let Some(outcome) = self.log.outcome() {
                let mut entries = Vec::new();
                let _ = self.log.read(1, 2, &mut entries);
                let said = entries.iter().any(|e| match e {
                    Entry::Message { message, .. } => {
                        !(message.kind == "event" && message.prop_str("event") == Some("stream_end"))
                    }
                    Entry::End(_) => false,
                });
                return (!said && outcome.status == EndStatus::Error).then(|| Outcome::clone(&outcome));
            }
            if self.log.last_sequence() > 1 || changes.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Waits until the stream has ended, and returns how.
    pub async fn ended(&self) -> Outcome {
        let mut changes = self.log.changes();
        loop {
            changes.borrow_and_update();
            if let Some(outcome) = self.log.outcome() {
                return Outcome::clone(&outcome);
            }
            if changes.changed().await.is_err() {
                // The sender lives in the log, which lives in `self`: this cannot happen while we hold `&self`.
                return Outcome::completed();
            }
        }
    }

    /// When its producer last appended (ms by the hub's clock), while it is open.
    pub(crate) fn active_ms(&self) -> Option<u64> {
        // A followed stream's idle timeout is its writer's to apply.
        (!self.followed && !self.log.is_ended()).then(|| self.active_ms.load(Ordering::Acquire))
    }

    /// The last sequence appended.
    pub fn last_sequence(&self) -> u64 {
        if self.followed {
            return self.log.last_sequence();
        }
        self.lock().last
    }
}

/// What the snapshot has reduced of the log.
#[derive(Default)]
struct StateView {
    reducer: Reducer,
    /// The last sequence reduced.
    read: u64,
}

/// Entries the snapshot reduces per read from the log.
const CHUNK: usize = 1024;

/// Stamps `message` with its sequence, the time, and the trace id its producer gave (if any).
#[inline]
pub(crate) fn stamp(message: &mut OutputMessage, sequence: u64, now_ms: u64, trace_id: Option<String>) {
    message.metadata = Some(Metadata { sequence: Some(sequence), timestamp: Some(now_ms), trace_id });
}

/// A value's size as compact JSON, without building it.
fn json_size(message: &impl Serialize) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, message);
    count.0
}
