//! [`HubError`]: why the hub could not create a stream, and whether waiting helps.
//!
//! Its own file because both the hub ([`super::Hub::create_for`]) and what it shares with its streams
//! (a client's budget, the byte count a new stream's first events must fit) refuse with it.

use std::time::Duration;

use crate::output::ValidationError;

/// Why a stream could not be created.
///
/// Each says whether waiting helps: `retry_after` is when the hub expects room, and `None` when nothing the
/// hub holds will free room by itself. A place among the streams comes when an open stream reaches its idle
/// timeout (an ended one is evicted early for a new stream, so one that ends makes room at once); bytes come
/// back when the oldest ended stream is evicted, or a retention after the first open stream can time out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// The hub holds as many streams as it may.
    #[error("the service holds its limit of {limit} streams")]
    TooManyStreams {
        /// The limit.
        limit: usize,
        /// When room is expected.
        retry_after: Option<Duration>,
    },
    /// The hub holds as many bytes as it may.
    #[error("the service has reached its limit of {limit} bytes of messages")]
    HubFull {
        /// The limit.
        limit: u64,
        /// When room is expected.
        retry_after: Option<Duration>,
    },
    /// The client holds as many streams as one client may, every one of them open (an ended one would have
    /// made room): ending one makes room.
    #[error(
        "this client holds its limit of {limit} streams (open or ended, until evicted) and all are open; end \
         one to start another"
    )]
    ClientStreams {
        /// The limit.
        limit: usize,
        /// When room is expected: by the idle timeout, one of them ends by itself unless its producer keeps
        /// appending (none without an idle timeout).
        retry_after: Option<Duration>,
    },
    /// The client created as many streams in the last minute as one client may.
    #[error("this client created {limit} streams in the last minute, the most one client may")]
    ClientRate {
        /// The limit.
        limit: u32,
        /// When the minute is over.
        retry_after: Duration,
    },
    /// A stream's limits cannot hold even its first and last events: `messages_per_stream` under 2, or
    /// `stream_bytes` under what `stream_start` and the room for `stream_end` take (about 1 KiB). A
    /// configuration error.
    #[error(
        "a stream's limits ({messages} messages, {bytes} bytes) cannot hold its first and last events \
         (2 messages, {needed} bytes)"
    )]
    StreamLimitsTooSmall {
        /// [`Limits::messages_per_stream`](super::Limits::messages_per_stream).
        messages: usize,
        /// [`Limits::stream_bytes`](super::Limits::stream_bytes).
        bytes: u64,
        /// What the first and last events take.
        needed: u64,
    },
    /// The model name is over [`crate::output::NAME_BYTES`] (the error's field is `model`).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

impl HubError {
    /// When a retry may succeed; `None` when waiting alone will not help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            HubError::TooManyStreams { retry_after, .. }
            | HubError::HubFull { retry_after, .. }
            | HubError::ClientStreams { retry_after, .. } => *retry_after,
            HubError::ClientRate { retry_after, .. } => Some(*retry_after),
            HubError::StreamLimitsTooSmall { .. } | HubError::Invalid(_) => None,
        }
    }
}
