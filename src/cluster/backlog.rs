//! [`Backlog`]: what the writer (`writer.rs`) was handed and Redis has not taken yet, as one call per
//! stream, each stream's appends merged in the order they were handed over.
//!
//! Redis takes a stream's appends only in order and without a gap (the append script refuses a gap), so an
//! append Redis did not take is never dropped while later ones go on: it stays at the head of its stream's
//! call, and whatever the stream appends meanwhile (the end of a stream that could not wait any longer
//! included) is merged behind it. Once Redis answers again the whole call goes in one step, and every node
//! reads the same log and the same end. Past the write timeout the stream is told its appends are not kept
//! (`Committed::fail`: its producer's acknowledgement is refused and the stream ends `store_unavailable`),
//! once; the call stays and is tried again, at most once a second. It leaves the backlog only when Redis takes
//! it, when Redis refuses it for good (another node owns the stream and has ended it, or Redis lost the
//! stream), or when this node no longer holds the stream (its retention passed while Redis was away).
//!
//! So what the backlog holds is bounded by what the hub holds: a stream takes no append once it has ended,
//! and its entries are shared with the stream's log here (`Bytes`), not copied.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::script::Append;
use crate::hub::Committed;

/// The pause before the first retry of a call Redis did not take; it doubles up to [`MOST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// The longest pause between two tries of a call.
const MOST_PAUSE: Duration = Duration::from_secs(1);

/// One stream's appends, for the writer.
pub(super) struct Command {
    pub(super) stream: Arc<str>,
    pub(super) append: Append,
    /// The last sequence once this is written (the stream's last so far when it adds no message).
    pub(super) last: u64,
    pub(super) ends: bool,
    pub(super) committed: Arc<Committed>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command").field("stream", &self.stream).field("last", &self.last).finish_non_exhaustive()
    }
}

impl Command {
    /// Adds `later`, an append of the same stream handed over after this one, behind it.
    fn merge(&mut self, later: Command) {
        if self.append.messages.is_empty() {
            self.append.first = later.append.first;
        }
        self.append.messages.extend(later.append.messages);
        self.append.outcome = self.append.outcome.take().or(later.append.outcome);
        self.append.register = self.append.register.take().or(later.append.register);
        self.last = later.last;
        self.ends |= later.ends;
    }

    /// True when nothing on this node holds the stream any more (it was evicted): nobody is left to tell.
    pub(super) fn orphaned(&self) -> bool {
        Arc::strong_count(&self.committed) == 1
    }
}

/// A stream's call, and how its tries went.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) command: Command,
    /// When it was first tried.
    tried_since: Option<Instant>,
    /// Not before then.
    next_try: Instant,
    pause: Duration,
    /// Its stream was told it is not kept.
    told: bool,
}

impl Pending {
    fn new(command: Command, now: Instant) -> Pending {
        Pending { command, tried_since: None, next_try: now, pause: FIRST_PAUSE, told: false }
    }

    /// Redis did not take it (at `now`): it is tried again after a pause. [`Failure::TimedOut`] when, past
    /// `write_timeout` since its first try, its stream is to be told now that it is not kept (once).
    pub(super) fn failed(&mut self, now: Instant, write_timeout: Duration) -> Failure {
        let first = self.pause == FIRST_PAUSE;
        self.next_try = now + self.pause;
        self.pause = (self.pause * 2).min(MOST_PAUSE);
        let since = *self.tried_since.get_or_insert(now);
        if !self.told && now.duration_since(since) >= write_timeout {
            self.told = true;
            Failure::TimedOut
        } else if first {
            Failure::First
        } else {
            Failure::Again
        }
    }
}

/// What a failed try of a call means (see [`Pending::failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// Its first failure.
    First,
    /// It failed again, within the write timeout or after its stream was told.
    Again,
    /// The write timeout has passed: its stream is to be told it is not kept.
    TimedOut,
}

/// See the module doc.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    calls: HashMap<Arc<str>, Pending>,
}

impl Backlog {
    /// Adds an append handed over at `now`, behind whatever its stream has waiting.
    pub(super) fn push(&mut self, command: Command, now: Instant) {
        match self.calls.get_mut(&command.stream) {
            Some(pending) => pending.command.merge(command),
            None => {
                self.calls.insert(Arc::clone(&command.stream), Pending::new(command, now));
            }
        }
    }

    /// Takes out the calls due at `now`, to be tried.
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<Pending> {
        let mut due: Vec<Pending> =
            self.calls.extract_if(|_, pending| pending.next_try <= now).map(|(_, p)| p).collect();
        for pending in &mut due {
            pending.tried_since.get_or_insert(now);
        }
        due
    }

    /// Puts back a call Redis did not take, ahead of anything its stream appended since it was taken out.
    pub(super) fn put_back(&mut self, mut pending: Pending) {
        if let Some(later) = self.calls.remove(&pending.command.stream) {
            pending.command.merge(later.command);
        }
        self.calls.insert(Arc::clone(&pending.command.stream), pending);
    }

    /// When the next call is due (`None`: nothing waits).
    pub(super) fn next_try(&self) -> Option<Instant> {
        self.calls.values().map(|pending| pending.next_try).min()
    }

    /// True when Redis has everything.
    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::MemoryLog;

    fn command(stream: &str, first: u64, count: u64, ends: bool) -> Command {
        Command {
            stream: Arc::from(stream),
            append: Append {
                first,
                messages: (first..first + count).map(|s| bytes::Bytes::from(s.to_string())).collect(),
                outcome: ends.then(|| ("{}".to_owned(), 0)),
                register: None,
            },
            last: first + count - 1,
            ends,
            committed: Committed::new(0, false, MemoryLog::default()),
        }
    }

    fn sequences(pending: &Pending) -> Vec<String> {
        pending.command.append.messages.iter().map(|m| String::from_utf8_lossy(m).into_owned()).collect()
    }

    #[test]
    fn a_call_redis_did_not_take_goes_again_ahead_of_what_its_stream_appended_meanwhile() {
        let now = Instant::now();
        let mut backlog = Backlog::default();
        backlog.push(command("s", 1, 2, false), now);
        let mut due = backlog.take_due(now);
        assert_eq!(due.len(), 1);
        // Appended while the call was out; then the call fails and comes back.
        backlog.push(command("s", 3, 1, false), now);
        backlog.push(command("s", 4, 1, true), now);
        let mut failed = due.remove(0);
        assert_eq!(failed.failed(now, Duration::from_secs(10)), Failure::First);
        backlog.put_back(failed);
        assert!(backlog.take_due(now).is_empty(), "not again before its pause");
        let later = now + MOST_PAUSE;
        let again = backlog.take_due(later);
        assert_eq!(again.len(), 1);
        assert_eq!(sequences(&again[0]), ["1", "2", "3", "4"]);
        assert_eq!((again[0].command.append.first, again[0].command.last, again[0].command.ends), (1, 4, true));
        assert!(backlog.is_empty());
    }

    #[test]
    fn a_stream_is_told_once_past_the_write_timeout_and_its_call_kept() {
        let now = Instant::now();
        let mut backlog = Backlog::default();
        backlog.push(command("s", 1, 1, false), now);
        let mut pending = backlog.take_due(now).remove(0);
        let timeout = Duration::from_secs(3);
        assert_eq!(pending.failed(now + Duration::from_secs(2), timeout), Failure::First);
        assert_eq!(pending.failed(now + Duration::from_secs(3), timeout), Failure::TimedOut, "told at the timeout");
        assert_eq!(pending.failed(now + Duration::from_secs(9), timeout), Failure::Again, "and only once");
        backlog.put_back(pending);
        // Pauses of 20, 40, then 80 ms.
        assert_eq!(backlog.next_try(), Some(now + Duration::from_secs(9) + Duration::from_millis(80)));
    }
}
