//! A node's lease: the key `agentmux:node:<node>`, holding its URL, set for [`Lease::lasts`] (`--redis-lease`,
//! five seconds by default) and renewed five times as often for as long as the node runs. A node whose lease
//! has lapsed is dead (a node that restarts is a new node, with a new id); a node that follows one of its
//! open streams takes the stream over and ends it with the error `interrupted` (`follow.rs`), and the claim
//! fences the dead node, should it only have been cut off: its later appends are refused.
//!
//! The lease bounds how long readers wait to learn that a writer died: a few seconds, against the renewals
//! a busy Redis or a paused process could delay (five renewals have to fail in a row). It bounds as well
//! how long a follower goes on without an answer from Redis before it tells its readers (`follow.rs`).
//!
//! A lapsed lease says the writer died only if the writer could have renewed it: after Redis was away (a
//! restart, a network cut) every lease has lapsed, live writers' included. So a node judges another's
//! lease only once its own renewals have succeeded without a break for a lease and a renewal
//! ([`Lease::judge_after`]): by then every live node that reaches Redis has renewed too ([`Steady`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::connection::RedisConnection;
use redis::AsyncCommands;

use super::keys;

/// How long a lease lasts, and what follows from it; the same on every node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    /// How long a lease lasts unless renewed.
    pub(crate) lasts: Duration,
}

impl Lease {
    /// How often it is renewed: five times a lease, at most once a second.
    pub(crate) fn renew_every(self) -> Duration {
        (self.lasts / 5).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }

    /// How long this node's own renewals must have succeeded in a row before it judges another node's lease.
    pub(crate) fn judge_after(self) -> Duration {
        self.lasts + self.renew_every()
    }
}

/// Since when this node's renewals have succeeded without a break (`None` while they fail).
#[derive(Debug)]
pub(crate) struct Steady {
    since: Mutex<Option<Instant>>,
    judge_after: Duration,
}

impl Steady {
    /// Renewals of `lease` that have gone through from now on (a node starts once its first renewal did).
    pub(crate) fn from_now(lease: Lease) -> Steady {
        Steady { since: Mutex::new(Some(Instant::now())), judge_after: lease.judge_after() }
    }

    fn record(&self, renewed: bool) {
        let mut since = crate::sync::lock(&self.since);
        match (renewed, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }

    /// True while the last renewal succeeded.
    pub(crate) fn reaches_redis(&self) -> bool {
        crate::sync::lock(&self.since).is_some()
    }

    /// True once renewals have succeeded in a row for [`Lease::judge_after`].
    pub(crate) fn may_judge(&self) -> bool {
        crate::sync::lock(&self.since).is_some_and(|since| since.elapsed() >= self.judge_after)
    }
}

/// Takes or renews `node`'s lease.
pub(crate) async fn renew(
    connection: &mut RedisConnection,
    lease: Lease,
    node: &str,
    url: &str,
) -> redis::RedisResult<()> {
    connection.pset_ex(keys::node(node), url, lease.lasts.as_millis().clamp(1, u128::from(u64::MAX)) as u64).await
}

/// Renews `node`'s lease every [`Lease::renew_every`] for as long as the runtime runs, keeping `steady` up to date; and
/// pings the notices connection as often, so that it reconnects (and subscribes again) within a renewal of
/// Redis coming back, however long Redis was away: a connection manager whose reconnect attempts ran out
/// tries again only when next used, and the notices connection is otherwise used only to subscribe.
pub(crate) async fn keep(
    [mut connection, mut notices]: [RedisConnection; 2],
    lease: Lease,
    node: Arc<str>,
    url: Arc<str>,
    steady: Arc<Steady>,
) {
    let renew_every = lease.renew_every();
    let mut every = tokio::time::interval(renew_every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        // A renewal that has not gone through within a renewal period has failed (Redis away can mean a
        // connection that hangs rather than one refused).
        let renewed = match tokio::time::timeout(renew_every, renew(&mut connection, lease, &node, &url)).await {
            Ok(renewed) => renewed,
            Err(_) => Err(redis::RedisError::from((redis::ErrorKind::Io, "no answer within a renewal period"))),
        };
        match &renewed {
            Err(error) if steady.reaches_redis() => {
                tracing::error!(%error, "renewing this node's lease in Redis failed: Redis is unreachable")
            }
            Err(error) => tracing::debug!(%error, "renewing this node's lease in Redis failed again"),
            Ok(()) if !steady.reaches_redis() => tracing::warn!("Redis is reachable again: this node's lease renewed"),
            Ok(()) => {}
        }
        steady.record(renewed.is_ok());
        let ping = redis::cmd("PING");
        if let Err(error) =
            tokio::time::timeout(renew_every, ping.query_async::<()>(&mut notices)).await.unwrap_or(Ok(()))
        {
            tracing::debug!(%error, "pinging the notices connection");
        }
    }
}

/// True while `node`'s lease holds.
pub(crate) async fn alive(connection: &mut RedisConnection, node: &str) -> redis::RedisResult<bool> {
    connection.exists(keys::node(node)).await
}
