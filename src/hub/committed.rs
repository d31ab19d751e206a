//! [`Committed`]: how far a log's entries are kept elsewhere (a store's disk, Redis), and its entries in memory
//! until then and after: the state a log shares with the writer that commits it.
//!
//! Readers of such a log see only committed entries (`sequence` is the committed watermark), so whatever a
//! client received is kept where a restart, or another node, finds it. The writer advances the watermark
//! (or fails it: what comes next may never be kept), and wakes whoever waits for an acknowledgement before
//! the readers the same commit wakes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;

use super::log::{Entry, Gone, Log, MemoryLog};
use crate::output::Outcome;

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

    /// A receiver that changes at every append, before the commit: [`Log::appended`].
    pub(crate) fn appended(&self) -> watch::Receiver<u64> {
        self.memory.changes()
    }

    /// The entries in memory: committed or not, up to where they were trimmed.
    pub(crate) fn memory(&self) -> &MemoryLog {
        &self.memory
    }

    /// Reads committed entries as [`Log::read`] does: from memory, and what memory no longer holds through
    /// `back(after, upto, max, into)`, which appends up to `max` entries after `after` and before `upto + 1`
    /// from wherever they are kept and says how many (none: they are not kept).
    pub(crate) fn read(
        &self,
        after: u64,
        max: usize,
        into: &mut Vec<Entry>,
        mut back: impl FnMut(u64, u64, usize, &mut Vec<Entry>) -> usize,
    ) -> Result<(), Gone> {
        let committed = self.sequence.load(Ordering::Acquire);
        let ended = self.ended.load(Ordering::Acquire);
        if after >= committed && !ended {
            // What comes next is not kept: once a write failed, it may never be.
            return if self.failed.load(Ordering::Acquire) {
                Err(Gone { asked: after, kept_after: committed })
            } else {
                Ok(())
            };
        }
        let mut left = if ended { max } else { max.min(committed.saturating_sub(after) as usize) };
        let start = into.len();
        let mut after = after;
        // Memory first; what it no longer holds comes from `back`, up to where memory starts (which the
        // appender may move on meanwhile: then memory is asked again, and `back` again).
        while left > 0 {
            let Err(trimmed) = self.memory.read(after, left, into) else { break };
            let read = back(after, trimmed.kept_after, left, into);
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

    /// True while every write so far was kept.
    pub(crate) fn keeps(&self) -> bool {
        !self.failed.load(Ordering::Acquire)
    }

    /// [`Log::is_ended`]: the end is committed, or will never be while the memory has it.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire) || (!self.keeps() && self.memory.is_ended())
    }

    /// [`Log::outcome`].
    pub(crate) fn outcome(&self) -> Option<Arc<Outcome>> {
        if self.is_ended() { self.memory.outcome() } else { None }
    }

    /// [`Log::changes`].
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// [`Log::acknowledgements`].
    pub(crate) fn acknowledgements(&self) -> watch::Receiver<u64> {
        self.acknowledgements.subscribe()
    }

    /// [`Log::forget`]'s part: the memory goes, and readers are woken to find it gone.
    pub(crate) fn forget(&self) {
        self.memory.forget();
        self.notify();
    }

    /// [`Log::release`]: an ended stream whose end is kept elsewhere drops its entries from memory.
    pub(crate) fn release(&self) {
        if self.ended.load(Ordering::Acquire) && self.keeps() {
            self.memory.trim(u64::MAX);
        }
    }
}
