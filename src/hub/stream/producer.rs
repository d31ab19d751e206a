//! What a [`Stream`] does for its producer: appending.
//!
//! Appending validates each message, stamps it (sequence from 1 without gaps, timestamp, a `message_id`
//! where the producer gave none, the `block_id` and `thread_id` of the message a delta continues), runs it
//! through the delta reducer, adds the lifecycle events that go before it, counts it against the limits,
//! and hands the stamped entries to the log. A batch is all or nothing, however it is refused (a message
//! that fails validation, a delta the reducer refuses, a limit): the reducer is rolled back through its
//! undo journal, the lifecycle through its own (what it opened and counted), and every byte counted for the
//! batch given back, so the stream is exactly as before and a retry meets the same stream.
//!
//! A conditional append ([`Condition`]: the sequence it must follow, an idempotency key) is checked against
//! the stream's receipts and remembered among them under the same lock as the append itself
//! (`receipts.rs` says why); an unconditional one never touches them.
//!
//! The events that close what a batch opens, and the end, are `closing.rs`'s; what each entry is counted
//! at, `ledger.rs`'s.
//!
//! # The first message
//!
//! A stream's first message after `stream_start` is what its first reader waits for: a front door's client
//! measures its time to first token by it, and nothing else is pending to gather with it. With a store,
//! readers read only what is committed, and a message handed to the store's writer reaches a reader after
//! two hand-offs between threads (the writer's thread woken to commit, then the reader's task woken from
//! outside the runtime), each a scheduling delay on a busy machine. So the first message is appended as an
//! awaited one is and committed at once on the producer's thread ([`Log::hasten`](crate::hub::Log::hasten):
//! when nobody else is committing, else the writer's thread is woken), once the producer's lock is let go.
//! Only the first: one commit per stream on the producer's thread, not one per message (committing every
//! sparse append there, session 28 found, moved thousands of commits a second onto the runtime's workers at
//! 200 concurrent runs and made every figure worse; `docs/benchmarks-history.md`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::receipts::{Appended, Condition, Found, fingerprint};
use super::{Producer, Stream, stamp};
use crate::hub::lifecycle::{Opened, Opening};
use crate::hub::log::{Entry, write_json};
use crate::output::{DeltaError, OutputMessage, Undo, ValidationError};

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
    /// The stream is written on another node: this one follows it ([`crate::hub::Hub::follow`]).
    #[error("the stream is written on another node")]
    Elsewhere,
    /// The batch was to follow a sequence that is not the stream's last ([`Condition::after`]): an append
    /// landed since (a conflict) or never did (a gap).
    #[error("the stream's last sequence is {last}, not {after}")]
    SequenceConflict {
        /// The sequence the batch was to follow.
        after: u64,
        /// The stream's last sequence.
        last: u64,
    },
    /// The idempotency key ([`Condition::key`]) names an earlier append of another batch, or with another
    /// `after`.
    #[error("the idempotency key was used on this stream for another batch")]
    KeyReused {
        /// The stream's last sequence.
        last: u64,
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

impl Stream {
    /// Appends one message; returns its sequence.
    pub fn append(&self, message: OutputMessage) -> Result<u64, AppendError> {
        self.append_batch(vec![message]).map(|s| s.into_iter().next().unwrap_or_default()).map_err(|e| e.error)
    }

    /// Appends messages all or nothing; returns their sequences.
    pub fn append_batch(&self, messages: Vec<OutputMessage>) -> Result<Vec<u64>, BatchError> {
        self.append_staged(messages, false, None).map(|appended| appended.sequences)
    }

    /// Appends messages all or nothing, as [`Stream::append_batch`] does, and waits until they are kept
    /// ([`Stream::readable`]): their sequences, and false when the store could not keep them. With a store,
    /// the wait commits them on this thread when nothing else is committing, rather than handing them to the
    /// store's writer and waiting to be woken back.
    pub async fn append_batch_kept(&self, messages: Vec<OutputMessage>) -> Result<(Vec<u64>, bool), BatchError> {
        let (appended, kept) = self.append_if_kept(messages, &Condition::default()).await?;
        Ok((appended.sequences, kept))
    }

    /// Appends messages all or nothing when `condition` allows it, safe to retry (see
    /// [`Condition`]): a repeat of a conditional append that landed appends nothing and answers what the
    /// first did ([`Appended::replayed`]), even once the stream has ended. Refused, besides what refuses any
    /// append: [`AppendError::SequenceConflict`] when the stream's last sequence is not `condition.after`,
    /// [`AppendError::KeyReused`] when `condition.key` was used for another batch. An empty condition is
    /// [`Stream::append_batch`], with the stream's last sequence in the answer.
    pub fn append_if(&self, messages: Vec<OutputMessage>, condition: &Condition) -> Result<Appended, BatchError> {
        self.append_staged(messages, false, (!condition.is_none()).then_some(condition))
    }

    /// [`Stream::append_if`], then waits until the batch is kept as [`Stream::append_batch_kept`] does (a
    /// repeat waits for the first's batch): the answer, and false when the store could not keep it.
    pub async fn append_if_kept(
        &self,
        messages: Vec<OutputMessage>,
        condition: &Condition,
    ) -> Result<(Appended, bool), BatchError> {
        let appended = self.append_staged(messages, true, (!condition.is_none()).then_some(condition))?;
        let kept = match appended.sequences.last() {
            Some(&last) => self.readable(last).await,
            None => true,
        };
        Ok((appended, kept))
    }

    /// `awaited`: the caller waits for the batch to be readable next (see
    /// [`Log::append_awaited`](crate::hub::Log::append_awaited)). `condition`: a conditional append, checked
    /// against the receipts and remembered among them (none: nothing hashed, nothing kept).
    fn append_staged(
        &self,
        messages: Vec<OutputMessage>,
        awaited: bool,
        condition: Option<&Condition>,
    ) -> Result<Appended, BatchError> {
        for (index, message) in messages.iter().enumerate() {
            message.validate().map_err(|e| BatchError { index, error: e.into() })?;
        }
        if self.followed {
            return Err(BatchError { index: 0, error: self.refusal_when_followed() });
        }
        // Hashed before the lock is taken, and before stamping: the batch as the producer sent it.
        let fingerprint = condition.map(|_| fingerprint(&messages));
        let mut producer = self.lock();
        if let (Some(condition), Some(fingerprint)) = (condition, fingerprint) {
            let refused = |error| Err(BatchError { index: 0, error });
            match producer.receipts.find(condition, fingerprint) {
                Found::Repeat(appended) => return Ok(appended),
                Found::KeyReused => return refused(AppendError::KeyReused { last: producer.last }),
                Found::New if producer.end.is_some() => return refused(AppendError::Ended),
                Found::New => {}
            }
            if let Some(after) = condition.after.filter(|&after| after != producer.last) {
                return refused(AppendError::SequenceConflict { after, last: producer.last });
            }
        }
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
        // The stream's first message after `stream_start`: see the module doc, "The first message".
        let first = producer.last == 1 && !awaited;
        producer.bytes += staged.bytes;
        producer.closings += staged.closings;
        producer.last += staged.entries.len() as u64;
        // The time the batch was stamped with: reading the clock again would tick a test's stepping clock.
        if let Some(Entry::Message { message, .. }) = staged.entries.last() {
            let stamped = message.metadata.as_ref().and_then(|m| m.timestamp);
            self.active_ms.store(stamped.unwrap_or_default(), Ordering::Release);
        }
        if awaited || first {
            self.log.append_awaited(staged.entries);
        } else {
            self.log.append(staged.entries);
        }
        self.probes.appended(producer.last);
        let appended = Appended { sequences: staged.sequences, last_sequence: producer.last, replayed: false };
        if let (Some(condition), Some(fingerprint)) = (condition, fingerprint) {
            // Counted regardless: the batch is in, and a receipt is small (see `receipts.rs`).
            let (added, dropped) = producer.receipts.keep(condition, fingerprint, &appended);
            self.force(added);
            self.release(dropped);
        }
        drop(producer);
        if first {
            self.log.hasten();
        }
        Ok(appended)
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

    /// Stamps one of the stream's own events with `id` and the next sequence, and reduces it.
    #[inline]
    pub(super) fn stamp_event(
        &self,
        producer: &mut Producer,
        mut message: OutputMessage,
        id: String,
        now_ms: u64,
    ) -> Entry {
        message.message_id = Some(id);
        producer.last += 1;
        stamp(&mut message, producer.last, now_ms, None);
        // The stream's own events start new messages: the reducer cannot refuse them.
        let _ = producer.reducer.apply(&message);
        Entry::message(message)
    }

    /// Why a followed stream refuses a write: it has ended, or another node writes it.
    pub(super) fn refusal_when_followed(&self) -> AppendError {
        if self.log.is_ended() { AppendError::Ended } else { AppendError::Elsewhere }
    }
}

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

/// The most a batch's JSON is reserved for up front; a larger batch grows it.
const JSON_SCRATCH: usize = 1 << 20;

/// Lifecycle events a batch's undo journal has room for beyond its messages (see `append_staged`).
const LIFECYCLE_ROOM: usize = 8;
