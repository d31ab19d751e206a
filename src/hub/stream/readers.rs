//! What a [`Stream`] does for its readers: subscriptions, the renditions they read, and eviction.
//!
//! Readers never touch the producer's state: renditions, subscriptions and the snapshot read the log
//! (`log.rs`), each behind its own mutex (`rendition.rs`), so a producer never waits for a reader, and a
//! reader rendering a long log never holds up an append. The producer keeps a reducer of its own only to
//! decide whether a delta applies (counted like a copy of the log, see `ledger.rs`).
//!
//! Every reader that holds a copy of the whole log (a rendition, the snapshot's reduction) is counted as one
//! more copy of every entry ([`Stream::add_reader`]); a rendition an ended stream no longer needs goes when
//! its last subscriber is done with it ([`Stream::unsubscribed`]), and everything goes when the stream is
//! evicted ([`Stream::forget`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::Stream;
use crate::hub::log::Gone;
use crate::hub::render::Render;
use crate::hub::rendition::{CountChange, Rendition};
use crate::hub::subscription::Subscription;
use crate::sync::lock;

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

impl Stream {
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
            let mut counted = CountChange::default();
            while rendition.rendered() < after && rendition.catch_up(&*self.log, &mut counted) {}
            self.count(counted);
            (rendition.frame_after(after), rendition.renders())
        };
        let (cursor, private) = match shared {
            (Some(cursor), _) => (cursor, None),
            (None, renders) => {
                // Its frames are behind the shared rendition's window: rendered again for this subscriber.
                let mut private = Rendition::private(render.renderer(&self.info), renders);
                let mut counted = CountChange::default();
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
    pub(super) fn add_reader(&self, refusable: bool) -> bool {
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

    /// A subscription starts (counted in [`Stream::subscribers`]).
    pub(crate) fn subscribed(&self) {
        self.subscribers.fetch_add(1, Ordering::Relaxed);
    }

    /// How many subscriptions read the stream now: a transport gathers a moment before it writes only when
    /// its writes are shared by several (`http/transport/sse.rs`).
    pub(crate) fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// A subscriber is done with `rendition`: an ended stream drops it, and gives back what it was counted
    /// at, when nobody else holds it (its frames are most of what a stream holds; a later subscriber renders
    /// the log again).
    pub(crate) fn unsubscribed(&self, rendition: &Arc<Mutex<Rendition>>) {
        self.subscribers.fetch_sub(1, Ordering::Relaxed);
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
        self.forget_after(self.log.last_sequence());
    }

    /// Forgets the stream as [`Stream::forget`] does, but for a node that lost it rather than a history that
    /// is gone (a followed stream whose follower cannot reach Redis, see [`crate::hub::Hub::lose`]): every
    /// subscriber, caught up or not, gets `lagged` naming where it is, to resume from there on a node that
    /// follows the stream.
    pub(crate) fn lose(&self) {
        self.forget_after(0);
    }

    /// Forgets the stream, its history kept elsewhere only after `kept_after`.
    fn forget_after(&self, kept_after: u64) {
        self.forgotten.store(true, Ordering::Release);
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
