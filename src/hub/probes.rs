//! [`Probes`]: when a sample of a stream's messages were published, so a transport can tell how long a
//! message took from its producer to a subscriber's write (`agentmux_publish_to_deliver_seconds`).
//!
//! Timing every message for every subscriber would put a clock read and a shared histogram on the fan-out
//! hot path, per delivery. So the producer marks at most one append per [`EVERY`] as a probe (its last
//! sequence and the instant it was appended), and each subscriber keeps a [`Cursor`]: the next probe it
//! will reach, copied out when it first looks. A batch then costs a subscriber a comparison with that copy,
//! or one atomic load when it has none; the lock is taken once per probe per subscriber, however far
//! behind it reads. Each probe is observed once by each subscriber that was there when it was published (a
//! late joiner's replay of older history is not a delivery delay).
//!
//! Only the last [`KEPT`] probes are kept, a fixed few hundred bytes per stream. A reader further behind
//! than that skips the probes dropped before it looked, and counts the oldest kept one when it reaches it,
//! so a reader that fell far behind still shows in the tail, at its true delay.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The shortest time between two probes.
const EVERY: Duration = Duration::from_millis(100);

/// Probes kept: at one per [`EVERY`], the last few seconds.
const KEPT: usize = 32;

/// A stream's probes; see the module doc.
#[derive(Debug)]
pub(crate) struct Probes {
    /// What the instants are counted from.
    base: Instant,
    /// Nanoseconds after `base` before which no new probe is taken. Written by the producer only.
    due: AtomicU64,
    /// The newest probe's sequence (0: none yet), read before the lock.
    newest: AtomicU64,
    /// Sequence and nanoseconds after `base`, oldest first.
    kept: Mutex<VecDeque<(u64, u64)>>,
}

impl Default for Probes {
    fn default() -> Self {
        Probes { base: Instant::now(), due: AtomicU64::new(0), newest: AtomicU64::new(0), kept: Mutex::default() }
    }
}

impl Probes {
    /// The producer appended up to `sequence`: a probe, if the last one is [`EVERY`] old. Called by the
    /// stream's producer only, in sequence order.
    pub(crate) fn appended(&self, sequence: u64) {
        let now = self.nanos(Instant::now());
        if now < self.due.load(Ordering::Relaxed) {
            return;
        }
        self.due.store(now.saturating_add(EVERY.as_nanos() as u64), Ordering::Relaxed);
        let mut kept = crate::sync::lock(&self.kept);
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((sequence, now));
        self.newest.store(sequence, Ordering::Release);
    }

    /// A cursor for a subscriber joining now: it counts the probes published from now on.
    pub(crate) fn cursor(&self) -> Cursor {
        Cursor { seen: self.newest.load(Ordering::Acquire), next: None }
    }

    /// The first kept probe after sequence `seen`.
    fn after(&self, seen: u64) -> Option<(u64, Instant)> {
        if self.newest.load(Ordering::Acquire) <= seen {
            return None;
        }
        let kept = crate::sync::lock(&self.kept);
        let next = kept.partition_point(|&(sequence, _)| sequence <= seen);
        kept.get(next).map(|&(sequence, at)| (sequence, self.base + Duration::from_nanos(at)))
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Where a subscriber is among its stream's probes.
#[derive(Debug)]
pub(crate) struct Cursor {
    /// Probes up to this sequence are accounted for.
    seen: u64,
    /// The next probe it will reach, once looked up.
    next: Option<(u64, Instant)>,
}

impl Cursor {
    /// The subscriber took messages up to sequence `upto`: when the probe among them was published, if one
    /// is (the earliest, if several are: the later ones were published sooner before this moment).
    pub(crate) fn took(&mut self, probes: &Probes, upto: u64) -> Option<Instant> {
        if self.next.is_none() {
            self.next = probes.after(self.seen);
        }
        let (sequence, at) = self.next?;
        if sequence > upto {
            return None;
        }
        // Later probes in the same batch are passed over: one sample per batch.
        self.seen = upto;
        self.next = None;
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Probes at `sequences`, taken without waiting [`EVERY`] between them.
    fn probes_at(sequences: &[u64]) -> Probes {
        let probes = Probes::default();
        for &sequence in sequences {
            probes.due.store(0, Ordering::Relaxed);
            probes.appended(sequence);
        }
        probes
    }

    #[test]
    fn a_probe_is_observed_once_by_the_batch_that_holds_it() {
        let probes = probes_at(&[5, 9]);
        let mut cursor = Cursor { seen: 0, next: None };
        assert!(cursor.took(&probes, 4).is_none(), "batch 1..=4 holds no probe");
        assert!(cursor.took(&probes, 7).is_some(), "batch 5..=7 holds probe 5");
        assert!(cursor.took(&probes, 8).is_none(), "probe 5 was counted, 9 not reached");
        assert!(cursor.took(&probes, 20).is_some(), "probe 9");
        assert!(cursor.took(&probes, 30).is_none(), "nothing newer");
    }

    #[test]
    fn no_second_probe_before_its_time() {
        let probes = Probes::default();
        probes.appended(1);
        probes.appended(2);
        assert_eq!(probes.cursor().seen, 1, "the second append came too soon to be a probe");
    }

    #[test]
    fn a_reader_behind_every_kept_probe_counts_the_oldest_kept_one_when_it_reaches_it() {
        let sequences: Vec<u64> = (1..=KEPT as u64 + 3).map(|i| i * 10).collect();
        let probes = probes_at(&sequences);
        let mut cursor = Cursor { seen: 0, next: None };
        assert!(cursor.took(&probes, 15).is_none(), "10 and 20 and 30 were dropped before it looked");
        assert_eq!(cursor.next.map(|(sequence, _)| sequence), Some(40), "the oldest kept");
        assert!(cursor.took(&probes, 39).is_none());
        assert!(cursor.took(&probes, 45).is_some(), "probe 40, when reached");
        assert!(cursor.took(&probes, 49).is_none());
        assert_eq!(cursor.next.map(|(sequence, _)| sequence), Some(50), "copied out");
        for sequence in [400, 410] {
            probes.due.store(0, Ordering::Relaxed);
            probes.appended(sequence);
        }
        assert!(cursor.took(&probes, 55).is_some(), "probe 50 left the window meanwhile: its copy counts");
        assert!(cursor.took(&probes, 56).is_none());
        assert_eq!(cursor.next.map(|(sequence, _)| sequence), Some(60), "the oldest kept now");
    }

    #[test]
    fn a_subscriber_joining_now_counts_only_later_probes() {
        let probes = probes_at(&[3]);
        let mut cursor = probes.cursor();
        assert!(cursor.took(&probes, 10).is_none());
        probes.due.store(0, Ordering::Relaxed);
        probes.appended(12);
        assert!(cursor.took(&probes, 12).is_some());
    }
}
