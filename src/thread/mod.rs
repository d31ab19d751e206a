//! Server-side threads (`docs/design.md`, "Threads"): conversations the service keeps, with their audit log (there, "Audit and replay")
//! and replay against another model.
//!
//! - [`Threads`] (`store.rs`): the threads by id, their limits, and eviction after a TTL without use.
//! - `run.rs`: a turn on a thread (check the input, prepend the history, start the agent, record the result
//!   when the run ends; for a client that resends its whole history, start from it or rewind to it) and a replay (fork the history up to an entry, run it on another model).
//! - [`AuditEntry`] and [`Decision`] (`audit.rs`): what a thread keeps. The history the next run sees is
//!   the messages of its history entries, so the two never disagree.
//! - `record.rs`: what a finished run adds: its text, tool calls and tool results as chat messages.
//! - `shared.rs`: threads every node of a cluster shares through Redis: each use reads the thread again,
//!   each change is committed only onto what was read.
//!
//! Two runs on one thread at once: the second is refused with [`ThreadError::Busy`] (HTTP 409
//! `thread_busy`), naming the running stream, since its answer would depend on a result nobody has seen yet.
//! A turn that arrives after the run ended but before its result is recorded (the client read `[DONE]` and
//! asked again at once) waits the moment it takes instead.

mod audit;
mod record;
mod run;
mod shared;
mod store;

use std::time::Duration;

pub use audit::{AuditEntry, Decision};
pub use run::{Replay, Turn};
pub use store::{Threads, Transcript};

use crate::agent::StartError;
use crate::conversation::ConversationError;

/// The limits threads keep.
#[derive(Debug, Clone)]
pub struct ThreadConfig {
    /// A thread without a turn for this long (reading it does not count) is evicted, unless a run is going
    /// on (1 hour). Zero keeps threads forever.
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

/// Why a thread operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadError {
    /// No thread has that id.
    #[error("no thread {0:?}")]
    NotFound(String),
    /// A thread with that id exists already.
    #[error("the thread {0:?} exists already")]
    Exists(String),
    /// A thread id that is empty, too long, or has characters other than letters, digits, `_`, `-`, `.`, `:`.
    #[error("a thread id is 1 to 256 letters, digits, '_', '-', '.' or ':'")]
    InvalidId,
    /// A run of the thread is still going.
    #[error("the thread {thread:?} is running {stream:?}: wait for it to end (or cancel it), then send again")]
    Busy {
        /// The thread.
        thread: String,
        /// The running stream.
        stream: String,
    },
    /// The input breaks a rule of the conversation.
    #[error(transparent)]
    Invalid(#[from] ConversationError),
    /// The thread would grow past [`ThreadConfig::thread_bytes`].
    #[error("the thread would hold {size} bytes of messages, over its limit of {limit}")]
    TooLarge {
        /// What it would hold.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Every thread the service keeps is taken ([`ThreadConfig::max_threads`] or
    /// [`ThreadConfig::total_bytes`]).
    #[error("the service keeps {limit} threads (or their bytes) already; try again after idle ones expire")]
    Full {
        /// The limit reached.
        limit: u64,
    },
    /// `upto` names no entry of the thread, or nothing comes before it.
    #[error("{0}")]
    Upto(String),
    /// The agent could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// Redis, where the threads of several nodes are kept, did not answer (or answered nonsense).
    #[error("the thread could not be read from or written to Redis: {0}")]
    Unavailable(String),
}

/// Checks a thread id a client picked.
pub(crate) fn check_id(id: &str) -> Result<(), ThreadError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if id.is_empty() || id.len() > crate::output::NAME_BYTES || !id.chars().all(allowed) {
        return Err(ThreadError::InvalidId);
    }
    Ok(())
}
