//! [`StoreLog`]: a stream's log in the store: its hot part in memory, everything readable once the writer has
//! committed it, and the rest read back from disk.
//!
//! Readers see only committed entries (`last_sequence` is the committed watermark): whatever a client has
//! received is on disk, so after a crash the history resumes exactly where every client's view of it ends,
//! and no (epoch, sequence) can ever name two different messages. See the store's module doc for why this
//! and not a new epoch at restart, and what it costs.
//!
//! # What stays in memory
//!
//! Entries are appended to memory (so a reader that keeps up reads them from there, as from a log in memory)
//! and handed to the writer. Once the writer has committed them, memory keeps only the hot part: the last
//! [`HOT`] entries of an open stream (trimmed by the appender, in steps of as many, so trimming costs nothing
//! per append and frees memory on the thread that made it), and
//! nothing of an ended one but its outcome once its readers are done with it (`release`: when its last
//! subscriber leaves, or at the hub's next sweep), so the readers that were following it live read its last
//! entries from memory, not back from disk. A reader behind that reads from the store ([`Reader`]), in the
//! same chunks and order, and is never cut off while the store keeps the entries it needs. Entries a failed
//! write left off the disk stay in memory until a later write takes them.
//!
//! # A disk that fails
//!
//! When the writer cannot commit (a full disk, a file system gone read-only), the watermark stays where the
//! disk is. Readers read up to it and are then told the rest is not kept ([`Gone`]: their format's `lagged`
//! notice), the acknowledgement waiting for it is refused, and the stream ends with an error its readers
//! learn as the outcome. Nothing a client received is missing from the disk, so a restart, whether the disk
//! came back first (the failed batch is written then, with that end) or not (the stream ends `interrupted`
//! after what was kept), never shows a client a second message under a sequence it has seen.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;

use super::read::Reader;
use super::writer::{Command, Serialised, Writer};
use crate::hub::{Entry, Gone, Log, MemoryLog};
use crate::output::Outcome;

/// Committed entries an open stream keeps in memory (at least; at most twice as many).
pub(crate) const HOT: u64 = 1024;

/// How far the writer has committed a stream, and its entries in memory; shared by the log and the writer.
#[derive(Debug)]
pub(crate) struct Committed {
    sequence: AtomicU64,
    ended: AtomicBool,
    /// Set when a write of this stream failed: what readers get from then on is not on disk.
    failed: AtomicBool,
    changes: watch::Sender<u64>,
    /// Notified just before `changes`: see [`Log::acknowledgements`].
    acknowledgements: watch::Sender<u64>,
    /// The entries not trimmed yet.
    memory: MemoryLog,
}

impl Committed {
    /// `memory` holds what is not committed yet, if anything; `sequence` is committed.
    pub(crate) fn new(sequence: u64, ended: bool, memory: MemoryLog) -> Arc<Self> {
        Arc::new(Committed {
            sequence: AtomicU64::new(sequence),
            ended: AtomicBool::new(ended),
            failed: AtomicBool::new(false),
            changes: watch::channel(0).0,
            acknowledgements: watch::channel(0).0,
            memory,
        })
    }

    /// The writer could not write what it was given: the watermark stays where the disk is, readers that
    /// reach it are told the rest is not kept (rather than wait for ever, or read what a restart would not
    /// find), and whoever waits for an acknowledgement learns it failed.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.notify();
    }

    /// Wakes whoever waits for an acknowledgement, then the readers: a producer waiting for this commit is
    /// scheduled ahead of the readers it wakes (a commit to many readers wakes them all at once).
    fn notify(&self) {
        self.acknowledgements.send_modify(|n| *n = n.wrapping_add(1));
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The last sequence committed.
    pub(crate) fn sequence(&self) -> u64 {
        self.sequence.load(Ordering::Acquire)
    }

    /// The writer committed up to `sequence` (and the end, when `ended`): readers may read it.
    pub(crate) fn advance(&self, sequence: u64, ended: bool) {
        // Written at last (a failed batch, once the disk is back): everything up to here is kept.
        self.failed.store(false, Ordering::Release);
        self.sequence.fetch_max(sequence, Ordering::AcqRel);
        if ended {
            self.ended.store(true, Ordering::Release);
        }
        self.notify();
    }
}

/// A stream's log in the store; see the module doc.
#[derive(Debug)]
pub(crate) struct StoreLog {
    stream: String,
    committed: Arc<Committed>,
    writer: Writer,
    reader: Arc<Reader>,
    /// Evicted: its rows are going, and reads are [`Gone`].
    forgotten: AtomicBool,
}

impl StoreLog {
    /// The log of a new stream.
    pub(crate) fn new(stream: &str, writer: Writer, reader: Arc<Reader>) -> Self {
        let committed = Committed::new(0, false, MemoryLog::default());
        StoreLog { stream: stream.to_owned(), committed, writer, reader, forgotten: AtomicBool::new(false) }
    }

    /// The log of an ended stream kept in the store: `last` entries, every one on disk, and its outcome.
    pub(crate) fn restored(stream: &str, last: u64, outcome: Outcome, writer: Writer, reader: Arc<Reader>) -> Self {
        let memory = MemoryLog::after(last);
        memory.append(vec![Entry::End(Arc::new(outcome))]);
        let committed = Committed::new(last, true, memory);
        StoreLog { stream: stream.to_owned(), committed, writer, reader, forgotten: AtomicBool::new(false) }
    }

    fn gone(&self, asked: u64) -> Gone {
        Gone { asked, kept_after: self.committed.memory.last_sequence() }
    }

    /// Keeps `entries` in memory and hands them to the writer; `wake`: wakes its thread (otherwise the caller
    /// hastens next).
    fn hand_over(&self, entries: Vec<Entry>, wake: bool) {
        let serialised = Serialised::of(&entries);
        let memory = &self.committed.memory;
        memory.append(entries);
        // Trimmed here, on the producer's thread, which made what it frees (not on the one writer thread):
        // down to the last `HOT` entries, of those committed, once there are twice as many.
        if memory.len() as u64 >= 2 * HOT {
            let committed = self.committed.sequence();
            memory.trim(committed.min(memory.last_sequence().saturating_sub(HOT)));
        }
        let command = Command::Append {
            stream: self.stream.clone(),
            entries: serialised,
            committed: Arc::clone(&self.committed),
        };
        if wake {
            self.writer.send(command);
        } else {
            self.writer.queue(command);
        }
    }
}

impl Log for StoreLog {
    fn append(&self, entries: Vec<Entry>) {
        self.hand_over(entries, true);
    }

    /// Queued without waking the writer's thread: the caller's [`Log::hasten`], next, commits it on its own
    /// thread when nobody else is committing, and otherwise wakes the writer (`writer.rs`).
    fn append_awaited(&self, entries: Vec<Entry>) {
        self.hand_over(entries, false);
    }

    fn read(&self, after: u64, max: usize, into: &mut Vec<Entry>) -> Result<(), Gone> {
        if self.forgotten.load(Ordering::Acquire) {
            return Err(self.gone(after));
        }
        let committed = self.committed.sequence.load(Ordering::Acquire);
        let ended = self.committed.ended.load(Ordering::Acquire);
        if after >= committed && !ended {
            // What comes next is not on disk: once a write failed, it may never be.
            return if self.committed.failed.load(Ordering::Acquire) {
                Err(Gone { asked: after, kept_after: committed })
            } else {
                Ok(())
            };
        }
        let mut left = if ended { max } else { max.min(committed.saturating_sub(after) as usize) };
        let start = into.len();
        let mut after = after;
        // Memory first; what it no longer holds comes from the store, up to where memory starts (which the
        // appender may move on meanwhile: then memory is asked again, and the store again).
        while left > 0 {
            let Err(trimmed) = self.committed.memory.read(after, left, into) else { break };
            let read = self.reader.read(&self.stream, after, trimmed.kept_after, left, into).unwrap_or_else(|error| {
                tracing::error!(stream = self.stream, "reading entries back from the store: {error}");
                0
            });
            if read == 0 {
                return Err(Gone { asked: after, kept_after: trimmed.kept_after });
            }
            after += read as u64;
            left -= read;
        }
        // The memory has the end before the writer has committed it: not yet.
        if !ended && into.len() > start && matches!(into.last(), Some(Entry::End(_))) {
            into.pop();
        }
        Ok(())
    }

    fn last_sequence(&self) -> u64 {
        self.committed.sequence()
    }

    fn is_ended(&self) -> bool {
        self.committed.ended.load(Ordering::Acquire) || (!self.keeps() && self.committed.memory.is_ended())
    }

    fn keeps(&self) -> bool {
        !self.committed.failed.load(Ordering::Acquire)
    }

    fn outcome(&self) -> Option<Arc<Outcome>> {
        if self.is_ended() { self.committed.memory.outcome() } else { None }
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.committed.changes.subscribe()
    }

    fn acknowledgements(&self) -> watch::Receiver<u64> {
        self.committed.acknowledgements.subscribe()
    }

    fn hasten(&self) {
        self.writer.hasten();
    }

    fn forget(&self) {
        self.forgotten.store(true, Ordering::Release);
        self.committed.memory.forget();
        self.committed.notify();
    }

    fn release(&self) {
        if self.committed.ended.load(Ordering::Acquire) && self.keeps() {
            self.committed.memory.trim(u64::MAX);
        }
    }

    fn memory_bytes(&self) -> u64 {
        self.committed.memory.memory_bytes()
    }
}
