//! [`Subscription`]: one subscriber's cursor into a stream's rendition of its `Render`.
//!
//! A subscriber has no queue of its own: what it has not read yet is the stretch of the shared rendition
//! (and of the log behind it) after its cursor. So being behind costs the server nothing, a subscriber
//! reads on at its own pace however far behind it is, and the producer never waits for it. The one thing
//! that ends a subscription early is history it needs that is no longer kept (its stream was evicted while
//! it was still behind): it then gets one last batch with its format's error frames (`code: "lagged"`,
//! where the kept history starts) and ends.
//!
//! A backlog is handed out in batches of up to the batch limit, so a transport sends many frames in one
//! write. Waiting uses the log's `watch` channel: mark the version seen, look, and only then wait, so an
//! entry appended between the look and the wait is never missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;

use super::log::Gone;
use super::probes::Cursor;
use super::render::Render;
use super::rendition::{CountChange, ReaderAt, Rendition};
use super::stream::Stream;

/// Frames taken from a stream in one go.
#[derive(Clone)]
pub struct Batch {
    /// Complete frames, in order, back to back, in pieces (see [`Batch::pieces`]).
    pieces: Vec<Bytes>,
    /// The last sequence whose frames are all in this batch or before it: where to resume from.
    pub last_sequence: u64,
    /// True when this is the notice that the history is gone, which ends the subscription.
    pub lagged: bool,
    /// When a probed message in it was published (see `probes.rs`): on a sample of batches only.
    pub(crate) published: Option<Instant>,
    /// Where its frames start and end, asked for only by transports that send frames one by one.
    bounds: Bounds,
}

/// Where a batch's frames start and end: looked up in the rendition's offsets when asked (the batch keeps
/// the rendition alive anyway while a transport writes it), so a byte-stream transport pays nothing for it.
#[derive(Clone)]
enum Bounds {
    /// Frames `first..first + count` of the rendition.
    Rendered { rendition: Arc<Mutex<Rendition>>, first: usize, count: usize },
    /// The lengths, for frames that are not in a rendition (the lagged notice).
    Lengths(Vec<u32>),
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("bytes", &self.len())
            .field("last_sequence", &self.last_sequence)
            .field("lagged", &self.lagged)
            .finish_non_exhaustive()
    }
}

impl Batch {
    /// Its bytes, in order, in as few pieces as sharing allows: each piece holds whole frames and is a
    /// slice of what the stream rendered once for every subscriber (short ones copied together), so a
    /// transport writes them all at once (`writev`) without copying them. Usually one.
    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// Its bytes in one buffer: the one piece itself when there is one, a copy of the pieces otherwise.
    ///
    /// ```
    /// # async fn example(mut subscription: agentmux::hub::Subscription) {
    /// let mut out = Vec::new();
    /// while let Some(batch) = subscription.next().await {
    ///     out.extend_from_slice(&batch.to_bytes());
    /// }
    /// # }
    /// ```
    pub fn to_bytes(&self) -> Bytes {
        match self.pieces.as_slice() {
            [one] => one.clone(),
            pieces => pieces.concat().into(),
        }
    }

    /// The frames one by one, each a slice of a piece.
    pub fn frames(&self) -> Vec<Bytes> {
        let lengths = match &self.bounds {
            Bounds::Rendered { rendition, first, count } => {
                crate::sync::lock(rendition).frame_lengths(*first, first + count)
            }
            Bounds::Lengths(lengths) => lengths.clone(),
        };
        let mut pieces = self.pieces.iter();
        let (mut piece, mut at) = (pieces.next().cloned().unwrap_or_default(), 0);
        let mut frames = Vec::with_capacity(lengths.len());
        for length in lengths {
            if at >= piece.len() {
                // Frames never straddle pieces: the next frame starts the next piece.
                (piece, at) = (pieces.next().cloned().unwrap_or_default(), 0);
            }
            let end = (at + length as usize).min(piece.len());
            frames.push(piece.slice(at..end));
            at = end;
        }
        frames
    }

    /// How many frames it holds.
    pub fn frame_count(&self) -> usize {
        match &self.bounds {
            Bounds::Rendered { count, .. } => *count,
            Bounds::Lengths(lengths) => lengths.len(),
        }
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(Bytes::len).sum()
    }

    /// True when it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.stream.unsubscribed(&self.rendition);
    }
}

/// A subscriber's view of a stream; see the module doc.
pub struct Subscription {
    stream: Arc<Stream>,
    rendition: Arc<Mutex<Rendition>>,
    /// The frames before the shared rendition's window, rendered again for this subscriber alone.
    private: Option<Rendition>,
    /// Makes the private rendition's renderer.
    render: Arc<dyn Render>,
    /// The count of messages rendered its private renditions add to, as the shared one does.
    renders: Arc<AtomicU64>,
    /// The next frame to take: the same frame in the shared rendition and the private one.
    cursor: usize,
    /// Where it reads in the shared rendition, which keeps what it may still ask for: the first frame of
    /// the last batch taken (a transport may still ask that batch for its frames), `usize::MAX` while it
    /// reads its private rendition.
    at: ReaderAt,
    changes: watch::Receiver<u64>,
    done: bool,
    /// The last batch took everything the stream had.
    live: bool,
    /// Where it is among the stream's probes (see `probes.rs`).
    probes: Cursor,
    /// Bytes taken since it last found nothing to take or let other tasks run (see [`Subscription::next`]).
    unyielded: u64,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("stream", &self.stream.id())
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// A subscription reading from frame `cursor` of `rendition`, or, when `private` is given (the frames
    /// after where it starts are no longer in the shared one), from frame `cursor` of that first.
    pub(crate) fn new(
        stream: Arc<Stream>,
        rendition: Arc<Mutex<Rendition>>,
        render: Arc<dyn Render>,
        private: Option<Rendition>,
        cursor: usize,
        changes: watch::Receiver<u64>,
    ) -> Self {
        let (at, renders) = {
            let mut shared = crate::sync::lock(&rendition);
            (shared.reader(if private.is_some() { usize::MAX } else { cursor }), shared.renders())
        };
        let probes = stream.probes().cursor();
        stream.subscribed();
        let (done, live) = (false, false);
        Subscription {
            stream,
            rendition,
            private,
            render,
            renders,
            cursor,
            at,
            changes,
            done,
            live,
            probes,
            unyielded: 0,
        }
    }

    /// The stream subscribed to.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// A receiver told of every change of the stream from now on: for a writer that takes batches for many
    /// subscriptions with [`Subscription::try_next`] when its stream changes.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        let mut changes = self.changes.clone();
        changes.borrow_and_update();
        changes
    }

    /// The next batch of frames, waiting for one if need be; `None` once the stream has ended and every
    /// frame was taken, or after the notice that the history is gone.
    ///
    /// A subscriber that has taken a batch limit's worth of bytes without once finding nothing to take
    /// lets the runtime's other tasks run before it takes more. A reader far behind, whose socket takes
    /// every batch at once, would otherwise hold its worker thread for its whole catch-up (a tenth of a
    /// second and more, reading from a store: the runtime's own budget counts a batch of 256 KiB as one
    /// write of its 128), and a task queued behind it there (a producer waiting for its acknowledgement)
    /// would wait as long. One that keeps up finds nothing to take between batches, and never yields. A
    /// caller that must not wait takes batches with [`Subscription::try_next`] instead.
    pub async fn next(&mut self) -> Option<Batch> {
        if self.unyielded >= self.stream.hub_state().config.batch_bytes {
            self.unyielded = 0;
            tokio::task::yield_now().await;
        }
        // A reader that took everything there was, and has not been told of anything since, waits at once:
        // every change of the log is told on `changes` after it is made, and the look that took the last
        // batch marked the version it saw before it looked. (Looking again would find nothing, at the price
        // of the rendition's lock, once per delivery.)
        if self.live && matches!(self.changes.has_changed(), Ok(false)) {
            self.unyielded = 0;
        } else if let Some(next) = self.try_next() {
            return next;
        }
        loop {
            if self.changes.changed().await.is_err() {
                return None;
            }
            if let Some(next) = self.try_next() {
                return next;
            }
        }
    }

    /// The next batch if one can be taken now, without waiting or yielding: `Some(None)` once the stream
    /// has ended and every frame was taken (or after the notice that the history is gone), `None` when
    /// there is nothing to take yet.
    pub fn try_next(&mut self) -> Option<Option<Batch>> {
        if self.done {
            return Some(None);
        }
        self.changes.borrow_and_update();
        if let Some(mut batch) = self.take() {
            if !batch.lagged {
                batch.published = self.probes.took(self.stream.probes(), batch.last_sequence);
            }
            self.unyielded += batch.len() as u64;
            return Some(Some(batch));
        }
        if self.done {
            return Some(None);
        }
        self.unyielded = 0;
        None
    }

    /// What can be taken now without waiting; marks the subscription done at the end.
    fn take(&mut self) -> Option<Batch> {
        let shared = Arc::clone(&self.rendition);
        let mut rendition = crate::sync::lock(&shared);
        let mut counted = CountChange::default();
        while self.cursor >= rendition.len() && rendition.catch_up(self.stream.log(), &mut counted) {}
        self.stream.count(counted);
        if self.cursor < rendition.first_kept() && rendition.gone.is_none() {
            // Behind the shared window: its own rendition of the log, from the start.
            self.at.store(usize::MAX, Ordering::Release);
            drop(rendition);
            self.live = false;
            return self.take_private();
        }
        self.private = None;
        self.at.store(self.cursor, Ordering::Release);
        let bounds = |_: &Rendition, first, count| Bounds::Rendered { rendition: Arc::clone(&shared), first, count };
        let batch = self.take_from(&rendition, bounds);
        // Not once the log has its end: what is left (the end's own frames) is taken, not waited for; nor once
        // the subscription is done (its `lagged` notice taken, the stream's log still open): nothing comes.
        let log = self.stream.log();
        self.live = !self.done
            && self.cursor >= rendition.len()
            && rendition.rendered() >= log.last_sequence()
            && !log.is_ended();
        batch
    }

    /// True when the last batch taken held everything the stream had: the reader keeps up with the producer
    /// rather than catches up (a transport may then gather what comes next for a moment, see `http/sse.rs`).
    pub(crate) fn is_live(&self) -> bool {
        self.live
    }

    /// What can be taken now from the private rendition, rendering it on as far as needed and dropping
    /// what was taken.
    fn take_private(&mut self) -> Option<Batch> {
        let cursor = self.cursor;
        let mut private = self
            .private
            .take()
            .unwrap_or_else(|| Rendition::private(self.render.renderer(self.stream.info()), Arc::clone(&self.renders)));
        // Not counted against the hub: it holds at most a chunk of frames beyond what this reader takes.
        let mut counted = CountChange::default();
        while cursor >= private.len() && private.catch_up(self.stream.log(), &mut counted) {
            private.trim_before(cursor);
        }
        let lengths = |private: &Rendition, first, count| Bounds::Lengths(private.frame_lengths(first, first + count));
        let batch = self.take_from(&private, lengths);
        private.trim_before(self.cursor);
        self.private = Some(private);
        batch
    }

    /// The frames after the cursor in `rendition` (up to the batch limit), moving the cursor past them; the
    /// notice instead when what comes next is gone; nothing (and done, at the end) when there is nothing.
    fn take_from(
        &mut self,
        rendition: &Rendition,
        bounds: impl FnOnce(&Rendition, usize, usize) -> Bounds,
    ) -> Option<Batch> {
        let batch_bytes = self.stream.hub_state().config.batch_bytes;
        // Gone matters only to a reader that still needs something: frames dropped before it read them, or
        // entries never rendered. One that read to the end of a finished rendition just ends.
        let unrendered = self.cursor >= rendition.len() && !rendition.finished;
        if let Some(gone) = rendition.gone
            && (rendition.is_forgotten(self.cursor) || unrendered)
        {
            return Some(self.interrupted(rendition, gone.kept_after));
        }
        let end = rendition.len();
        if self.cursor >= end {
            self.done = rendition.finished;
            return None;
        }
        let until = rendition.fitting(self.cursor, end, batch_bytes);
        let pieces = rendition.pieces(self.cursor, until);
        let (first, count) = (self.cursor, until - self.cursor);
        self.cursor = until;
        let last_sequence = rendition.sequence_before(until);
        Some(Batch { pieces, last_sequence, lagged: false, published: None, bounds: bounds(rendition, first, count) })
    }

    /// The last batch of a subscriber whose history is gone.
    fn interrupted(&mut self, rendition: &Rendition, kept_after: u64) -> Batch {
        self.done = true;
        let resume = rendition.sequence_before(self.cursor);
        let (bytes, lengths) = rendition.interrupt(&Gone { asked: resume, kept_after });
        Batch {
            pieces: vec![bytes],
            last_sequence: resume,
            lagged: true,
            published: None,
            bounds: Bounds::Lengths(lengths),
        }
    }

    /// The subscription as a `futures::Stream` of batches.
    pub fn into_stream(self) -> impl futures::Stream<Item = Batch> + Send {
        futures::stream::unfold(self, |mut subscription| async move {
            subscription.next().await.map(|batch| (batch, subscription))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::agent::{Output, StreamingMessage};
    use crate::hub::{Hub, HubConfig};
    use crate::render::Format;

    /// A stream of `deltas` text deltas in a hub whose batches hold one frame each, its text message still
    /// open, and a subscriber from the start that has taken nothing yet.
    fn backlog(deltas: usize) -> (Hub, StreamingMessage, super::Subscription) {
        let hub = Hub::new(HubConfig { batch_bytes: 1, ..HubConfig::default() });
        let stream = hub.create("test").expect("a stream");
        let mut text = Output::new(Arc::clone(&stream)).stream_text();
        for i in 0..deltas {
            text.append(format!("delta {i}")).expect("append");
        }
        let subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
        (hub, text, subscription)
    }

    /// A subscriber is live once a batch took everything the stream had, not while it works through a
    /// backlog (batches of one frame here) and not before it has taken anything.
    #[tokio::test]
    async fn a_subscriber_is_live_only_once_it_has_taken_everything_there_was() {
        let (_hub, mut text, mut subscription) = backlog(5);
        assert!(!subscription.is_live(), "nothing taken yet");
        let mut batches = 0;
        while !subscription.is_live() {
            let batch = subscription.next().await.expect("a batch");
            assert_eq!(batch.frames().len(), 1, "one frame per batch at this batch limit");
            batches += 1;
            assert!(batches <= 7, "live after the stream_start, the message_start and five deltas");
        }
        assert_eq!(batches, 7);
        text.append("one more").expect("append");
        assert!(subscription.next().await.is_some());
        assert!(subscription.is_live(), "took the one new frame: live again");
    }

    /// On a runtime with one thread, a subscriber reading a backlog batch after batch lets another task run
    /// between its batches (each a batch limit's worth here), rather than hold the thread until it has
    /// caught up.
    #[tokio::test(flavor = "current_thread")]
    async fn a_subscriber_working_through_a_backlog_lets_other_tasks_run_between_batches() {
        let (_hub, _text, mut subscription) = backlog(50);
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let other = {
            let ran = Arc::clone(&ran);
            tokio::spawn(async move {
                loop {
                    ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        let mut batches = 0;
        while !subscription.is_live() {
            subscription.next().await.expect("a batch");
            batches += 1;
        }
        let during = ran.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(batches, 52, "the stream_start, the message_start and 50 deltas, a frame each");
        assert!(during >= batches - 1, "the other task ran {during} times while {batches} batches were taken");
        other.abort();
    }
}
