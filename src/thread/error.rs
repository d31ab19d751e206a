//! [`ThreadError`]: why a thread operation failed, whatever the storage; and [`check_id`], the rule a thread
//! id a client picks must follow. Every file of `thread/` answers with these, and `http/` maps them to status
//! codes and error envelopes.

use crate::agent::StartError;
use crate::conversation::ConversationError;

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
    /// The service keeps [`ThreadConfig::max_threads`] threads already.
    #[error("the service keeps {limit} threads already, its limit (--max-threads); try again after idle ones expire")]
    Full {
        /// The limit reached: how many threads.
        limit: u64,
    },
    /// The threads the service keeps hold [`ThreadConfig::total_bytes`] bytes of messages in all already.
    #[error(
        "the threads the service keeps hold {limit} bytes of messages in all already, their limit; try again \
         after idle ones expire"
    )]
    BytesFull {
        /// The limit reached: bytes of messages in all threads.
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
