//! [`StoreLog`]: a stream's log in the store: every entry in memory as it is appended, readable once the
//! writer has committed it.
//!
//! Readers see only committed entries (`last_sequence` is the committed watermark): whatever a client has
//! received is on disk, so after a crash the history resumes exactly where every client's view of it ends,
//! and no (epoch, sequence) can ever name two different messages. See the store's module doc for why this
//! and not a new epoch at restart, and what it costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;

use super::writer::{Command, Writer};
use crate::hub::{Entry, Gone, Log, MemoryLog};
use crate::output::Outcome;

/// How far the writer has committed a stream; shared by the log and the writer.
#[derive(Debug)]
pub(crate) struct Committed {
    sequence: AtomicU64,
    ended: AtomicBool,
    /// Set when a write of this stream failed: what readers get from then on is not on disk.
    failed: AtomicBool,
    changes: watch::Sender<u64>,
}

impl Committed {
    pub(crate) fn new(sequence: u64, ended: bool) -> Arc<Self> {
        Arc::new(Committed {
            sequence: AtomicU64::new(sequence),
            ended: AtomicBool::new(ended),
            failed: AtomicBool::new(false),
            changes: watch::channel(0).0,
        })
    }

    /// The writer could not write what it was given: readers get it anyway (they must not wait for ever),
    /// and the log says it did not keep it.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// The writer committed up to `sequence` (and the end, when `ended`): readers may read it.
    pub(crate) fn advance(&self, sequence: u64, ended: bool) {
        self.sequence.fetch_max(sequence, Ordering::AcqRel);
        if ended {
            self.ended.store(true, Ordering::Release);
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A stream's log in the store; see the module doc.
#[derive(Debug)]
pub(crate) struct StoreLog {
    stream: String,
    memory: MemoryLog,
    committed: Arc<Committed>,
    writer: Writer,
}

impl StoreLog {
    /// The log of a new stream.
    pub(crate) fn new(stream: &str, writer: Writer) -> Self {
        StoreLog {
            stream: stream.to_owned(),
            memory: MemoryLog::default(),
            committed: Committed::new(0, false),
            writer,
        }
    }

    /// The log of a stream read back from the store: `entries` are committed, and the stream has ended.
    pub(crate) fn restored(stream: &str, entries: Vec<Entry>, writer: Writer) -> Self {
        let memory = MemoryLog::default();
        memory.append(entries);
        let committed = Committed::new(memory.last_sequence(), true);
        StoreLog { stream: stream.to_owned(), memory, committed, writer }
    }
}

impl Log for StoreLog {
    fn append(&self, entries: Vec<Entry>) {
        self.memory.append(entries.clone());
        self.writer.send(Command::Append {
            stream: self.stream.clone(),
            entries,
            committed: Arc::clone(&self.committed),
        });
    }

    fn read(&self, after: u64, max: usize, into: &mut Vec<Entry>) -> Result<(), Gone> {
        let committed = self.committed.sequence.load(Ordering::Acquire);
        let ended = self.committed.ended.load(Ordering::Acquire);
        if after >= committed && !ended {
            return Ok(());
        }
        let allowed = committed.saturating_sub(after) as usize;
        let start = into.len();
        self.memory.read(after, if ended { max } else { max.min(allowed) }, into)?;
        // The memory has the end before the writer has committed it: not yet.
        if !ended && into.len() > start && matches!(into.last(), Some(Entry::End(_))) {
            into.pop();
        }
        Ok(())
    }

    fn last_sequence(&self) -> u64 {
        self.committed.sequence.load(Ordering::Acquire)
    }

    fn is_ended(&self) -> bool {
        self.committed.ended.load(Ordering::Acquire)
    }

    fn keeps(&self) -> bool {
        !self.committed.failed.load(Ordering::Acquire)
    }

    fn outcome(&self) -> Option<Arc<Outcome>> {
        if self.is_ended() { self.memory.outcome() } else { None }
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.committed.changes.subscribe()
    }

    fn forget(&self) {
        self.memory.forget();
        self.committed.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}
