//! [`Subscription`]: one subscriber's cursor into a stream's rendition of its format.
//!
//! A subscriber has no queue of its own: its queue is the stretch of the shared rendition between its cursor
//! and the end, so fan-out costs the producer nothing per subscriber and a subscriber that never reads holds
//! no memory beyond what the stream keeps anyway. The bound still applies: when the bytes rendered since the
//! subscriber joined and not yet taken pass the queue limit (1 MiB by default), it gets one last batch with
//! the format's error frames (`code: "lagged"`, the sequence to resume from) and ends. History that existed
//! when it joined does not count, so a client resuming from the start of a long stream is not cut off while
//! it catches up. A backlog is handed out in batches of up to the batch limit, so a transport can send many
//! frames in one write.
//!
//! Waiting uses the stream's `watch` channel: mark the version seen, look at the log, and only then wait,
//! so a message appended between the look and the wait is never missed.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use tokio::sync::watch;

use super::{Format, Stream};
use crate::output::ErrorProps;

/// Frames taken from a stream in one go.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Complete frames of the subscription's format, in order, back to back: what a transport writes.
    pub bytes: Bytes,
    /// The last sequence whose frames are all in this batch or before it: where to resume from.
    pub last_sequence: u64,
    /// True when this is the lagged notice that ends the subscription.
    pub lagged: bool,
}

impl Batch {
    /// The frames one by one, each a slice of [`Batch::bytes`]. Every frame is one SSE event, ended by the
    /// blank line that SSE ends events with (field values are single-line JSON), so that is where it splits.
    pub fn frames(&self) -> Vec<Bytes> {
        let mut rest = self.bytes.clone();
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let end = rest.windows(2).position(|w| w == b"\n\n").map_or(rest.len(), |at| at + 2);
            frames.push(rest.split_to(end));
        }
        frames
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True when it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A subscriber's view of a stream; see the module doc.
pub struct Subscription {
    stream: Arc<Stream>,
    format: Format,
    cursor: usize,
    joined: usize,
    changes: watch::Receiver<u64>,
    done: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("stream", &self.stream.id())
            .field("format", &self.format)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) fn new(
        stream: Arc<Stream>,
        format: Format,
        cursor: usize,
        joined: usize,
        changes: watch::Receiver<u64>,
    ) -> Self {
        Subscription { stream, format, cursor, joined, changes, done: false }
    }

    /// The stream subscribed to.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// The next batch of frames, waiting for one if need be; `None` once the stream has ended and every
    /// frame was taken, or after the lagged notice.
    pub async fn next(&mut self) -> Option<Batch> {
        loop {
            if self.done {
                return None;
            }
            self.changes.borrow_and_update();
            if let Some(batch) = self.take() {
                return Some(batch);
            }
            if self.done || self.changes.changed().await.is_err() {
                return None;
            }
        }
    }

    /// What can be taken now without waiting; marks the subscription done at the end.
    fn take(&mut self) -> Option<Batch> {
        let config = &self.stream.shared().config;
        let (queue_bytes, batch_bytes) = (config.queue_bytes, config.batch_bytes);
        let stream = Arc::clone(&self.stream);
        let mut state = stream.lock();
        let latest_append = state.latest_append;
        let rendition = stream.rendition(&mut state, self.format);
        let end = rendition.len();
        if self.cursor >= end {
            self.done = rendition.finished;
            return None;
        }
        // Behind by what was rendered since joining, except the latest append: one burst (a big batch, the
        // events that end a stream) does not make a subscriber that kept up a slow one.
        let burst = rendition.frame_after(latest_append.saturating_sub(1));
        let backlog = rendition.bytes_between(self.cursor.max(self.joined), burst);
        if backlog > queue_bytes && end - self.cursor > 1 {
            let resume = rendition.sequence_before(self.cursor);
            let error = ErrorProps {
                message: format!(
                    "this subscriber fell more than {queue_bytes} bytes behind; resume after sequence {resume}"
                ),
                code: Some("lagged".into()),
                details: Some(json!({ "resume_from": resume })),
            };
            self.done = true;
            let bytes = rendition.interrupt(&error).concat().into();
            return Some(Batch { bytes, last_sequence: resume, lagged: true });
        }
        let mut taken = 0u64;
        let mut until = self.cursor;
        while until < end && (until == self.cursor || taken + rendition.frame_len(until) <= batch_bytes) {
            taken += rendition.frame_len(until);
            until += 1;
        }
        let bytes = rendition.slice(self.cursor, until);
        self.cursor = until;
        let last_sequence = rendition.sequence_before(until);
        Some(Batch { bytes, last_sequence, lagged: false })
    }

    /// The subscription as a `futures::Stream` of batches.
    pub fn into_stream(self) -> impl futures::Stream<Item = Batch> + Send {
        futures::stream::unfold(self, |mut subscription| async move {
            subscription.next().await.map(|batch| (batch, subscription))
        })
    }
}
