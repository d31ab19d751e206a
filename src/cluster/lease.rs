//! A node's lease: the key `agentmux:node:<node>`, holding its URL, set for [`LEASE`] and renewed every
//! [`RENEW`] for as long as the node runs. A node whose lease has lapsed is dead (a node that restarts is a
//! new node, with a new id); a node that follows one of its open streams takes the stream over and ends it
//! with the error `interrupted` (`follow.rs`), and the claim fences the dead node, should it only have been
//! cut off: its later appends are refused.
//!
//! [`LEASE`] bounds how long readers wait to learn that a writer died: a few seconds, against the renewals
//! a busy Redis or a paused process could delay (five renewals have to fail in a row).

use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::ConnectionManager;

use super::keys;

/// How long a lease lasts unless renewed.
pub(crate) const LEASE: Duration = Duration::from_secs(5);

/// How often it is renewed.
pub(crate) const RENEW: Duration = Duration::from_secs(1);

/// Takes or renews `node`'s lease.
pub(crate) async fn renew(connection: &mut ConnectionManager, node: &str, url: &str) -> redis::RedisResult<()> {
    connection.pset_ex(keys::node(node), url, LEASE.as_millis() as u64).await
}

/// Renews `node`'s lease every [`RENEW`] for as long as the runtime runs.
pub(crate) async fn keep(mut connection: ConnectionManager, node: std::sync::Arc<str>, url: std::sync::Arc<str>) {
    let mut every = tokio::time::interval(RENEW);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(error) = renew(&mut connection, &node, &url).await {
            tracing::warn!(%error, "renewing this node's lease in Redis failed");
        }
    }
}

/// True while `node`'s lease holds.
pub(crate) async fn alive(connection: &mut ConnectionManager, node: &str) -> redis::RedisResult<bool> {
    connection.exists(keys::node(node)).await
}
