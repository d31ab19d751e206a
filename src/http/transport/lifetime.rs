//! [`Lifetime`]: where the service is in its shutdown, as every connection and WebSocket watches it. The
//! phases themselves are `server.rs`'s; this is what they are told through, so that a connection need not
//! know the server to watch it.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Where the service is in its shutdown; every connection and WebSocket watches it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lifetime {
    /// Fires when shutdown begins: no new work from then on.
    pub(crate) draining: CancellationToken,
    /// Fires when every stream has ended: connections close.
    pub(crate) closing: CancellationToken,
    /// Fires when the drain is over: what is left is dropped.
    pub(crate) gone: CancellationToken,
    /// WebSocket connections, which outlive their HTTP connection's task.
    pub(crate) sockets: TaskTracker,
}
