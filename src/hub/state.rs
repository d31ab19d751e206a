//! [`HubState`]: what the hub and every one of its streams share.
//!
//! A stream holds it (an `Arc`) to count its bytes against the hub's limit, to report its end (which starts
//! its retention: it stays in its client's budget until evicted, `held.rs`) and to find the count of messages rendered in a format; the
//! hub holds it for the same figures, to admit a client's new stream and to say when room is expected. It
//! sits apart from both so that neither imports the other for it. Every count here is one atomic or a short
//! lock: the byte count is the one atomic every stream's producer and readers share (see "Memory" in the
//! hub's module doc).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::{Budget, HubConfig};
use super::error::HubError;
use super::held::Held;

/// What the hub and its streams share: the config, the byte count, and what each client holds (the ended
/// streams awaiting eviction among it).
#[derive(Debug)]
pub(crate) struct HubState {
    pub(crate) config: HubConfig,
    pub(super) bytes: AtomicU64,
    /// The streams held by owner, and the ended ones in the order of their eviction (`held.rs`).
    pub(super) held: Mutex<Held>,
    /// The earliest an open stream can reach its idle timeout (ms by the hub's clock), as of the last sweep;
    /// [`NONE_OPEN`] when none was open, [`NOT_SWEPT`] before the first.
    pub(super) next_idle_ms: AtomicU64,
    /// Messages rendered, by render key (see [`Hub::rendered`](super::Hub::rendered)).
    pub(super) renders: Mutex<Vec<(String, Arc<AtomicU64>)>>,
}

impl HubState {
    /// Nothing counted yet, no stream ended, not swept.
    pub(super) fn new(config: HubConfig) -> Self {
        HubState {
            config,
            bytes: AtomicU64::new(0),
            held: Mutex::new(Held::default()),
            next_idle_ms: AtomicU64::new(NOT_SWEPT),
            renders: Mutex::new(Vec::new()),
        }
    }

    /// The count of messages rendered in `key`.
    pub(crate) fn renders_of(&self, key: &str) -> Arc<AtomicU64> {
        let mut renders = crate::sync::lock(&self.renders);
        if let Some((_, count)) = renders.iter().find(|(k, _)| k == key) {
            return Arc::clone(count);
        }
        let count = Arc::new(AtomicU64::new(0));
        renders.push((key.to_owned(), Arc::clone(&count)));
        count
    }

    /// Counts `bytes` against the hub limit; `false` (and nothing counted) when they do not fit.
    pub(super) fn reserve(&self, bytes: u64) -> bool {
        let limit = self.config.limits.hub_bytes;
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n + bytes <= limit).then_some(n + bytes))
            .is_ok()
    }

    /// Counts bytes that must go in regardless (the stream's own lifecycle events).
    pub(super) fn force_reserve(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    pub(super) fn release(&self, bytes: u64) {
        let _ = self.bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(bytes)));
    }

    /// Records that a stream ended now: it is retained, and still held by its client, until it is evicted.
    pub(super) fn ended(&self, id: &str, client: Option<&str>) {
        let now_ms = self.config.clock.now_ms();
        crate::sync::lock(&self.held).ended(id, client, now_ms);
    }

    /// The held streams, by owner.
    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        crate::sync::lock(&self.held)
    }

    /// Counts a new stream against `client`'s budget of streams held, or says why it does not fit. A client
    /// at its budget makes room by giving up its oldest ended stream: its id is returned, for the hub to
    /// evict. Only a client whose every held stream is open is refused.
    pub(super) fn admit(&self, client: &str) -> Result<Option<String>, HubError> {
        let limits = &self.config.limits;
        let budget = limits.client_budgets.get(client).copied().unwrap_or(Budget {
            streams: limits.streams_per_client,
            streams_per_minute: limits.streams_per_client_per_minute,
        });
        let mut held = self.held();
        let usage = held.client(client);
        let full = usage.held() >= budget.streams;
        if full && (!usage.retains() || usage.open >= budget.streams) {
            // Room comes when one of its streams ends: by its producer, or at the latest by the idle timeout.
            let idle = self.config.idle_timeout;
            let retry_after = (!idle.is_zero()).then(|| idle.max(Duration::from_secs(1)));
            return Err(HubError::ClientStreams { limit: budget.streams, retry_after });
        }
        if budget.streams_per_minute > 0 {
            let now_ms = self.config.clock.now_ms();
            if now_ms.saturating_sub(usage.minute_started_ms) >= MINUTE_MS {
                usage.minute_started_ms = now_ms;
                usage.created_this_minute = 0;
            }
            if usage.created_this_minute >= budget.streams_per_minute {
                let left = MINUTE_MS.saturating_sub(now_ms.saturating_sub(usage.minute_started_ms));
                return Err(HubError::ClientRate {
                    limit: budget.streams_per_minute,
                    retry_after: Duration::from_millis(left.max(1)),
                });
            }
            usage.created_this_minute += 1;
        }
        usage.open += 1;
        // Past its budget only by its retained streams: its oldest goes (more than one when the budget is
        // smaller than what it held already, e.g. after a restart with a smaller one).
        let mut evicted = None;
        while held.client(client).held() > budget.streams {
            match held.take_oldest_of(client) {
                Some(id) => evicted = Some(id),
                None => break,
            }
        }
        Ok(evicted)
    }

    /// Notes that a stream opened at `created_ms`: it can time out from then on, earlier than the last sweep
    /// knew of (or when it knew of none open).
    pub(super) fn opened(&self, created_ms: u64) {
        let idle_timeout = self.config.idle_timeout.as_millis() as u64;
        if idle_timeout == 0 {
            return;
        }
        let deadline = created_ms.saturating_add(idle_timeout);
        let _ = self.next_idle_ms.fetch_update(Ordering::AcqRel, Ordering::Acquire, |known| {
            (known == NONE_OPEN || known > deadline).then_some(deadline)
        });
    }

    /// Forgets the clients that hold nothing and have no minute running, so that clients come and go
    /// without the map growing.
    pub(super) fn forget_idle_clients(&self) {
        let now_ms = self.config.clock.now_ms();
        self.held().forget_idle_clients(now_ms, MINUTE_MS);
    }

    /// Gives back what [`HubState::admit`] counted, for a stream that was not made after all.
    pub(super) fn unadmit(&self, client: &str) {
        self.held().unadmit(client);
    }

    /// When the hub expects room: the oldest ended stream's eviction, or the earliest idle timeout.
    ///
    /// For a place among the streams (`ended_makes_room`), an ended stream makes room at once, since it is
    /// evicted early for a new one: room comes when an open stream times out. For bytes, room comes back
    /// when an ended stream is evicted, a retention after its end.
    pub(super) fn room_expected_in(&self, ended_makes_room: bool) -> Option<Duration> {
        let now_ms = self.config.clock.now_ms();
        let retention = if ended_makes_room { 0 } else { self.config.retention.as_millis() as u64 };
        let eviction = self.held().oldest_end_ms().map(|at| at.saturating_add(retention));
        // A stream that times out is retained like any ended stream: its room comes back a retention later
        // (at once for a place). Before the first sweep, the latest an open stream can time out stands for
        // the earliest.
        let idle_timeout = self.config.idle_timeout.as_millis() as u64;
        let idle = match self.next_idle_ms.load(Ordering::Acquire) {
            _ if idle_timeout == 0 => None,
            NOT_SWEPT => Some(now_ms.saturating_add(idle_timeout)),
            NONE_OPEN => None,
            at => Some(at),
        };
        let idle = idle.map(|at| at.saturating_add(retention));
        let at = [eviction, idle].into_iter().flatten().min()?;
        // At least a second: `Retry-After` counts whole seconds, and the sweep that frees the room runs
        // about once a second.
        Some(Duration::from_millis(at.saturating_sub(now_ms).max(1_000)))
    }
}

const MINUTE_MS: u64 = 60_000;

/// `next_idle_ms` before the first sweep.
const NOT_SWEPT: u64 = u64::MAX;

/// `next_idle_ms` when the last sweep found no open stream.
pub(super) const NONE_OPEN: u64 = 0;
