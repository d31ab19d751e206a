//! What a [`Stream`] counts against the hub, and what it gives back.
//!
//! # What a stream counts
//!
//! Everything it holds is counted against the hub's byte limit (`held`): each log entry as JSON when it is
//! appended, the stream's own first event included, once more for the producer's own reduction of the log
//! (the reducer that decides whether a delta applies: a reduced message is at most the entries it came
//! from), the receipts of its last conditional appends (`receipts.rs`), and for each rendition in use an
//! estimate of the same size per entry, replaced by the real figure (frames, offsets, the renderer's state)
//! once rendered. The snapshot's reduction of the log, once asked for, counts like a rendition whose
//! estimate stands. So an append is refused when the hub could not hold it in every format in use, and a subscription that needs a
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
//! snapshot's reduction, the outcome, and the receipts of conditional appends (`receipts.rs`, kept for
//! their repeats). Until that sweep the count stays as it was, which only errs high.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Producer, Stream};
use crate::hub::lifecycle::Lifecycle;
use crate::hub::rendition::CountChange;
use crate::output::Reducer;
use crate::sync::lock;

impl Stream {
    /// Counts `bytes` against the hub's limit; `false` (and nothing counted) when they do not fit.
    #[inline]
    pub(super) fn reserve(&self, bytes: u64) -> bool {
        let fits = self.hub.reserve(bytes);
        if fits {
            self.held.fetch_add(bytes, Ordering::AcqRel);
        }
        fits
    }

    /// Counts bytes that must be held regardless.
    #[inline]
    pub(super) fn force(&self, bytes: u64) {
        self.hub.force_reserve(bytes);
        self.held.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Gives back `bytes` counted against the hub, no more than the stream holds.
    #[inline]
    pub(super) fn release(&self, bytes: u64) {
        let released =
            self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| Some(held.saturating_sub(bytes)));
        let before = released.unwrap_or(0);
        self.hub.release(before.min(bytes));
    }

    /// A closing event of `bytes` took the place of the `room` reserved for it: the stream's count and the
    /// hub's (once per copy) give back the difference. (A closing event is never larger than its room; if it
    /// were, the difference would be counted regardless.)
    #[inline]
    pub(super) fn settle(&self, producer: &mut Producer, room: u64, bytes: u64) {
        let copies = producer.copies();
        producer.bytes = (producer.bytes + bytes).saturating_sub(room);
        match bytes.cmp(&room) {
            std::cmp::Ordering::Less => self.release((room - bytes) * copies),
            std::cmp::Ordering::Greater => self.force((bytes - room) * copies),
            std::cmp::Ordering::Equal => {}
        }
    }

    /// Applies what a rendition's catch-up changed in the count.
    ///
    /// The hub-wide count is one atomic that every stream's producer and readers share, so a catch-up's
    /// change is gathered per stream and applied in steps of [`COUNT_STEP`] bytes (and when a rendition
    /// finishes): the hub's count trails what renditions hold by less than a step per stream.
    #[inline]
    pub(crate) fn count(&self, counted: CountChange) {
        if counted == CountChange::default() || self.forgotten.load(Ordering::Acquire) {
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
        // Kept: a repeat of a conditional append is answered after the end too.
        let receipts = producer.receipts.bytes();
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
            + receipts
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
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.hub.release(*self.held.get_mut());
    }
}

/// The step in which renditions' bytes reach the hub's count.
const COUNT_STEP: i64 = 4 << 10;
