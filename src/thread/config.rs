//! [`ThreadConfig`]: the limits the thread registry keeps threads within (its TTL, how many, how large), set
//! once when the service starts.

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
            thread_bytes: 16 << 20,
            total_bytes: 1 << 30,
        }
    }
}
