//! Following a stream written on another node: its history read from Redis into a log in memory here, then
//! its new entries as the owner's notices say they are there.
//!
//! The follower subscribes to the stream's notice channel before it reads the history, so no append falls
//! between the two; after that, each notice (and, whatever the notices do, a look every
//! [`LOOK_EVERY`], so a lost notice or a reconnect costs at most that) reads the entries after the last one
//! it has, in order, and appends them to the log, which wakes this node's readers. Entries come only from
//! Redis's log, in its order, each once: a follower's log is always a prefix of the owner's. The end comes
//! from the stream's `meta` hash once the log has every entry before it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use tokio::sync::Notify;

use super::keys;
use crate::hub::{Entry, Log, MemoryLog, Stream, StreamInfo};
use crate::output::{Outcome, OutputMessage};

/// How often a follower looks for new entries when no notice came.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Entries read from Redis in one call.
const PAGE: usize = 1000;

/// What Redis says about a stream.
#[derive(Debug)]
pub(crate) struct Meta {
    pub(crate) info: StreamInfo,
    /// The outcome, once it has ended.
    pub(crate) outcome: Option<Outcome>,
}

/// Reads a stream's `meta` hash: `None` when Redis has no such stream.
pub(crate) async fn meta(connection: &mut ConnectionManager, id: &str) -> redis::RedisResult<Option<Meta>> {
    let fields: HashMap<String, String> = connection.hgetall(keys::meta(id)).await?;
    let (Some(epoch), Some(model)) = (fields.get("epoch"), fields.get("model")) else { return Ok(None) };
    let created_ms = fields.get("created_ms").and_then(|v| v.parse().ok()).unwrap_or_default();
    let info = StreamInfo { id: id.to_owned(), epoch: epoch.clone(), created_ms, model: model.clone() };
    let outcome = fields.get("outcome").and_then(|o| serde_json::from_str(o).ok());
    Ok(Some(Meta { info, outcome }))
}

/// Appends to `log` every entry Redis has after its last, and the end once Redis has it and every entry
/// before it. True once the log has the end.
pub(crate) async fn catch_up(connection: &mut ConnectionManager, id: &str, log: &dyn Log) -> redis::RedisResult<bool> {
    if log.is_ended() {
        return Ok(true);
    }
    // The outcome is read before the entries: an outcome seen here has every entry before it in Redis already.
    let outcome: Option<String> = connection.hget(keys::meta(id), "outcome").await?;
    loop {
        let after = log.last_sequence();
        let page: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(keys::log(id))
            .arg(format!("({after}-0"))
            .arg("+")
            .arg("COUNT")
            .arg(PAGE)
            .query_async(connection)
            .await?;
        let mut entries = Vec::with_capacity(page.len());
        for (entry_id, fields) in &page {
            let sequence = entry_id.split('-').next().and_then(|s| s.parse::<u64>().ok());
            let Some(json) = fields.get("m") else { continue };
            let message: OutputMessage = match serde_json::from_str(json) {
                Ok(message) => message,
                Err(error) => {
                    tracing::error!(stream = id, entry = entry_id, %error, "an entry in Redis is not a message");
                    return Err(redis::RedisError::from((redis::ErrorKind::Parse, "an entry is not a message")));
                }
            };
            // Only the next sequence: the log never has a gap.
            if sequence != Some(after + entries.len() as u64 + 1) {
                break;
            }
            entries.push(Entry::Message { message: Arc::new(message), bytes: json.len() as u64 });
        }
        let got = entries.len();
        if got > 0 {
            log.append(entries);
        }
        if got < PAGE {
            break;
        }
    }
    let Some(outcome) = outcome.and_then(|o| serde_json::from_str::<Outcome>(&o).ok()) else { return Ok(false) };
    log.append(vec![Entry::End(Arc::new(outcome))]);
    Ok(true)
}

/// The log of a followed stream as first read: its history up to now, and the end if it has ended.
pub(crate) async fn history(connection: &mut ConnectionManager, id: &str) -> redis::RedisResult<MemoryLog> {
    let log = MemoryLog::default();
    catch_up(connection, id, &log).await?;
    Ok(log)
}

/// Keeps `stream`'s log caught up until it has the end, or this node no longer holds the stream.
pub(crate) async fn keep_up(mut connection: ConnectionManager, stream: Weak<Stream>, notices: Arc<Notify>) {
    loop {
        let Some(held) = stream.upgrade() else { return };
        match catch_up(&mut connection, held.id(), held.log()).await {
            Ok(true) => {
                held.follower_ended();
                return;
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(stream = held.id(), %error, "following a stream: reading Redis failed"),
        }
        drop(held);
        let _ = tokio::time::timeout(LOOK_EVERY, notices.notified()).await;
    }
}
