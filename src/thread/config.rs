//! [`ThreadConfig`]: the limits the thread registry keeps threads within (its TTL, how many, how large), set
//! once when the service starts.

use std::collections::HashMap;
use std::time::Duration;

/// The limits threads keep.
#[derive(Debug, Clone)]
pub struct ThreadConfig {
    /// A thread without a turn for this long (reading it does not count), by the hub's clock
    /// ([`crate::hub::HubConfig::clock`]), is evicted, unless a run is going on (1 hour). Zero keeps threads
    /// forever.
    pub ttl: Duration,
    /// The most threads kept at once (100,000).
    pub max_threads: usize,
    /// The most threads one client (the service's API key, or without keys the peer's address: the client
    /// a stream counts against, [`crate::hub::Hub::create_for`]) may keep at once (a tenth of
    /// `max_threads`: 10,000), so that no one client can take every thread. Threads made without a client
    /// are not counted.
    pub threads_per_client: usize,
    /// Clients with a budget of their own instead of `threads_per_client` (the service's API keys, as
    /// `key:<name>`).
    pub client_budgets: HashMap<String, usize>,
    /// The most bytes of messages one thread keeps (16 MiB): input past it is refused.
    pub thread_bytes: u64,
    /// The most bytes of messages all threads keep (1 GiB).
    pub total_bytes: u64,
}

impl Default for ThreadConfig {
    fn default() -> Self {
        ThreadConfig {
            ttl: Duration::from_secs(3600),
            max_threads: 100_000,
            threads_per_client: 10_000,
            client_budgets: HashMap::new(),
            thread_bytes: 16 << 20,
            total_bytes: 1 << 30,
        }
    }
}
