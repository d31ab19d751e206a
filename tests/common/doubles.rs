//! Test doubles for the hub's injectable clock and ids: deterministic time and names for golden files, and
//! a clock a test moves by hand for retention.

use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;

use agentmux::hub::{Clock, Hub, HubConfig, Ids, Limits};

/// A clock that starts at a given time and advances one millisecond per reading.
#[derive(Debug)]
pub(crate) struct SteppingClock(AtomicU64);

impl SteppingClock {
    /// Starts at `start_ms`.
    pub(crate) fn new(start_ms: u64) -> Self {
        SteppingClock(AtomicU64::new(start_ms))
    }

    /// Moves the clock forward by `ms`.
    #[allow(dead_code)]
    pub(crate) fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::Relaxed);
    }
}

impl Clock for SteppingClock {
    fn now_ms(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// `s1`, `s2`, ... and `e1`, `e2`, ...: for tests.
#[derive(Debug, Default)]
pub(crate) struct CountingIds(AtomicU64);

impl Ids for CountingIds {
    fn stream_id(&self) -> String {
        format!("s{}", self.0.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn epoch(&self) -> String {
        format!("e{}", self.0.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// A hub with these limits, a stepping clock from 1,000 ms and counting ids: the same stamps every run.
pub(crate) fn deterministic_hub(limits: Limits) -> Hub {
    Hub::new(HubConfig {
        limits,
        clock: Arc::new(SteppingClock::new(1_000)),
        ids: Arc::new(CountingIds::default()),
        ..HubConfig::default()
    })
}
