//! The events that close what is open, and the end of a [`Stream`].
//!
//! # Room to close
//!
//! A stream's own events are never the way past a limit. Every event that opens something reserves the
//! room for the event that will close it (`lifecycle.rs`: its widest form, names bounded and numbers at
//! their largest, stamped with the widest id, sequence and time): `stream_start` for `stream_end` (and for
//! the outcome the log keeps beside it, counted once), `message_start` for `message_end`, `block_start` for
//! `block_end`. The room is a place among the stream's messages and its bytes, counted in the stream's
//! bytes and against the hub like an entry (once per copy, so a reader added later counts it too). A
//! producer's message that would leave no room for what is reserved is refused (`TooManyMessages`,
//! `StreamFull`, `HubFull`), the opening events it calls for included; a batch refused gives back the room
//! its openings reserved with everything else. A closing event then always fits: it takes its room and gives
//! back the difference, so `end_message`, `end_block`, a cancel or a shutdown never add to any count. The one
//! thing that may need more than its room is an outcome larger than the widest an internal end keeps (an
//! error with details, a long message): [`Stream::try_end`] (a producer's end) counts the difference like a
//! message and is refused when it does not fit, changing nothing; [`Stream::end`] (an agent's, a cancel, a
//! shutdown) counts it when it fits, and otherwise shrinks the outcome into its room.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use super::producer::AppendError;
use super::receipts::Appended;
use super::{Producer, Stream, json_size, stamp};
use crate::hub::lifecycle::{self, Closing};
use crate::hub::log::Entry;
use crate::output::{ErrorProps, Outcome, OutputMessage};

impl Stream {
    /// Ends an open message (one that streams in deltas): appends its `message_end`, into the room reserved
    /// for it when the message opened. `Ok(None)` when it was not open.
    pub fn end_message(&self, message_id: &str) -> Result<Option<u64>, AppendError> {
        self.end_part(Part::Message(message_id)).map(|ended| ended.sequences.last().copied())
    }

    /// Ends an open block: `message_end` for its open messages, then `block_end`, into their reserved room.
    pub fn end_block(&self, block_id: &str) -> Result<Option<u64>, AppendError> {
        self.end_part(Part::Block(block_id)).map(|ended| ended.sequences.last().copied())
    }

    /// Ends a message or a block as [`Stream::end_message`] and [`Stream::end_block`] do: the sequences of
    /// the closing events (none when it was not open) and the stream's last sequence after them.
    pub(crate) fn end_part(&self, part: Part<'_>) -> Result<Appended, AppendError> {
        if self.followed {
            return Err(self.refusal_when_followed());
        }
        let mut producer = self.lock();
        if producer.end.is_some() {
            return Err(AppendError::Ended);
        }
        let now_ms = self.hub.config.clock.now_ms();
        let closings = match part {
            Part::Message(id) => producer.lifecycle.end_message(id, now_ms).into_iter().collect(),
            Part::Block(id) => producer.lifecycle.end_block(id, now_ms),
        };
        let mut sequences = Vec::with_capacity(closings.len());
        let entries: Vec<Entry> = closings
            .into_iter()
            .map(|closing| {
                let id = self.new_id("m");
                let entry = self.push_closing(&mut producer, closing, id, now_ms);
                sequences.push(producer.last);
                entry
            })
            .collect();
        if !entries.is_empty() {
            self.log.append(entries);
        }
        self.active_ms.store(now_ms, Ordering::Release);
        Ok(Appended { sequences, last_sequence: producer.last, replayed: false })
    }

    /// Ends the stream: ends what is open, appends `stream_end`, and records the outcome. `false` when it had
    /// already ended.
    ///
    /// It cannot be refused (an agent's end, a cancel, a shutdown): the closing events go into the room
    /// reserved for them, and an outcome larger than its room (an agent's long error, its details) is kept
    /// whole when the limits have room for the difference, and otherwise shrunk to fit its room (the
    /// error's details dropped, its message and code cut). An error code is a name: one over
    /// [`crate::output::NAME_BYTES`] is cut to it. See [`Stream::try_end`] for an end that may be refused
    /// instead.
    pub fn end(&self, outcome: Outcome) -> bool {
        self.finish(outcome, false, false).unwrap_or(false)
    }

    /// Ends the stream as [`Stream::end`] does, but with an outcome a producer sent: one that does not fit is
    /// refused rather than shrunk, and the stream stays open as it was, so the producer may end it again
    /// with less. Refused: [`AppendError::Ended`]; [`AppendError::Invalid`] for an error `code` over
    /// [`crate::output::NAME_BYTES`]; [`AppendError::MessageTooLarge`] when its `stream_end` would be over
    /// the message size limit; [`AppendError::StreamFull`] or [`AppendError::HubFull`] when the room reserved
    /// for the end and the limits together cannot hold it.
    pub fn try_end(&self, outcome: Outcome) -> Result<(), AppendError> {
        outcome.validate()?;
        self.finish(outcome, true, false).map(|_| ())
    }

    /// Ends the stream; see [`Stream::end`] (`refusable`: false) and [`Stream::try_end`]. `cancelling`: fires
    /// the cancellation token too, once the end is in the log and before anyone else may append (see
    /// [`Stream::stop`]).
    fn finish(&self, mut outcome: Outcome, refusable: bool, cancelling: bool) -> Result<bool, AppendError> {
        if self.followed {
            return if refusable { Err(self.refusal_when_followed()) } else { Ok(false) };
        }
        let mut producer = self.lock();
        if producer.end.is_some() {
            return if refusable { Err(AppendError::Ended) } else { Ok(false) };
        }
        let limits = &self.hub.config.limits;
        let copies = producer.copies();
        let now_ms = self.hub.config.clock.now_ms();
        let duration_ms = now_ms.saturating_sub(producer.started_ms);
        // One closing event for each open message and block, ended only once the end cannot be refused.
        let open = producer.lifecycle.open();
        // Ids in the order of the events, taken now to size `stream_end` before anything is appended.
        let ids: Vec<String> = (0..open).map(|_| self.new_id("m")).collect();
        let end_id = self.new_id("m");
        let sequence = producer.last + open as u64 + 1;
        let sized = |outcome: &Outcome| {
            let mut end = lifecycle::stream_end(outcome, duration_ms);
            end.message_id = Some(end_id.clone());
            stamp(&mut end, sequence, now_ms, None);
            let size = json_size(&end);
            (end, size, json_size(outcome))
        };
        let mut room = self.widest_end().0;
        let mut outcome_room = producer.outcome_bytes;
        if !refusable {
            lifecycle::bound_code(&mut outcome);
        }
        let (mut end, mut size, mut outcome_size) = sized(&outcome);
        // What does not fit the reserved room is counted like a producer's message, and may be refused.
        let (extra, outcome_extra) = (size.saturating_sub(room), outcome_size.saturating_sub(outcome_room));
        let refused = if extra == 0 && outcome_extra == 0 {
            None
        } else if size > limits.message_bytes {
            Some(AppendError::MessageTooLarge { size, limit: limits.message_bytes })
        } else if producer.bytes + extra > limits.stream_bytes {
            Some(AppendError::StreamFull { limit: limits.stream_bytes })
        } else if !self.reserve(extra * copies + outcome_extra) {
            Some(AppendError::HubFull { limit: limits.hub_bytes })
        } else {
            None
        };
        match refused {
            None => {
                producer.bytes += extra;
                (room, outcome_room) = (room + extra, outcome_room + outcome_extra);
            }
            Some(error) if refusable => return Err(error),
            Some(_) => {
                lifecycle::shrink(&mut outcome, |o| {
                    let (_, size, outcome_size) = sized(o);
                    size <= room && outcome_size <= outcome_room
                });
                (end, size, outcome_size) = sized(&outcome);
            }
        }
        let closings = producer.lifecycle.end_all(now_ms);
        let mut entries: Vec<Entry> = closings
            .into_iter()
            .zip(ids)
            .map(|(closing, id)| self.push_closing(&mut producer, closing, id, now_ms))
            .collect();
        // The reducer takes any event that starts a message.
        let _ = producer.reducer.apply(&end);
        producer.last = sequence;
        self.settle(&mut producer, room, size);
        producer.closings = producer.closings.saturating_sub(1);
        if outcome_size < outcome_room {
            self.release(outcome_room - outcome_size);
        }
        producer.outcome_bytes = outcome_size;
        entries.push(Entry::message(end));
        let outcome = Arc::new(outcome);
        entries.push(Entry::End(Arc::clone(&outcome)));
        producer.end = Some(Arc::clone(&outcome));
        let on_end = std::mem::take(&mut producer.on_end);
        self.log.append(entries);
        if cancelling {
            self.cancel.cancel();
        }
        drop(producer);
        self.warm.store(true, Ordering::Release);
        self.hub.ended(&self.info.id, self.client.as_deref());
        on_end.into_iter().for_each(|then| then(&outcome));
        Ok(true)
    }

    /// Calls `then` with the outcome once the end is recorded (at once if it already is), on the thread
    /// that ends the stream, outside its locks: how a count of ends is kept without a task that waits for
    /// each stream's end (and is woken by every append on the way). The end is recorded when it is
    /// appended, before a store commits it. A stream followed from another node records no end here: `then`
    /// is never called for it.
    pub(crate) fn when_ended(&self, then: impl FnOnce(&Outcome) + Send + 'static) {
        let mut producer = self.lock();
        match producer.end.clone() {
            Some(outcome) => {
                drop(producer);
                then(&outcome);
            }
            None if self.followed => {}
            None => producer.on_end.push(Box::new(then)),
        }
    }

    /// Cancels the stream: fires the cancellation token the agent watches and ends the stream `cancelled`.
    /// `false` when it had already ended.
    pub fn cancel(&self) -> bool {
        self.stop(Outcome::cancelled())
    }

    /// Ends the stream with `outcome` as [`Stream::end`] does, and fires the cancellation token the agent
    /// watches (a cancel, a shutdown, an idle timeout, a store that failed). `false` when it had already
    /// ended; the token fires either way.
    ///
    /// The token fires after the end and before the producer's lock is let go: an agent woken by it that
    /// ends the stream finds it ended (its outcome does not win), and an agent whose emit is refused because
    /// the stream ended already sees itself cancelled.
    pub(crate) fn stop(&self, outcome: Outcome) -> bool {
        let ended = self.finish(outcome, false, true).unwrap_or(false);
        self.cancel.cancel();
        ended
    }

    /// Ends the stream with the error `store_unavailable` (and cancels what runs it) when its log could not
    /// keep what it was given, as a store whose disk failed: whoever waits for an acknowledgement and the
    /// hub's sweep (for a stream nobody waits on) call it. True when it ended the stream.
    pub(crate) fn end_unkept(&self) -> bool {
        if self.log.keeps() {
            return false;
        }
        let outcome = Outcome::failed(ErrorProps {
            message: NOT_KEPT.into(),
            code: Some("store_unavailable".into()),
            details: None,
        });
        let ended = self.stop(outcome);
        if ended {
            tracing::error!(stream = self.info.id, "messages not kept: the stream is ended");
        }
        ended
    }

    /// Stamps one of the stream's closing events and reduces it; it takes the room reserved for it.
    fn push_closing(&self, producer: &mut Producer, closing: Closing, id: String, now_ms: u64) -> Entry {
        let room = self.reservation(closing.widest);
        let entry = self.stamp_event(producer, closing.event, id, now_ms);
        self.settle(producer, room, entry.bytes());
        producer.closings = producer.closings.saturating_sub(1);
        entry
    }

    /// The room `stream_end` takes at most (its [`Stream::reservation`] with the widest outcome), and the
    /// bytes of that outcome. Both are the same for every stream but for the epoch in the end's id, so the
    /// rest is sized once per process rather than serialized again for each new stream (a stream's creation
    /// is on the way to a relayed run's first token): the id's JSON is its fixed part and the epoch's, as
    /// JSON, less that string's two quotes.
    pub(super) fn widest_end(&self) -> (u64, u64) {
        static WIDEST: OnceLock<(u64, u64)> = OnceLock::new();
        let (without_epoch, outcome) = *WIDEST.get_or_init(|| {
            let mut end = lifecycle::stream_end(&lifecycle::widest_outcome(), u64::MAX);
            end.message_id = Some(format!("m{}-", u64::MAX));
            stamp(&mut end, u64::MAX, u64::MAX, None);
            (json_size(&end), json_size(&lifecycle::widest_outcome()))
        });
        let short = self.info.epoch.get(..8).unwrap_or(&self.info.epoch);
        (without_epoch + json_size(&short).saturating_sub(2), outcome)
    }

    /// The room a closing event takes at most, given its widest form: stamped with the widest id and
    /// sequence and time the stream can give it.
    pub(super) fn reservation(&self, mut widest: OutputMessage) -> u64 {
        let short = self.info.epoch.get(..8).unwrap_or(&self.info.epoch);
        widest.message_id = Some(format!("m{}-{short}", u64::MAX));
        stamp(&mut widest, u64::MAX, u64::MAX, None);
        json_size(&widest)
    }
}

/// What [`Stream::end_part`] ends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Part<'a> {
    /// The message of this id.
    Message(&'a str),
    /// The block of this id, and its open messages.
    Block(&'a str),
}

/// The error of a stream its log could not keep.
pub(crate) const NOT_KEPT: &str =
    "the store could not keep this stream's messages (its disk, or Redis, failed); the stream is ended";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::Hub;
    use crate::output::EndStatus;

    #[test]
    fn the_widest_end_sized_once_is_the_one_sized_for_the_stream() {
        let hub = Hub::default();
        for model in ["m", "another"] {
            let stream = hub.create_for(None, model).unwrap();
            let room = stream.reservation(lifecycle::stream_end(&lifecycle::widest_outcome(), u64::MAX));
            assert_eq!(stream.widest_end(), (room, json_size(&lifecycle::widest_outcome())));
        }
    }

    /// Told once, with the outcome that ended the stream, whether asked before the end or after it; a second
    /// end (refused) tells no one again.
    #[test]
    fn when_ended_tells_the_end_once_before_or_after_it() {
        use std::sync::Mutex;
        let hub = Hub::default();
        let stream = hub.create_for(None, "m").unwrap();
        let told = Arc::new(Mutex::new(Vec::new()));
        let before = Arc::clone(&told);
        stream.when_ended(move |outcome| crate::sync::lock(&before).push(("before", outcome.status)));
        assert!(crate::sync::lock(&told).is_empty(), "not ended yet");
        assert!(stream.cancel());
        assert!(!stream.end(Outcome::completed()));
        let after = Arc::clone(&told);
        stream.when_ended(move |outcome| crate::sync::lock(&after).push(("after", outcome.status)));
        let told = crate::sync::lock(&told).clone();
        assert_eq!(told, [("before", EndStatus::Cancelled), ("after", EndStatus::Cancelled)]);
    }
}
