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
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use super::read::Reader;
use super::writer::{Command, Serialised, Writer};
use crate::hub::{Committed, Entry, Gone, Log, MemoryLog};
use crate::output::Outcome;

/// Committed entries an open stream keeps in memory (at least; at most twice as many).
pub(crate) const HOT: u64 = 1024;

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
        Gone { asked, kept_after: self.committed.memory().last_sequence() }
    }

    /// Keeps `entries` in memory and hands them to the writer; `wake`: wakes its thread (otherwise the caller
    /// hastens next).
    fn hand_over(&self, entries: Vec<Entry>, wake: bool) {
        let serialised = Serialised::of(&entries);
        let memory = self.committed.memory();
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
        self.committed.read(after, max, into, |after, upto, left, into| {
            self.reader.read(&self.stream, after, upto, left, into).unwrap_or_else(|error| {
                tracing::error!(stream = self.stream, "reading entries back from the store: {error}");
                0
            })
        })
    }

    fn last_sequence(&self) -> u64 {
        self.committed.sequence()
    }

    fn is_ended(&self) -> bool {
        self.committed.is_ended()
    }

    fn keeps(&self) -> bool {
        self.committed.keeps()
    }

    fn outcome(&self) -> Option<Arc<Outcome>> {
        self.committed.outcome()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.committed.changes()
    }

    fn appended(&self) -> watch::Receiver<u64> {
        self.committed.appended()
    }

    fn acknowledgements(&self) -> watch::Receiver<u64> {
        self.committed.acknowledgements()
    }

    fn hasten(&self) {
        self.writer.hasten();
    }

    fn forget(&self) {
        self.forgotten.store(true, Ordering::Release);
        self.committed.forget();
    }

    fn release(&self) {
        self.committed.release();
    }

    fn memory_bytes(&self) -> u64 {
        self.committed.memory().memory_bytes()
    }
}
