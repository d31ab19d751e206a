//! [`RedisConnection`]: this node's multiplexed connection to Redis, on which a command refused because
//! the connection was down is sent once more.
//!
//! redis-rs's connection manager makes a new connection only when a command finds the old one gone, and it
//! hands that command the error. So after Redis was away and came back, the first command on a node that had
//! nothing to do meanwhile failed although Redis was there again, and a reader asking that node for a stream
//! got a 503 for it. A command the connection refused was never sent, so sending it again is always safe:
//! the second attempt waits for the connection the first one started, and it is refused as quickly as the
//! first while Redis really is away. A command that failed after it was sent (the connection dropped under
//! it) is not sent again here; its caller decides, as the writer does (`writer.rs`).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// See the module doc; cheap to clone (the clones share one connection).
#[derive(Clone, Debug)]
pub(crate) struct RedisConnection(ConnectionManager);

impl RedisConnection {
    pub(crate) fn new(manager: ConnectionManager) -> RedisConnection {
        RedisConnection(manager)
    }

    /// Subscribes to `channel` (on a connection made with a push sender), waiting for Redis at most
    /// [`SUBSCRIBE_WITHIN`].
    pub(crate) async fn subscribe(&self, channel: String) -> RedisResult<()> {
        within_subscribe_time(again_if_refused(|| {
            let (mut connection, channel) = (self.0.clone(), channel.clone());
            async move { connection.subscribe(channel).await }
        }))
        .await
    }

    /// Unsubscribes from `channel`, waiting for Redis at most [`SUBSCRIBE_WITHIN`].
    pub(crate) async fn unsubscribe(&self, channel: String) -> RedisResult<()> {
        within_subscribe_time(again_if_refused(|| {
            let (mut connection, channel) = (self.0.clone(), channel.clone());
            async move { connection.unsubscribe(channel).await }
        }))
        .await
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(again_if_refused(move || {
            let mut connection = self.0.clone();
            async move { connection.req_packed_command(cmd).await }
        }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(again_if_refused(move || {
            let mut connection = self.0.clone();
            async move { connection.req_packed_commands(pipeline, offset, count).await }
        }))
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// How long a subscribe or an unsubscribe waits for Redis: the connection manager's response timeout does not
/// bound them while the connection is being made again (Redis away), and a follower waits on them under the
/// lock that takes streams in.
const SUBSCRIBE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

async fn within_subscribe_time(call: impl Future<Output = RedisResult<()>>) -> RedisResult<()> {
    tokio::time::timeout(SUBSCRIBE_WITHIN, call)
        .await
        .unwrap_or_else(|_| Err(redis::RedisError::from((redis::ErrorKind::Io, "Redis did not answer a subscription"))))
}

/// `call`, and once more when the connection refused it (see the module doc). Each call takes its own clone
/// of the connection, which shares the one underneath.
async fn again_if_refused<T, Call: Future<Output = RedisResult<T>>>(mut call: impl FnMut() -> Call) -> RedisResult<T> {
    match call().await {
        Err(error) if error.is_connection_refusal() => call().await,
        result => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> redis::RedisError {
        std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into()
    }

    #[tokio::test]
    async fn a_refused_call_is_made_once_more_and_its_second_answer_kept() {
        let mut calls = 0;
        let answer = again_if_refused(|| {
            calls += 1;
            let answer = if calls == 1 { Err(refused()) } else { Ok(calls) };
            async move { answer }
        })
        .await;
        assert_eq!(answer.ok(), Some(2));

        let mut calls = 0;
        let answer: RedisResult<()> = again_if_refused(|| {
            calls += 1;
            async { Err(refused()) }
        })
        .await;
        assert!(answer.is_err_and(|e| e.is_connection_refusal()));
        assert_eq!(calls, 2, "tried twice, not more");
    }

    #[tokio::test]
    async fn a_call_that_may_have_been_sent_is_not_made_again() {
        let mut calls = 0;
        let answer: RedisResult<()> = again_if_refused(|| {
            calls += 1;
            async { Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into()) }
        })
        .await;
        assert!(answer.is_err());
        assert_eq!(calls, 1);
    }
}
