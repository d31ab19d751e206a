//! [`Storage`]: where the streams' logs live. In memory only ([`MemoryStorage`], what a library hub uses by
//! default), or in the embedded store (`crate::store::Store`, what the service uses unless told
//! `--ephemeral`), which keeps them across a restart.
//!
//! The hub asks its storage for the log of each new stream and tells it when a stream is evicted; streams a
//! store kept from before a restart come back through [`crate::hub::Hub::restore`]. Everything else (stamping,
//! limits, renditions) is the same whatever the storage: the seam is the [`Log`].

use super::log::{Log, MemoryLog};
use super::render::StreamInfo;

/// Where the streams' logs live.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// The log of a new stream; the hub appends its first entry (`stream_start`) to it at once, which a
    /// storage may count on to hand both over together.
    fn log(&self, info: &StreamInfo, client: Option<&str>) -> Box<dyn Log>;

    /// The stream was evicted (its retention passed): what is kept of it may go.
    fn evict(&self, id: &str);
}

/// Logs in memory only: a restart loses them.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStorage;

impl Storage for MemoryStorage {
    fn log(&self, _info: &StreamInfo, _client: Option<&str>) -> Box<dyn Log> {
        Box::new(MemoryLog::default())
    }

    fn evict(&self, _id: &str) {}
}
