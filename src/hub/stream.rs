//! [`Stream`]: one conversation's append-only log of messages, its materialised state, and its renditions.
//!
//! Appending stamps each message (sequence from 1 without gaps, timestamp, a `message_id` where the producer
//! gave none, the `block_id` and `thread_id` of the message a delta continues), runs it through the delta
//! reducer, adds the lifecycle events that go before it, and pushes it all to the log. A batch is all or
//! nothing: a message that fails validation, a delta the reducer refuses, or a limit leaves the stream as it
//! was. Subscribers are not touched: they are woken through a `watch` channel and read the log through
//! the renditions themselves (see `subscription.rs`), so a producer never waits for a subscriber.
//!
//! The state sits behind a `std::sync::Mutex`: no `.await` happens while it is held and every critical
//! section is short (stamping and reducing one batch, or copying out one batch of frames), which a tokio
//! mutex would only make slower.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::lifecycle::{Lifecycle, event, object};
use super::rendition::Rendition;
use super::subscription::Subscription;
use super::{Format, Shared};
use crate::adapter::OpenAiOptions;
use crate::output::{DeltaError, EndStatus, Metadata, Outcome, OutputMessage, Reducer, Undo, ValidationError};

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
}

/// A stream's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

/// What `GET /v1/streams/{id}` shows: the status and every message's current state.
#[derive(Debug, Clone, Serialize)]
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

pub(crate) struct State {
    pub(crate) log: Vec<OutputMessage>,
    bytes: u64,
    reducer: Reducer,
    lifecycle: Lifecycle,
    pub(crate) end: Option<Outcome>,
    /// The first sequence of the latest append (a batch, lifecycle events, the end): a burst the producer
    /// made in one go, which does not count against a subscriber's bound (see `subscription.rs`).
    pub(crate) latest_append: u64,
    started_ms: u64,
    pub(crate) renditions: Vec<Rendition>,
}

/// One stream; see the module doc. Shared as `Arc<Stream>` by the hub, its producer and its subscribers.
pub struct Stream {
    id: String,
    epoch: String,
    openai: OpenAiOptions,
    shared: Arc<Shared>,
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    cancel: CancellationToken,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("id", &self.id).field("epoch", &self.epoch).finish_non_exhaustive()
    }
}

impl Stream {
    pub(crate) fn new(shared: Arc<Shared>, model: &str) -> Arc<Self> {
        let id = shared.config.ids.stream_id();
        let epoch = shared.config.ids.epoch();
        let now_ms = shared.config.clock.now_ms();
        let openai = OpenAiOptions::new(format!("chatcmpl-{id}"), now_ms / 1000, model);
        let stream = Arc::new(Stream {
            id,
            epoch,
            openai,
            shared,
            state: Mutex::new(State {
                log: Vec::new(),
                bytes: 0,
                reducer: Reducer::default(),
                lifecycle: Lifecycle::default(),
                end: None,
                latest_append: 1,
                started_ms: now_ms,
                renditions: Vec::new(),
            }),
            changes: watch::channel(0).0,
            cancel: CancellationToken::new(),
            next_id: AtomicU64::new(1),
        });
        let start =
            event("stream_start", object(json!({ "stream_id": stream.id, "epoch": stream.epoch, "model": model })));
        let mut state = stream.lock();
        stream.push(&mut state, start, now_ms);
        drop(state);
        stream
    }

    /// The stream's id: URL-safe and unguessable.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// This incarnation's epoch: a client that kept another epoch must start over, its history is gone.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The model (agent) name the stream reports to OpenAI clients.
    pub fn model(&self) -> &str {
        &self.openai.model
    }

    /// The token that fires when someone cancels the stream.
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// A new id unique in this stream, with a prefix (`m` for messages, `b` for blocks): `m7-<epoch>`. The
    /// epoch keeps the stream's own ids apart from any a producer picks (`m1` is a common choice).
    pub fn new_id(&self, prefix: &str) -> String {
        let short = self.epoch.get(..8).unwrap_or(&self.epoch);
        format!("{prefix}{}-{short}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-written in a way later readers would
        // misread (every mutation completes or is rolled back before anything can panic), so go on.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The completion id, creation time and model that OpenAI renderings of this stream carry; build an
    /// [`crate::adapter::OpenAiCompletion`] with them for a non-streaming response.
    pub fn openai_options(&self) -> &OpenAiOptions {
        &self.openai
    }

    /// The status now.
    pub fn status(&self) -> Status {
        status_of(self.lock().end.as_ref())
    }

    /// The status, the epoch and every message's current state.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            id: self.id.clone(),
            status: status_of(state.end.as_ref()),
            epoch: self.epoch.clone(),
            last_sequence: state.log.len() as u64,
            messages: state.reducer.messages().to_vec(),
        }
    }

    /// Every message appended so far, as stamped, in order.
    pub fn log(&self) -> Vec<OutputMessage> {
        self.lock().log.clone()
    }

    /// How the stream ended, once it has.
    pub fn outcome(&self) -> Option<Outcome> {
        self.lock().end.clone()
    }

    /// Waits until the stream has ended, and returns how.
    pub async fn ended(&self) -> Outcome {
        let mut changes = self.changes();
        loop {
            changes.borrow_and_update();
            if let Some(outcome) = self.outcome() {
                return outcome;
            }
            if changes.changed().await.is_err() {
                // The sender lives in `self`, so this cannot happen while we hold `&self`.
                return Outcome::completed();
            }
        }
    }

    /// The last sequence appended.
    pub fn last_sequence(&self) -> u64 {
        self.lock().log.len() as u64
    }

    /// Appends one message; returns its sequence.
    pub fn append(&self, message: OutputMessage) -> Result<u64, AppendError> {
        self.append_batch(vec![message]).map(|s| s.into_iter().next().unwrap_or_default()).map_err(|e| e.error)
    }

    /// Appends messages all or nothing; returns their sequences.
    pub fn append_batch(&self, messages: Vec<OutputMessage>) -> Result<Vec<u64>, BatchError> {
        for (index, message) in messages.iter().enumerate() {
            message.validate().map_err(|e| BatchError { index, error: e.into() })?;
        }
        let mut state = self.lock();
        if state.end.is_some() {
            return Err(BatchError { index: 0, error: AppendError::Ended });
        }
        let lifecycle = state.lifecycle.clone();
        let mut staged = Staged::default();
        let outcome = self.stage(&mut state, messages, &mut staged).and_then(|()| {
            if self.shared.reserve(staged.bytes) {
                Ok(())
            } else {
                Err(BatchError { index: 0, error: AppendError::HubFull { limit: self.shared.config.limits.hub_bytes } })
            }
        });
        if let Err(error) = outcome {
            state.reducer.rollback(staged.undo);
            state.lifecycle = lifecycle;
            return Err(error);
        }
        state.bytes += staged.bytes;
        state.latest_append = state.log.len() as u64 + 1;
        state.log.extend(staged.messages);
        drop(state);
        self.changes.send_modify(|n| *n += 1);
        Ok(staged.sequences)
    }

    /// Stamps and reduces a batch into `staged`, with the lifecycle events it calls for; checks the limits.
    /// On error the caller rolls back with `staged.undo`.
    fn stage(&self, state: &mut State, messages: Vec<OutputMessage>, staged: &mut Staged) -> Result<(), BatchError> {
        let limits = &self.shared.config.limits;
        let logged = messages.len() > 1;
        for (index, mut message) in messages.into_iter().enumerate() {
            let fail = |error| Err(BatchError { index, error });
            let now_ms = self.shared.config.clock.now_ms();
            let known = state.reducer.slot_of(&message).map(|slot| &state.reducer.messages()[slot]);
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
            for mut event in state.lifecycle.before(&message, new, now_ms) {
                event.message_id = Some(self.new_id("m"));
                stamp(&mut event, state.log.len() + staged.messages.len() + 1, now_ms, None);
                // A lifecycle event starts a new message: it cannot be refused.
                let _ = state.reducer.apply_logged(&event, &mut staged.undo);
                staged.bytes += json_size(&event);
                staged.messages.push(event);
            }
            let sequence = state.log.len() + staged.messages.len() + 1;
            let trace_id = message.metadata.take().and_then(|m| m.trace_id);
            stamp(&mut message, sequence, now_ms, trace_id);
            let size = json_size(&message);
            if size > limits.message_bytes {
                return fail(AppendError::MessageTooLarge { size, limit: limits.message_bytes });
            }
            if sequence > limits.messages_per_stream {
                return fail(AppendError::TooManyMessages { limit: limits.messages_per_stream });
            }
            if state.bytes + staged.bytes + size > limits.stream_bytes {
                return fail(AppendError::StreamFull { limit: limits.stream_bytes });
            }
            let applied = if logged {
                state.reducer.apply_logged(&message, &mut staged.undo)
            } else {
                state.reducer.apply(&message)
            };
            if let Err(error) = applied {
                return fail(error.into());
            }
            staged.bytes += size;
            staged.sequences.push(sequence as u64);
            staged.messages.push(message);
        }
        Ok(())
    }

    /// Ends an open message (one that streams in deltas): appends its `message_end`. `Ok(None)` when it was
    /// not open.
    pub fn end_message(&self, message_id: &str) -> Result<Option<u64>, AppendError> {
        self.append_events(|lifecycle, now_ms| lifecycle.end_message(message_id, now_ms).into_iter().collect())
            .map(|s| s.last().copied())
    }

    /// Ends an open block: `message_end` for its open messages, then `block_end`.
    pub fn end_block(&self, block_id: &str) -> Result<Option<u64>, AppendError> {
        self.append_events(|lifecycle, now_ms| lifecycle.end_block(block_id, now_ms)).map(|s| s.last().copied())
    }

    fn append_events(
        &self,
        events: impl FnOnce(&mut Lifecycle, u64) -> Vec<OutputMessage>,
    ) -> Result<Vec<u64>, AppendError> {
        let mut state = self.lock();
        if state.end.is_some() {
            return Err(AppendError::Ended);
        }
        let now_ms = self.shared.config.clock.now_ms();
        let events = events(&mut state.lifecycle, now_ms);
        state.latest_append = state.log.len() as u64 + 1;
        let sequences = events.into_iter().map(|e| self.push(&mut state, e, now_ms)).collect();
        drop(state);
        self.changes.send_modify(|n| *n += 1);
        Ok(sequences)
    }

    /// Ends the stream: ends what is open, appends `stream_end`, and records the outcome. `false` when it had
    /// already ended.
    pub fn end(&self, outcome: Outcome) -> bool {
        let mut state = self.lock();
        if state.end.is_some() {
            return false;
        }
        let now_ms = self.shared.config.clock.now_ms();
        state.latest_append = state.log.len() as u64 + 1;
        for event in state.lifecycle.end_all(now_ms) {
            self.push(&mut state, event, now_ms);
        }
        let mut data = json!({
            "status": status_of(Some(&outcome)),
            "duration_ms": now_ms.saturating_sub(state.started_ms),
        });
        if let Some(reason) = outcome.finish_reason {
            data["finish_reason"] = json!(reason);
        }
        if let Some(usage) = &outcome.usage {
            data["usage"] = json!(usage);
        }
        if let Some(error) = &outcome.error {
            data["error"] = json!(error);
        }
        let end = event("stream_end", object(data));
        self.push(&mut state, end, now_ms);
        state.end = Some(outcome);
        // Nothing is appended any more: give back what the log's growth reserved (up to half of it), as the
        // stream is kept for the retention time.
        state.log.shrink_to_fit();
        drop(state);
        self.shared.ended(&self.id);
        self.changes.send_modify(|n| *n += 1);
        true
    }

    /// Cancels the stream: fires the cancellation token the agent watches and ends the stream `cancelled`.
    /// `false` when it had already ended.
    pub fn cancel(&self) -> bool {
        // End first: an agent woken by the token may return at once, and its outcome must not win.
        let ended = self.end(Outcome::cancelled());
        self.cancel.cancel();
        ended
    }

    /// Subscribes in `format` to the messages after sequence `after` (0: from the start), then the live
    /// tail, until the stream ends.
    pub fn subscribe(self: &Arc<Self>, format: Format, after: u64) -> Result<Subscription, SubscribeError> {
        let changes = self.changes();
        let mut state = self.lock();
        let last = state.log.len() as u64;
        if after > last {
            return Err(SubscribeError::SequenceAhead { from: after, last });
        }
        let rendition = self.rendition(&mut state, format);
        let cursor = rendition.frame_after(after);
        let joined = rendition.len();
        drop(state);
        Ok(Subscription::new(Arc::clone(self), format, cursor, joined, changes))
    }

    /// The rendition of `format`, made if new, rendered up to the end of the log.
    pub(crate) fn rendition<'s>(&self, state: &'s mut State, format: Format) -> &'s mut Rendition {
        let index = match state.renditions.iter().position(|r| r.format == format) {
            Some(index) => index,
            None => {
                state.renditions.push(Rendition::new(format, &self.openai));
                state.renditions.len() - 1
            }
        };
        let State { log, end, renditions, .. } = state;
        let rendition = &mut renditions[index];
        rendition.catch_up(log, end.as_ref());
        rendition
    }

    /// Stamps and appends a message the stream made (lifecycle events), without checks.
    fn push(&self, state: &mut State, mut message: OutputMessage, now_ms: u64) -> u64 {
        message.message_id = Some(self.new_id("m"));
        let sequence = state.log.len() + 1;
        stamp(&mut message, sequence, now_ms, None);
        // The stream's own events start new messages and cannot be refused.
        let _ = state.reducer.apply(&message);
        let size = json_size(&message);
        state.bytes += size;
        self.shared.force_reserve(size);
        state.log.push(message);
        sequence as u64
    }
}

/// A batch on its way into the log.
#[derive(Default)]
struct Staged {
    messages: Vec<OutputMessage>,
    sequences: Vec<u64>,
    bytes: u64,
    undo: Vec<Undo>,
}

fn stamp(message: &mut OutputMessage, sequence: usize, now_ms: u64, trace_id: Option<String>) {
    message.metadata = Some(Metadata { sequence: Some(sequence as u64), timestamp: Some(now_ms), trace_id });
}

impl Drop for Stream {
    fn drop(&mut self) {
        let bytes = self.state.get_mut().map(|s| s.bytes).unwrap_or_else(|p| p.into_inner().bytes);
        self.shared.release(bytes);
    }
}

fn status_of(end: Option<&Outcome>) -> Status {
    match end.map(|o| o.status) {
        None => Status::Open,
        Some(EndStatus::Completed) => Status::Completed,
        Some(EndStatus::Cancelled) => Status::Cancelled,
        Some(EndStatus::Error) => Status::Error,
    }
}

/// A message's size as compact JSON, without building it.
fn json_size(message: &OutputMessage) -> u64 {
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
