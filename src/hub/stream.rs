//! [`Stream`]: what a stream does for its producer, over a [`Log`] that its readers read.
//!
//! Appending validates each message, stamps it (sequence from 1 without gaps, timestamp, a `message_id`
//! where the producer gave none, the `block_id` and `thread_id` of the message a delta continues), runs it
//! through the delta reducer, adds the lifecycle events that go before it, counts it against the limits,
//! and hands the stamped entries to the log. A batch is all or nothing, however it is refused (a message
//! that fails validation, a delta the reducer refuses, a limit): the reducer is rolled back through its
//! undo journal, the lifecycle through its own (what it opened and counted), and every byte counted for the
//! batch given back, so the stream is exactly as before and a retry meets the same stream.
//!
//! Readers never touch the producer's state: renditions, subscriptions and the snapshot read the log
//! (`log.rs`), each behind its own mutex (`rendition.rs`), so a producer never waits for a reader, and a
//! reader rendering a long log never holds up an append. The producer keeps a reducer of its own only to
//! decide whether a delta applies (counted like a copy of the log, below).
//!
//! The producer's state sits behind a `std::sync::Mutex`: no `.await` happens while it is held and every
//! critical section is short (stamping and reducing one batch), which a tokio mutex would only make slower.
//!
//! # What a stream counts
//!
//! Everything it holds is counted against the hub's byte limit (`held`): each log entry as JSON when it is
//! appended, the stream's own first event included, once more for the producer's own reduction of the log
//! (the reducer that decides whether a delta applies: a reduced message is at most the entries it came
//! from), and for each rendition in use an estimate of the same size per entry, replaced by the real figure
//! (frames, offsets, the renderer's state) once rendered. The snapshot's reduction of the log, once asked
//! for, counts like a rendition whose estimate stands. So an
//! append is refused when the hub could not hold it in every format in use, and a subscription that needs a
//! new rendition is refused when the hub could not hold the log once more. All of it is given back when the
//! stream is evicted.
//!
//! # What an ended stream keeps
//!
//! Once a stream has ended (and its log has the end: a store's log, once it is committed), nothing appends
//! to it again, so most of what it held is of no more use: the producer's reduction, and the renditions,
//! whose frames are most of a stream's memory (a rendition is made again from the log when a subscriber
//! comes). A rendition goes when its last subscriber is done with it; the reduction, and any rendition a
//! subscriber let go of while holding a batch, at the hub's next sweep ([`Stream::cool`]), which then counts
//! the stream again at what it still holds: its log's part in memory (all of it for a log in memory; only
//! the outcome for a store's, which reads the rest back from disk), the renditions still read, the
//! snapshot's reduction and the outcome. Until that sweep the count stays as it was, which only errs high.
//!
//! # Room to close
//!
//! A stream's own events are never the way past a limit. Every event that opens something reserves the
//! room for the event that will close it (`lifecycle.rs`: its widest form, names bounded and numbers at
//! their largest, stamped with the widest id, sequence and time): `stream_start` for `stream_end` (and for
//! the outcome the log keeps beside it, counted once), `message_start` for `message_end`, `block_start` for
//! `block_end`. The room is a place among the stream's messages and its bytes, counted in the stream's
//! bytes and against the hub like an entry (once per copy, so a reader added later counts it too). A
//! producer's message that would leave no room for what is reserved is refused (`TooManyMessages`,
//! `StreamFull`, `HubFull`), the opening events it calls for included; a batch refused gives back the room
//! its openings reserved with everything else. A closing event then always fits: it takes its room and gives
//! back the difference, so `end_message`, `end_block`, a cancel or a shutdown never add to any count. The one
//! thing that may need more than its room is an outcome larger than the widest an internal end keeps (an
//! error with details, a long message): [`Stream::try_end`] (a producer's end) counts the difference like a
//! message and is refused when it does not fit, changing nothing; [`Stream::end`] (an agent's, a cancel, a
//! shutdown) counts it when it fits, and otherwise shrinks the outcome into its room.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::lifecycle::{self, Closing, Lifecycle, Opened, Opening};
use super::log::{Entry, Gone, Log, write_json};
use super::probes::Probes;
use super::render::{Render, StreamInfo};
use super::rendition::{Counted, Rendition};
use super::subscription::Subscription;
use super::error::HubError;
use super::state::HubState;
use crate::output::{
    DeltaError, EndStatus, ErrorProps, LifecycleEvent, Metadata, Outcome, OutputMessage, Reducer, StreamStart, Undo,
    ValidationError,
};
use crate::sync::lock;

/// Why an append was refused. Nothing of the batch was appended.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// The stream has ended.
    #[error("the stream has ended")]
    Ended,
    /// The message is not valid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A delta the reducer cannot apply.
    #[error(transparent)]
    Delta(#[from] DeltaError),
    /// One message is over the size limit.
    #[error("the message is {size} bytes, over the limit of {limit}")]
    MessageTooLarge {
        /// Its size as JSON.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The stream holds as many messages as it may.
    #[error("the stream has reached its limit of {limit} messages")]
    TooManyMessages {
        /// The limit.
        limit: usize,
    },
    /// The stream holds as many bytes as it may.
    #[error("the stream has reached its limit of {limit} bytes")]
    StreamFull {
        /// The limit.
        limit: u64,
    },
    /// The hub holds as many bytes as it may.
    #[error("the service has reached its limit of {limit} bytes of messages")]
    HubFull {
        /// The limit.
        limit: u64,
    },
    /// The stream is written on another node: this one follows it ([`super::Hub::follow`]).
    #[error("the stream is written on another node")]
    Elsewhere,
}

/// A refused batch: which message (from 0) and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("message {index}: {error}")]
pub struct BatchError {
    /// The position of the refused message in the batch.
    pub index: usize,
    /// Why.
    pub error: AppendError,
}

/// Why a subscription could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// Resuming after a sequence the stream has not reached (another epoch's, or made up).
    #[error("sequence {from} is beyond the stream's last sequence {last}")]
    SequenceAhead {
        /// What was asked.
        from: u64,
        /// The last sequence there is.
        last: u64,
    },
    /// The hub could not hold one more rendering of the stream.
    #[error("the service has reached its limit of {limit} bytes and cannot render this stream in one more format")]
    HubFull {
        /// The limit.
        limit: u64,
    },
}

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
}

impl Producer {
    /// How many times an entry is counted: the log, the producer's own reduction (`reducer`, at most the
    /// entries it came from), and each reader.
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
            }),
            log,
            renditions: Mutex::new(Vec::new()),
            state_view: Mutex::new(None),
            held: AtomicU64::new(0),
            pending: AtomicI64::new(0),
            forgotten: AtomicBool::new(false),
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
        let end = stream.reservation(lifecycle::stream_end(&lifecycle::widest_outcome(), u64::MAX));
        let outcome = json_size(&lifecycle::widest_outcome());
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
            }),
            log,
            renditions: Mutex::new(Vec::new()),
            state_view: Mutex::new(None),
            held: AtomicU64::new(held),
            pending: AtomicI64::new(0),
            forgotten: AtomicBool::new(false),
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

    /// Why a followed stream refuses a write: it has ended, or another node writes it.
    fn refusal_when_followed(&self) -> AppendError {
        if self.log.is_ended() { AppendError::Ended } else { AppendError::Elsewhere }
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
        let mut changes = self.log.acknowledgements();
        if self.log.last_sequence() < sequence {
            self.log.hasten();
        }
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

    /// Ends the stream with the error `store_unavailable` (and cancels what runs it) when its log could not
    /// keep what it was given, as a store whose disk failed: whoever waits for an acknowledgement and the
    /// hub's sweep (for a stream nobody waits on) call it. True when it ended the stream.
    pub(crate) fn end_unkept(&self) -> bool {
        if self.log.keeps() {
            return false;
        }
        let outcome = Outcome::failed(ErrorProps {
            message: NOT_KEPT.into(),
            code: Some("store_unavailable".into()),
            details: None,
        });
        let ended = self.stop(outcome);
        if ended {
            tracing::error!(stream = self.info.id, "messages not kept: the stream is ended");
        }
        ended
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

    fn lock(&self) -> MutexGuard<'_, Producer> {
        lock(&self.producer)
    }

    /// When a sample of its messages were published.
    pub(crate) fn probes(&self) -> &Probes {
        &self.probes
    }

    /// What it shares with the hub: the config, the byte count.
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
    pub async fn first_message(&self) -> Option<Outcome> {
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

    /// Appends one message; returns its sequence.
    pub fn append(&self, message: OutputMessage) -> Result<u64, AppendError> {
        self.append_batch(vec![message]).map(|s| s.into_iter().next().unwrap_or_default()).map_err(|e| e.error)
    }

    /// Appends messages all or nothing; returns their sequences.
    pub fn append_batch(&self, messages: Vec<OutputMessage>) -> Result<Vec<u64>, BatchError> {
        self.append_staged(messages, false)
    }

    /// Appends messages all or nothing, as [`Stream::append_batch`] does, and waits until they are kept
    /// ([`Stream::readable`]): their sequences, and false when the store could not keep them. With a store,
    /// the wait commits them on this thread when nothing else is committing, rather than handing them to the
    /// store's writer and waiting to be woken back.
    pub async fn append_batch_kept(&self, messages: Vec<OutputMessage>) -> Result<(Vec<u64>, bool), BatchError> {
        let sequences = self.append_staged(messages, true)?;
        let kept = match sequences.last() {
            Some(&last) => self.readable(last).await,
            None => true,
        };
        Ok((sequences, kept))
    }

    /// `awaited`: the caller waits for the batch to be readable next (see [`Log::append_awaited`]).
    fn append_staged(&self, messages: Vec<OutputMessage>, awaited: bool) -> Result<Vec<u64>, BatchError> {
        for (index, message) in messages.iter().enumerate() {
            message.validate().map_err(|e| BatchError { index, error: e.into() })?;
        }
        if self.followed {
            return Err(BatchError { index: 0, error: self.refusal_when_followed() });
        }
        let mut producer = self.lock();
        if producer.end.is_some() {
            return Err(BatchError { index: 0, error: AppendError::Ended });
        }
        let mut staged = Staged::default();
        staged.entries.reserve(messages.len());
        staged.sequences.reserve(messages.len());
        if messages.len() > 1 {
            // Room for the lifecycle events a batch usually adds too (a message or block that starts), so the
            // journal is not moved to a larger allocation halfway.
            staged.undo.reserve(messages.len() + LIFECYCLE_ROOM);
        }
        if let Err(error) = self.stage(&mut producer, messages, &mut staged) {
            producer.reducer.rollback(staged.undo);
            producer.lifecycle.rollback(staged.opened);
            self.release(staged.reserved);
            return Err(error);
        }
        producer.bytes += staged.bytes;
        producer.closings += staged.closings;
        producer.last += staged.entries.len() as u64;
        // The time the batch was stamped with: reading the clock again would tick a test's stepping clock.
        if let Some(Entry::Message { message, .. }) = staged.entries.last() {
            let stamped = message.metadata.as_ref().and_then(|m| m.timestamp);
            self.active_ms.store(stamped.unwrap_or_default(), Ordering::Release);
        }
        if awaited {
            self.log.append_awaited(staged.entries);
        } else {
            self.log.append(staged.entries);
        }
        self.probes.appended(producer.last);
        Ok(staged.sequences)
    }

    /// Stamps, counts and reduces a batch into `staged`, with the lifecycle events it calls for. On error
    /// the caller rolls back with `staged.undo` and gives back `staged.reserved`.
    ///
    /// Every message is counted against the limits before it is reduced, so nothing can refuse it after
    /// the reducer took it: a lone message (the common case, which skips the undo journal) is reduced last
    /// and alone, and its reduction is atomic.
    fn stage(
        &self,
        producer: &mut Producer,
        messages: Vec<OutputMessage>,
        staged: &mut Staged,
    ) -> Result<(), BatchError> {
        let limits = &self.hub.config.limits;
        let logged = messages.len() > 1;
        let copies = producer.copies();
        // The batch's messages as JSON, back to back: copied at the end into one block of exactly their size,
        // which each entry holds a slice of (one allocation per batch, not one per message).
        let mut json = Vec::with_capacity((messages.len() * 256).min(JSON_SCRATCH));
        for (index, mut message) in messages.into_iter().enumerate() {
            let fail = |error| Err(BatchError { index, error });
            let now_ms = self.hub.config.clock.now_ms();
            let known = producer.reducer.slot_of(&message).map(|slot| &producer.reducer.messages()[slot]);
            let new = known.is_none();
            if let Some(known) = known {
                if message.block_id.is_none() {
                    message.block_id.clone_from(&known.block_id);
                }
                if message.thread_id.is_none() {
                    message.thread_id.clone_from(&known.thread_id);
                }
            }
            if message.message_id.is_none() {
                message.message_id = Some(self.new_id("m"));
            }
            // The events this message opens with, and the room for the events that will close what they open.
            let (mut events_bytes, mut closing_bytes, mut closings) = (0, 0, 0);
            for Opening { mut event, widest_end } in
                producer.lifecycle.before(&message, new, now_ms, &mut staged.opened)
            {
                event.message_id = Some(self.new_id("m"));
                stamp(&mut event, producer.last + staged.entries.len() as u64 + 1, now_ms, None);
                // A lifecycle event starts a new message: the reducer cannot refuse it.
                let _ = producer.reducer.apply_logged(&event, &mut staged.undo);
                let entry = Entry::message(event);
                events_bytes += entry.bytes();
                closing_bytes += self.reservation(widest_end);
                closings += 1;
                staged.entries.push(entry);
            }
            let sequence = producer.last + staged.entries.len() as u64 + 1;
            let trace_id = message.metadata.take().and_then(|m| m.trace_id);
            stamp(&mut message, sequence, now_ms, trace_id);
            let start = json.len();
            write_json(&mut json, &message);
            let size = (json.len() - start) as u64;
            if size > limits.message_bytes {
                return fail(AppendError::MessageTooLarge { size, limit: limits.message_bytes });
            }
            // Room must stay for every closing event reserved, this message's included.
            if sequence + producer.closings + staged.closings + closings > limits.messages_per_stream as u64 {
                return fail(AppendError::TooManyMessages { limit: limits.messages_per_stream });
            }
            let bytes = events_bytes + closing_bytes + size;
            if producer.bytes + staged.bytes + bytes > limits.stream_bytes {
                return fail(AppendError::StreamFull { limit: limits.stream_bytes });
            }
            let needed = bytes * copies;
            if !self.reserve(needed) {
                return fail(AppendError::HubFull { limit: limits.hub_bytes });
            }
            staged.reserved += needed;
            let applied = if logged {
                producer.reducer.apply_logged(&message, &mut staged.undo)
            } else {
                producer.reducer.apply(&message)
            };
            if let Err(error) = applied {
                return fail(error.into());
            }
            staged.bytes += bytes;
            staged.closings += closings;
            staged.sequences.push(sequence);
            staged.entries.push(Entry::Message { message: Arc::new(message), bytes: size, json: None });
        }
        // Every entry without its JSON yet is a message of the batch, in order (lifecycle events have theirs).
        let block = Bytes::copy_from_slice(&json);
        let mut at = 0;
        for entry in &mut staged.entries {
            if let Entry::Message { bytes, json: slot @ None, .. } = entry {
                let end = at + *bytes as usize;
                *slot = Some(block.slice(at..end));
                at = end;
            }
        }
        Ok(())
    }

    /// Ends an open message (one that streams in deltas): appends its `message_end`, into the room reserved
    /// for it when the message opened. `Ok(None)` when it was not open.
    pub fn end_message(&self, message_id: &str) -> Result<Option<u64>, AppendError> {
        self.append_closings(|lifecycle, now_ms| lifecycle.end_message(message_id, now_ms).into_iter().collect())
    }

    /// Ends an open block: `message_end` for its open messages, then `block_end`, into their reserved room.
    pub fn end_block(&self, block_id: &str) -> Result<Option<u64>, AppendError> {
        self.append_closings(|lifecycle, now_ms| lifecycle.end_block(block_id, now_ms))
    }

    /// Appends the stream's own closing events; returns the last one's sequence.
    fn append_closings(
        &self,
        closings: impl FnOnce(&mut Lifecycle, u64) -> Vec<Closing>,
    ) -> Result<Option<u64>, AppendError> {
        let mut producer = self.lock();
        if producer.end.is_some() {
            return Err(AppendError::Ended);
        }
        let now_ms = self.hub.config.clock.now_ms();
        let closings = closings(&mut producer.lifecycle, now_ms);
        let entries: Vec<Entry> = closings
            .into_iter()
            .map(|closing| {
                let id = self.new_id("m");
                self.push_closing(&mut producer, closing, id, now_ms)
            })
            .collect();
        let last = (!entries.is_empty()).then_some(producer.last);
        self.log.append(entries);
        self.active_ms.store(now_ms, Ordering::Release);
        Ok(last)
    }

    /// Ends the stream: ends what is open, appends `stream_end`, and records the outcome. `false` when it had
    /// already ended.
    ///
    /// It cannot be refused (an agent's end, a cancel, a shutdown): the closing events go into the room
    /// reserved for them, and an outcome larger than its room (an agent's long error, its details) is kept
    /// whole when the limits have room for the difference, and otherwise shrunk to fit its room (the
    /// error's details dropped, its message and code cut). An error code is a name: one over
    /// [`crate::output::NAME_BYTES`] is cut to it. See [`Stream::try_end`] for an end that may be refused
    /// instead.
    pub fn end(&self, outcome: Outcome) -> bool {
        self.finish(outcome, false, false).unwrap_or(false)
    }

    /// Ends the stream as [`Stream::end`] does, but with an outcome a producer sent: one that does not fit is
    /// refused rather than shrunk, and the stream stays open as it was, so the producer may end it again
    /// with less. Refused: [`AppendError::Ended`]; [`AppendError::Invalid`] for an error `code` over
    /// [`crate::output::NAME_BYTES`]; [`AppendError::MessageTooLarge`] when its `stream_end` would be over
    /// the message size limit; [`AppendError::StreamFull`] or [`AppendError::HubFull`] when the room reserved
    /// for the end and the limits together cannot hold it.
    pub fn try_end(&self, outcome: Outcome) -> Result<(), AppendError> {
        outcome.validate()?;
        self.finish(outcome, true, false).map(|_| ())
    }

    /// Ends the stream; see [`Stream::end`] (`refusable`: false) and [`Stream::try_end`]. `cancelling`: fires
    /// the cancellation token too, once the end is in the log and before anyone else may append (see
    /// [`Stream::stop`]).
    fn finish(&self, mut outcome: Outcome, refusable: bool, cancelling: bool) -> Result<bool, AppendError> {
        if self.followed {
            return if refusable { Err(self.refusal_when_followed()) } else { Ok(false) };
        }
        let mut producer = self.lock();
        if producer.end.is_some() {
            return if refusable { Err(AppendError::Ended) } else { Ok(false) };
        }
        let limits = &self.hub.config.limits;
        let copies = producer.copies();
        let now_ms = self.hub.config.clock.now_ms();
        let duration_ms = now_ms.saturating_sub(producer.started_ms);
        // One closing event for each open message and block, ended only once the end cannot be refused.
        let open = producer.lifecycle.open();
        // Ids in the order of the events, taken now to size `stream_end` before anything is appended.
        let ids: Vec<String> = (0..open).map(|_| self.new_id("m")).collect();
        let end_id = self.new_id("m");
        let sequence = producer.last + open as u64 + 1;
        let sized = |outcome: &Outcome| {
            let mut end = lifecycle::stream_end(outcome, duration_ms);
            end.message_id = Some(end_id.clone());
            stamp(&mut end, sequence, now_ms, None);
            let size = json_size(&end);
            (end, size, json_size(outcome))
        };
        let mut room = self.reservation(lifecycle::stream_end(&lifecycle::widest_outcome(), u64::MAX));
        let mut outcome_room = producer.outcome_bytes;
        if !refusable {
            lifecycle::bound_code(&mut outcome);
        }
        let (mut end, mut size, mut outcome_size) = sized(&outcome);
        // What does not fit the reserved room is counted like a producer's message, and may be refused.
        let (extra, outcome_extra) = (size.saturating_sub(room), outcome_size.saturating_sub(outcome_room));
        let refused = if extra == 0 && outcome_extra == 0 {
            None
        } else if size > limits.message_bytes {
            Some(AppendError::MessageTooLarge { size, limit: limits.message_bytes })
        } else if producer.bytes + extra > limits.stream_bytes {
            Some(AppendError::StreamFull { limit: limits.stream_bytes })
        } else if !self.reserve(extra * copies + outcome_extra) {
            Some(AppendError::HubFull { limit: limits.hub_bytes })
        } else {
            None
        };
        match refused {
            None => {
                producer.bytes += extra;
                (room, outcome_room) = (room + extra, outcome_room + outcome_extra);
            }
            Some(error) if refusable => return Err(error),
            Some(_) => {
                lifecycle::shrink(&mut outcome, |o| {
                    let (_, size, outcome_size) = sized(o);
                    size <= room && outcome_size <= outcome_room
                });
                (end, size, outcome_size) = sized(&outcome);
            }
        }
        let closings = producer.lifecycle.end_all(now_ms);
        let mut entries: Vec<Entry> = closings
            .into_iter()
            .zip(ids)
            .map(|(closing, id)| self.push_closing(&mut producer, closing, id, now_ms))
            .collect();
        // The reducer takes any event that starts a message.
        let _ = producer.reducer.apply(&end);
        producer.last = sequence;
        self.settle(&mut producer, room, size);
        producer.closings = producer.closings.saturating_sub(1);
        if outcome_size < outcome_room {
            self.release(outcome_room - outcome_size);
        }
        producer.outcome_bytes = outcome_size;
        entries.push(Entry::message(end));
        let outcome = Arc::new(outcome);
        entries.push(Entry::End(Arc::clone(&outcome)));
        producer.end = Some(outcome);
        self.log.append(entries);
        if cancelling {
            self.cancel.cancel();
        }
        drop(producer);
        self.warm.store(true, Ordering::Release);
        self.hub.ended(&self.info.id, self.client.as_deref());
        Ok(true)
    }

    /// Cancels the stream: fires the cancellation token the agent watches and ends the stream `cancelled`.
    /// `false` when it had already ended.
    pub fn cancel(&self) -> bool {
        self.stop(Outcome::cancelled())
    }

    /// Ends the stream with `outcome` as [`Stream::end`] does, and fires the cancellation token the agent
    /// watches (a cancel, a shutdown, an idle timeout, a store that failed). `false` when it had already
    /// ended; the token fires either way.
    ///
    /// The token fires after the end and before the producer's lock is let go: an agent woken by it that
    /// ends the stream finds it ended (its outcome does not win), and an agent whose emit is refused because
    /// the stream ended already sees itself cancelled.
    pub(crate) fn stop(&self, outcome: Outcome) -> bool {
        let ended = self.finish(outcome, false, true).unwrap_or(false);
        self.cancel.cancel();
        ended
    }

    /// Subscribes through `render` to the messages after sequence `after` (0: from the start), then the
    /// live tail, until the stream ends.
    pub fn subscribe(
        self: &Arc<Self>,
        render: impl Into<Arc<dyn Render>>,
        after: u64,
    ) -> Result<Subscription, SubscribeError> {
        let changes = self.log.changes();
        let last = self.log.last_sequence();
        if after > last {
            return Err(SubscribeError::SequenceAhead { from: after, last });
        }
        let render = render.into();
        let rendition = self.rendition(Arc::clone(&render))?;
        let shared = {
            let mut rendition = lock(&rendition);
            let mut counted = Counted::default();
            while rendition.rendered() < after && rendition.catch_up(&*self.log, &mut counted) {}
            self.count(counted);
            (rendition.frame_after(after), rendition.renders())
        };
        let (cursor, private) = match shared {
            (Some(cursor), _) => (cursor, None),
            (None, renders) => {
                // Its frames are behind the shared rendition's window: rendered again for this subscriber.
                let mut private = Rendition::private(render.renderer(&self.info), renders);
                let mut counted = Counted::default();
                while private.rendered() < after && private.catch_up(&*self.log, &mut counted) {
                    let rendered = private.rendered();
                    private.trim_before(private.frame_after(rendered).unwrap_or(0));
                }
                (private.frame_after(after).unwrap_or(private.len()), Some(private))
            }
        };
        Ok(Subscription::new(Arc::clone(self), rendition, render, private, cursor, changes))
    }

    /// The rendition for `render`'s key, made (and counted) if new.
    fn rendition(&self, render: Arc<dyn Render>) -> Result<Arc<Mutex<Rendition>>, SubscribeError> {
        let mut renditions = lock(&self.renditions);
        if let Some((_, rendition)) = renditions.iter().find(|(key, _)| key == render.key()) {
            return Ok(Arc::clone(rendition));
        }
        // `forget` sets its flag before it takes the renditions' lock, which is held here.
        if !self.add_reader(true) {
            return Err(SubscribeError::HubFull { limit: self.hub.config.limits.hub_bytes });
        }
        let renders = self.hub.renders_of(render.key());
        let rendition = Arc::new(Mutex::new(Rendition::new(render.renderer(&self.info), renders)));
        renditions.push((render.key().to_owned(), Arc::clone(&rendition)));
        Ok(rendition)
    }

    /// Counts one more reader with a copy of the whole log (a rendition, the snapshot's reduction): the log
    /// once more now, and every later entry once more as it is appended. `false` (nothing counted) when
    /// `refusable` and the hub cannot hold it. A forgotten stream (evicted while someone kept its handle) has
    /// no log left to copy, so nothing is counted for it.
    fn add_reader(&self, refusable: bool) -> bool {
        if self.forgotten.load(Ordering::Acquire) {
            return true;
        }
        let mut producer = self.lock();
        if refusable {
            if !self.reserve(producer.bytes) {
                return false;
            }
        } else {
            self.force(producer.bytes);
        }
        producer.readers += 1;
        self.warm.store(true, Ordering::Release);
        true
    }

    /// Stamps one of the stream's closing events and reduces it; it takes the room reserved for it.
    fn push_closing(&self, producer: &mut Producer, closing: Closing, id: String, now_ms: u64) -> Entry {
        let room = self.reservation(closing.widest);
        let entry = self.stamp_event(producer, closing.event, id, now_ms);
        self.settle(producer, room, entry.bytes());
        producer.closings = producer.closings.saturating_sub(1);
        entry
    }

    /// A closing event of `bytes` took the place of the `room` reserved for it: the stream's count and the
    /// hub's (once per copy) give back the difference. (A closing event is never larger than its room; if it
    /// were, the difference would be counted regardless.)
    fn settle(&self, producer: &mut Producer, room: u64, bytes: u64) {
        let copies = producer.copies();
        producer.bytes = (producer.bytes + bytes).saturating_sub(room);
        match bytes.cmp(&room) {
            std::cmp::Ordering::Less => self.release((room - bytes) * copies),
            std::cmp::Ordering::Greater => self.force((bytes - room) * copies),
            std::cmp::Ordering::Equal => {}
        }
    }

    /// The room a closing event takes at most, given its widest form: stamped with the widest id and
    /// sequence and time the stream can give it.
    fn reservation(&self, mut widest: OutputMessage) -> u64 {
        let short = self.info.epoch.get(..8).unwrap_or(&self.info.epoch);
        widest.message_id = Some(format!("m{}-{short}", u64::MAX));
        stamp(&mut widest, u64::MAX, u64::MAX, None);
        json_size(&widest)
    }

    /// Stamps one of the stream's own events with `id` and the next sequence, and reduces it.
    fn stamp_event(&self, producer: &mut Producer, mut message: OutputMessage, id: String, now_ms: u64) -> Entry {
        message.message_id = Some(id);
        producer.last += 1;
        stamp(&mut message, producer.last, now_ms, None);
        // The stream's own events start new messages: the reducer cannot refuse them.
        let _ = producer.reducer.apply(&message);
        Entry::message(message)
    }

    /// Counts `bytes` against the hub's limit; `false` (and nothing counted) when they do not fit.
    fn reserve(&self, bytes: u64) -> bool {
        let fits = self.hub.reserve(bytes);
        if fits {
            self.held.fetch_add(bytes, Ordering::AcqRel);
        }
        fits
    }

    /// Counts bytes that must be held regardless.
    fn force(&self, bytes: u64) {
        self.hub.force_reserve(bytes);
        self.held.fetch_add(bytes, Ordering::AcqRel);
    }

    fn release(&self, bytes: u64) {
        let released =
            self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| Some(held.saturating_sub(bytes)));
        let before = released.unwrap_or(0);
        self.hub.release(before.min(bytes));
    }

    /// Applies what a rendition's catch-up changed in the count.
    ///
    /// The hub-wide count is one atomic that every stream's producer and readers share, so a catch-up's
    /// change is gathered per stream and applied in steps of [`COUNT_STEP`] bytes (and when a rendition
    /// finishes): the hub's count trails what renditions hold by less than a step per stream.
    pub(crate) fn count(&self, counted: Counted) {
        if counted == Counted::default() || self.forgotten.load(Ordering::Acquire) {
            return;
        }
        let change = counted.added as i64 - counted.estimated as i64 - counted.dropped as i64;
        let pending = self.pending.fetch_add(change, Ordering::AcqRel) + change;
        if pending.abs() < COUNT_STEP && !counted.finished {
            return;
        }
        let pending = self.pending.swap(0, Ordering::AcqRel);
        match pending.cmp(&0) {
            std::cmp::Ordering::Greater => self.force(pending.unsigned_abs()),
            std::cmp::Ordering::Less => self.release(pending.unsigned_abs()),
            std::cmp::Ordering::Equal => {}
        }
    }

    /// Bytes counted against the hub for this stream.
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Gives back what an ended stream no longer needs (see "What an ended stream keeps"): the producer's
    /// reduction, and the renditions no subscriber holds; then counts against the hub what it still holds.
    /// The hub's sweep calls it about once a second; it returns at once for a stream with nothing to give.
    pub(crate) fn cool(&self) {
        // Not before the log has its end (a store's: committed), which is when the log gives back its part.
        if !self.warm.load(Ordering::Acquire) || !self.log.is_ended() || self.forgotten.load(Ordering::Acquire) {
            return;
        }
        self.warm.store(false, Ordering::Release);
        let mut producer = self.lock();
        producer.reducer = Reducer::default();
        producer.lifecycle = Lifecycle::default();
        let (bytes, outcome_bytes) = (producer.bytes, producer.outcome_bytes);
        drop(producer);
        let mut renditions = lock(&self.renditions);
        // Held only here: no subscriber reads it, and a later one renders the log again.
        renditions.retain(|(_, rendition)| Arc::strong_count(rendition) > 1);
        if renditions.is_empty() {
            self.log.release();
        } else {
            // A subscriber still reads one: look again at the next sweep.
            self.warm.store(true, Ordering::Release);
        }
        let view = lock(&self.state_view).as_ref().map_or(0, |_| bytes);
        let held: u64 = renditions.iter().map(|(_, rendition)| lock(rendition).held_bytes(bytes)).sum::<u64>()
            + self.log.memory_bytes()
            + outcome_bytes
            + view;
        let mut producer = self.lock();
        producer.readers = renditions.len() as u64 + u64::from(view > 0);
        drop(producer);
        // What catch-ups had pending is in the figure now.
        self.pending.store(0, Ordering::Release);
        let before = self.held.load(Ordering::Acquire);
        match held.cmp(&before) {
            std::cmp::Ordering::Less => self.release(before - held),
            std::cmp::Ordering::Greater => self.force(held - before),
            std::cmp::Ordering::Equal => {}
        }
    }

    /// A subscriber is done with `rendition`: an ended stream drops it, and gives back what it was counted
    /// at, when nobody else holds it (its frames are most of what a stream holds; a later subscriber renders
    /// the log again).
    pub(crate) fn unsubscribed(&self, rendition: &Arc<Mutex<Rendition>>) {
        if !self.log.is_ended() || self.forgotten.load(Ordering::Acquire) {
            return;
        }
        let mut renditions = lock(&self.renditions);
        // Held by the list and this subscriber only.
        let Some(at) =
            renditions.iter().position(|(_, kept)| Arc::ptr_eq(kept, rendition) && Arc::strong_count(kept) == 2)
        else {
            return;
        };
        renditions.swap_remove(at);
        if renditions.is_empty() {
            self.log.release();
        }
        drop(renditions);
        let mut producer = self.lock();
        producer.readers = producer.readers.saturating_sub(1);
        let bytes = producer.bytes;
        drop(producer);
        self.release(lock(rendition).held_bytes(bytes));
    }

    /// Drops the history and every rendition's frames (the stream is evicted), and gives back what they
    /// held. Subscribers still behind get their format's `lagged` notice.
    pub(crate) fn forget(&self) {
        self.forgotten.store(true, Ordering::Release);
        let kept_after = self.log.last_sequence();
        for (_, rendition) in lock(&self.renditions).iter() {
            lock(rendition).forget(Gone { asked: 0, kept_after });
        }
        self.log.forget();
        // What is pending was never counted, or is still in `held`: either way, `held` is what to give back.
        self.pending.store(0, Ordering::Release);
        let held = self.held.swap(0, Ordering::AcqRel);
        self.hub.release(held);
    }
}

/// What the snapshot has reduced of the log.
#[derive(Default)]
struct StateView {
    reducer: Reducer,
    /// The last sequence reduced.
    read: u64,
}

/// The error of a stream its log could not keep.
pub(crate) const NOT_KEPT: &str =
    "the store could not keep this stream's messages (its disk, or Redis, failed); the stream is ended";

/// The step in which renditions' bytes reach the hub's count.
const COUNT_STEP: i64 = 4 << 10;

/// Entries the snapshot reduces per read from the log.
const CHUNK: usize = 1024;

/// The most a batch's JSON is reserved for up front; a larger batch grows it.
const JSON_SCRATCH: usize = 1 << 20;

/// A batch on its way into the log.
#[derive(Default)]
struct Staged {
    entries: Vec<Entry>,
    sequences: Vec<u64>,
    /// Bytes of the entries as JSON, and of the room reserved for the closing events they call for.
    bytes: u64,
    /// Closing events reserved for what the entries open.
    closings: u64,
    /// Bytes counted against the hub for them.
    reserved: u64,
    undo: Vec<Undo>,
    /// What the lifecycle opened or counted for them.
    opened: Vec<Opened>,
}

pub(crate) fn stamp(message: &mut OutputMessage, sequence: u64, now_ms: u64, trace_id: Option<String>) {
    message.metadata = Some(Metadata { sequence: Some(sequence), timestamp: Some(now_ms), trace_id });
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.hub.release(*self.held.get_mut());
    }
}

/// Lifecycle events a batch's undo journal has room for beyond its messages (see `append_staged`).
const LIFECYCLE_ROOM: usize = 8;

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
