//! [`HubConfig`] and its [`Limits`]: how a hub behaves and what it may hold, given when it is made.
//!
//! Plain data the hub reads and never changes: the limits that bound every count the hub keeps (see
//! "Memory" in the hub's module doc), the retention and idle timeout, and the injectable parts (the
//! [`Clock`], the [`Ids`], the [`Storage`]). The defaults are what the service runs with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::clock::{Clock, Ids, RandomIds, SystemClock};
use super::storage::{MemoryStorage, Storage};

/// Limits that bound what the hub holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest message, as JSON (1 MiB).
    pub message_bytes: u64,
    /// Most messages in one stream, lifecycle events included (100,000). The places of the events that will
    /// close what is open (`stream_end` from the start) are kept for them. At least 2.
    pub messages_per_stream: usize,
    /// Most bytes of messages in one stream, with the room kept for the events that will close what is open
    /// (64 MiB). At least what a stream's first event and the room for its last take, about 1 KiB.
    pub stream_bytes: u64,
    /// Most streams, open or retained (100,000).
    pub streams: usize,
    /// Most bytes of messages in all streams, with every stream's rooms, outcome and renditions (1 GiB).
    pub hub_bytes: u64,
    /// Most streams one client may hold at once, open or ended until evicted (a tenth of `streams`: 10,000),
    /// so that no one client can fill the hub; past it, the client's own oldest ended stream is evicted
    /// early, and a client whose held streams are all open is refused. Streams made without a client
    /// ([`Hub::create`](super::Hub::create)) are not counted.
    pub streams_per_client: usize,
    /// Most streams one client may create in a minute (0: no limit, the default).
    pub streams_per_client_per_minute: u32,
    /// Clients with a budget of their own instead of the two limits above (the service's API keys, by name).
    pub client_budgets: HashMap<String, Budget>,
}

/// One client's budget of streams: held at once (open or ended until evicted), and created in a minute (0: no
/// limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Most streams held at once, open or ended until evicted.
    pub streams: usize,
    /// Most streams created in a minute (0: no limit).
    pub streams_per_minute: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            message_bytes: 1 << 20,
            messages_per_stream: 100_000,
            stream_bytes: 64 << 20,
            streams: 100_000,
            hub_bytes: 1 << 30,
            streams_per_client: 10_000,
            streams_per_client_per_minute: 0,
            client_budgets: HashMap::new(),
        }
    }
}

/// How a hub behaves.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// What it may hold.
    pub limits: Limits,
    /// The most bytes handed to a subscriber in one batch, unless one frame is larger (256 KiB).
    pub batch_bytes: u64,
    /// How long an ended stream stays readable (10 minutes), by `clock`.
    pub retention: Duration,
    /// How long an open stream may go without an append before it is ended with the error `idle_timeout`
    /// (10 minutes; zero: never), by `clock`. Ends happen in [`Hub::sweep`](super::Hub::sweep).
    pub idle_timeout: Duration,
    /// Where timestamps come from.
    pub clock: Arc<dyn Clock>,
    /// Where stream ids and epochs come from.
    pub ids: Arc<dyn Ids>,
    /// Where the streams' logs live (in memory by default).
    pub storage: Arc<dyn Storage>,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            limits: Limits::default(),
            batch_bytes: 256 << 10,
            retention: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(600),
            clock: Arc::new(SystemClock),
            ids: Arc::new(RandomIds),
            storage: Arc::new(MemoryStorage),
        }
    }
}
