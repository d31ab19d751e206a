//! The log seam: what a stream's readers need, and the in-memory log that is its first implementation.
//!
//! A stream does two jobs. For its producer it validates, stamps sequences and ids, adds lifecycle events,
//! reduces deltas, checks limits and records the outcome (`stream/`). For its readers it only has to be
//! a log: entries in sequence order, readable after any sequence, a way to wait for more, and the end.
//! [`Log`] is that second job as a trait, and the only thing renditions, subscriptions and snapshots of the
//! history read through, so a durable store or a replicated log can stand in for [`MemoryLog`] without
//! touching an adapter or a transport.
//!
//! Entries are stamped messages, shared as `Arc`s so a reader copies a pointer, not a message, each with
//! its compact JSON, serialised once when it is logged: its size is what the limits count, and the CUI
//! format, the store and the cluster send or keep those bytes rather than serialising the message each
//! again. The outcome is an entry too ([`Entry::End`]), the last one, so a reader learns the end the
//! same way it learns anything else. A log may keep less than all of its history (the in-memory log drops
//! everything when its stream is evicted; a store may keep a window): a read from before what is kept is
//! [`Gone`], and names where the kept history starts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::watch;

use crate::output::{Outcome, OutputMessage};

/// One entry of a stream's log.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A stamped message, its size as JSON, and while it is recent the JSON itself.
    Message {
        /// The message, as stamped (its `metadata.sequence` is its place in the log).
        message: Arc<OutputMessage>,
        /// Its size as compact JSON: what it counts against the limits.
        bytes: u64,
        /// The message as compact JSON (`bytes` long), serialised once when it was logged, or as a store or
        /// a cluster kept it: whatever sends or keeps the message as it is (the CUI format, the store, the
        /// cluster) writes these bytes rather than serialising it again. An in-memory log keeps it for its
        /// last 4,096 messages only, what live readers render, so that it does not hold every message twice;
        /// `None` beyond.
        json: Option<Bytes>,
    },
    /// How the stream ended: always the last entry, after `stream_end`, and without a sequence of its own.
    End(Arc<Outcome>),
}

impl Entry {
    /// A stamped message as an entry: serialises it.
    ///
    /// ```
    /// use agentmux::hub::Entry;
    /// use agentmux::output::OutputMessage;
    ///
    /// let entry = Entry::message(OutputMessage::text("hi"));
    /// let Entry::Message { json: Some(json), .. } = &entry else { unreachable!() };
    /// assert_eq!(&json[..], br#"{"type":"text","props":{"content":"hi"}}"#);
    /// assert_eq!(entry.bytes(), 40);
    /// ```
    pub fn message(message: OutputMessage) -> Entry {
        let json = json_of(&message);
        Entry::Message { message: Arc::new(message), bytes: json.len() as u64, json: Some(json) }
    }

    /// A message read back as the JSON it was logged with (a store's line, a cluster's entry): the entry
    /// keeps that JSON rather than serialising the message again.
    pub(crate) fn kept(message: OutputMessage, json: &str) -> Entry {
        let (bytes, json) = (json.len() as u64, Some(Bytes::copy_from_slice(json.as_bytes())));
        Entry::Message { message: Arc::new(message), bytes, json }
    }

    /// Its size as JSON, what it counts against the limits (0 for the end, which is counted with the
    /// stream's `stream_end`).
    pub fn bytes(&self) -> u64 {
        match self {
            Entry::Message { bytes, .. } => *bytes,
            Entry::End(_) => 0,
        }
    }
}

/// How many of its last messages' JSON an in-memory log keeps: a live reader renders what was just appended,
/// and one that reads older history serialises what it renders.
pub(crate) const RECENT: usize = 4096;

/// A message as compact JSON, for an [`Entry`].
pub(crate) fn json_of(message: &OutputMessage) -> Bytes {
    let mut json = Vec::with_capacity(256);
    write_json(&mut json, message);
    // Kept as long as the log keeps the message: no spare capacity.
    Bytes::from(json.into_boxed_slice())
}

/// Appends a message's compact JSON to `out` (which never holds a raw line break: one line per message).
pub(crate) fn write_json(out: &mut Vec<u8>, message: &OutputMessage) {
    // Writing to a Vec cannot fail, and a message (string keys only) always serialises.
    let _ = serde_json::to_writer(out, message);
}

/// A read from before what the log still keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the history after sequence {asked} is no longer kept; it starts after sequence {kept_after}")]
pub struct Gone {
    /// The sequence the reader asked to read after.
    pub asked: u64,
    /// The kept history starts after this sequence: the first kept entry is `kept_after + 1`.
    pub kept_after: u64,
}

impl Gone {
    /// Where a reader told this resumes: after what it had, or after where the kept history starts when that
    /// is later.
    pub fn resume_from(&self) -> u64 {
        self.asked.max(self.kept_after)
    }
}

/// What readers need from a stream's log; see the module doc.
///
/// Writes come only from the stream that owns the log, in order and already checked, so they cannot fail
/// for the in-memory log; a store whose writes can fail reports it through the stream, not through readers.
pub trait Log: Send + Sync + std::fmt::Debug {
    /// Appends stamped messages (sequences continue the log's without gaps) and, last, the outcome.
    fn append(&self, entries: Vec<Entry>);

    /// Appends to `into` up to `max` entries after sequence `after` (0: from the start), in order, ending
    /// with [`Entry::End`] once the stream has ended and every message was read; nothing when there is
    /// nothing more yet. A reader keeps `into` from one read to the next, so reading allocates nothing.
    fn read(&self, after: u64, max: usize, into: &mut Vec<Entry>) -> Result<(), Gone>;

    /// The last sequence appended (0 when empty). Cheap: every reader asks it each time it looks for more.
    fn last_sequence(&self) -> u64;

    /// True once the outcome is in. Cheap, as `last_sequence`.
    fn is_ended(&self) -> bool;

    /// False while the log could not keep what it was given (a store whose disk failed): readers read what
    /// was kept and are then told the rest is [`Gone`], and the stream is ended with an error. A log in memory
    /// keeps what it is given for as long as it lives.
    fn keeps(&self) -> bool {
        true
    }

    /// How the stream ended, once it has.
    fn outcome(&self) -> Option<Arc<Outcome>>;

    /// A receiver that changes whenever entries are appended or the log drops history: mark it seen, read,
    /// and only then wait on it, so nothing appended in between is missed.
    fn changes(&self) -> watch::Receiver<u64>;

    /// A receiver that changes whenever entries are appended, readable yet or not: for whoever waits for
    /// the producer rather than for the readers ([`crate::hub::Stream::first_message`]). By default,
    /// [`Log::changes`] (a log whose entries are readable once appended).
    fn appended(&self) -> watch::Receiver<u64> {
        self.changes()
    }

    /// A receiver that changes whenever [`Log::last_sequence`], [`Log::is_ended`] or [`Log::keeps`] may
    /// have, for whoever waits for an acknowledgement. A log whose entries become readable later than they
    /// are appended (a store, at its commit) notifies it just before [`Log::changes`], so a producer waiting
    /// for the commit is woken ahead of the many readers the same commit wakes, not behind them. By default,
    /// [`Log::changes`].
    fn acknowledgements(&self) -> watch::Receiver<u64> {
        self.changes()
    }

    /// Someone is about to wait for what was appended to become readable (an acknowledgement): a log that
    /// makes entries readable later than they are appended (a store, at its commit) may do it now, on the
    /// caller's thread, when nothing else is at it. By default, nothing.
    fn hasten(&self) {}

    /// Appends as [`Log::append`] does, for a caller that waits for these entries to become readable right
    /// away and so calls [`Log::hasten`] next: a log that hands its writes to another thread may leave that
    /// thread asleep, since the caller's `hasten` writes them (or wakes it, when it cannot). By default,
    /// [`Log::append`].
    fn append_awaited(&self, entries: Vec<Entry>) {
        self.append(entries);
    }

    /// Drops the history (the stream was evicted): later reads are [`Gone`].
    fn forget(&self);

    /// The stream has ended and nobody reads it now: a log that can read its entries back from elsewhere
    /// (a store) drops them from memory. A log in memory keeps them.
    fn release(&self) {}

    /// Bytes of the entries it holds in memory (their size as JSON): what a stream counts for its log once
    /// it has ended. A log that reads its old entries back from elsewhere (a store) holds only the hot part.
    fn memory_bytes(&self) -> u64;
}

/// The in-memory log: a `Vec` of entries behind a mutex held only to push or to copy out `Arc`s, and its
/// length and end as atomics, so a reader that is caught up learns it without taking the lock that the
/// producer needs.
#[derive(Debug)]
pub(crate) struct MemoryLog {
    state: Mutex<MemoryState>,
    last: AtomicU64,
    ended: AtomicBool,
    changes: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct MemoryState {
    /// Messages with sequences `first..first + messages.len()`.
    messages: Vec<Arc<OutputMessage>>,
    /// Sizes of `messages`, as JSON.
    sizes: Vec<u64>,
    /// The JSON of the last of `messages` (at most [`RECENT`]).
    recent: VecDeque<Bytes>,
    /// Their size.
    bytes: u64,
    /// Sequence of `messages[0]` minus one: what was forgotten or trimmed.
    forgotten: u64,
    end: Option<Arc<Outcome>>,
}

impl Default for MemoryLog {
    fn default() -> Self {
        MemoryLog {
            state: Mutex::new(MemoryState::default()),
            last: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            changes: watch::channel(0).0,
        }
    }
}

impl MemoryLog {
    /// An empty log whose first message will have sequence `last + 1`: the tail of a log whose first `last`
    /// messages are kept elsewhere.
    pub(crate) fn after(last: u64) -> Self {
        let log = MemoryLog::default();
        log.lock().forgotten = last;
        log.last.store(last, Ordering::Release);
        log
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        // Every mutation is a push or a clear that cannot panic halfway, so a poisoned lock holds a valid log.
        crate::sync::lock(&self.state)
    }
}

impl Log for MemoryLog {
    fn append(&self, entries: Vec<Entry>) {
        let mut state = self.lock();
        for entry in entries {
            match entry {
                Entry::Message { message, bytes, json } => {
                    state.messages.push(message);
                    state.sizes.push(bytes);
                    state.bytes += bytes;
                    match json {
                        Some(json) => {
                            if state.recent.len() == RECENT {
                                state.recent.pop_front();
                            }
                            state.recent.push_back(json);
                        }
                        // The recent JSON is of the last messages, in a row.
                        None => state.recent.clear(),
                    }
                }
                Entry::End(outcome) => {
                    state.end = Some(outcome);
                    self.ended.store(true, Ordering::Release);
                    // Nothing comes after the end: give back what the vectors' growth reserved.
                    state.messages.shrink_to_fit();
                    state.sizes.shrink_to_fit();
                }
            }
        }
        self.last.store(state.forgotten + state.messages.len() as u64, Ordering::Release);
        drop(state);
        self.changes.send_modify(|n| *n += 1);
    }

    fn read(&self, after: u64, max: usize, into: &mut Vec<Entry>) -> Result<(), Gone> {
        let state = self.lock();
        if after < state.forgotten {
            return Err(Gone { asked: after, kept_after: state.forgotten });
        }
        let from = (after - state.forgotten) as usize;
        let messages = state.messages.get(from..).unwrap_or_default();
        let sizes = state.sizes.get(from..).unwrap_or_default();
        let taken = messages.len().min(max);
        // `recent[0]` is the JSON of message `recent_from`.
        let recent_from = state.messages.len() - state.recent.len();
        into.extend(messages[..taken].iter().zip(sizes).enumerate().map(|(i, (message, &bytes))| {
            let json = (from + i).checked_sub(recent_from).and_then(|at| state.recent.get(at)).cloned();
            Entry::Message { message: Arc::clone(message), bytes, json }
        }));
        if let Some(outcome) = &state.end
            && taken == messages.len()
            && taken < max
        {
            into.push(Entry::End(Arc::clone(outcome)));
        }
        Ok(())
    }

    fn last_sequence(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }

    fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    fn outcome(&self) -> Option<Arc<Outcome>> {
        self.lock().end.clone()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn forget(&self) {
        self.trim(u64::MAX);
        self.changes.send_modify(|n| *n += 1);
    }

    fn memory_bytes(&self) -> u64 {
        self.lock().bytes
    }
}

impl MemoryLog {
    /// Drops the messages up to sequence `upto` (all of them for `u64::MAX`); the outcome stays. Reads from
    /// before what is left are [`Gone`]: for a log of its own, only eviction calls this; a store's log reads
    /// what it trimmed back from disk. Returns the bytes dropped.
    pub(crate) fn trim(&self, upto: u64) -> u64 {
        let mut state = self.lock();
        let count = upto.saturating_sub(state.forgotten).min(state.messages.len() as u64) as usize;
        if count == 0 {
            return 0;
        }
        let older = state.messages.len() - state.recent.len();
        let recent = count.saturating_sub(older);
        state.recent.drain(..recent);
        let dropped: u64 = if count == state.messages.len() {
            state.messages = Vec::new();
            std::mem::take(&mut state.sizes).iter().sum()
        } else {
            state.messages.drain(..count);
            state.sizes.drain(..count).sum()
        };
        state.forgotten += count as u64;
        state.bytes -= dropped;
        dropped
    }

    /// How many messages it holds.
    pub(crate) fn len(&self) -> usize {
        self.lock().messages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sequence: u64) -> Entry {
        let mut message = OutputMessage::text(format!("part {sequence}"));
        message.metadata.get_or_insert_with(Default::default).sequence = Some(sequence);
        Entry::message(message)
    }

    fn read_all(log: &MemoryLog, after: u64) -> Vec<Entry> {
        let mut entries = Vec::new();
        let _ = log.read(after, usize::MAX, &mut entries);
        entries
    }

    /// The JSON of the last `RECENT` messages comes back with them, byte for byte; older messages come back
    /// with their size only, and trimming keeps the two in step.
    #[test]
    fn the_recent_messages_keep_their_json_and_older_ones_their_size() {
        let log = MemoryLog::default();
        let count = RECENT as u64 + 100;
        log.append((1..=count).map(entry).collect());
        let check = |log: &MemoryLog, after: u64| {
            for entry in read_all(log, after) {
                let Entry::Message { message, bytes, json } = &entry else { panic!("only messages") };
                let sequence = message.sequence().unwrap_or_default();
                let Entry::Message { json: Some(expected), .. } = crate::hub::Entry::message((**message).clone())
                else {
                    unreachable!()
                };
                assert_eq!(*bytes, expected.len() as u64, "sequence {sequence}");
                match json {
                    Some(json) => {
                        assert!(sequence > count - RECENT as u64, "sequence {sequence} is not recent");
                        assert_eq!(json, &expected, "sequence {sequence}");
                    }
                    None => assert!(sequence <= count - RECENT as u64, "sequence {sequence} lost its JSON"),
                }
            }
        };
        check(&log, 0);
        check(&log, count - 10);
        // Trimmed into the recent part, then all of it.
        assert!(log.trim(150) > 0);
        check(&log, 150);
        assert_eq!(read_all(&log, 150).len() as u64, count - 150);
        log.append(vec![entry(count + 1)]);
        check(&log, 150);
        log.trim(u64::MAX);
        log.append(vec![entry(count + 2)]);
        check(&log, count + 1);
    }
}
