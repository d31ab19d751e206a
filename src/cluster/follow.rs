//! Following a stream written on another node: its history read from Redis into a log in memory here, then
//! its new entries as the owner's notices say they are there.
//!
//! The follower subscribes to the stream's notice channel before it reads the history, so no append falls
//! between the two; after that, each notice (and, whatever the notices do, a look every
//! [`LOOK_EVERY`], so a lost notice or a reconnect costs at most that) reads the entries after the last one
//! it has, in order, and appends them to the log, which wakes this node's readers. Entries come only from
//! Redis's log, in its order, each once: a follower's log is always a prefix of the owner's. The end comes
//! from the stream's `meta` hash once the log has every entry before it. Each look also asks whether the
//! stream's writer still holds its lease, and ends the stream `interrupted` when it does not (see the
//! module doc of `crate::cluster`).
//!
//! A follower that gets no answer from Redis for a lease (`--redis-lease`; each look waits at most that
//! long) can no longer tell whether the stream goes on, nor whether its writer lives: rather than leave its
//! readers waiting for what it cannot know, it lets go of the stream ([`Hub::lose`]). Each of its readers
//! gets its format's `lagged` notice naming where it is, and resumes from there (`Last-Event-ID`, `from`);
//! a request for the stream meanwhile is `503 cluster_unavailable`, as for any stream this node does not
//! hold while Redis is away; and once Redis answers, the stream is followed again from Redis, history first,
//! so readers catch up with whatever was written meanwhile, the end included.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::connection::RedisConnection;
use redis::AsyncCommands;
use tokio::sync::Notify;

use super::script::{self, Append};
use super::writer::Owner;
use super::{Inner, keys, lease};
use crate::hub::{Clock, Entry, Hub, Log, MemoryLog, Stream, StreamInfo, SystemClock};
use crate::output::{ErrorProps, Outcome, OutputMessage};

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
pub(crate) async fn meta(connection: &mut RedisConnection, id: &str) -> redis::RedisResult<Option<Meta>> {
    let fields: HashMap<String, String> = connection.hgetall(keys::meta(id)).await?;
    let (Some(epoch), Some(model)) = (fields.get("epoch"), fields.get("model")) else { return Ok(None) };
    let created_ms = fields.get("created_ms").and_then(|v| v.parse().ok()).unwrap_or_default();
    let info = StreamInfo { id: id.to_owned(), epoch: epoch.clone(), created_ms, model: model.clone() };
    let outcome = fields.get("outcome").and_then(|o| serde_json::from_str(o).ok());
    Ok(Some(Meta { info, outcome }))
}

/// Hands `append` every entry Redis has after `log`'s last, then the end once Redis has it and every entry
/// before it (`append` adds them to `log`). True once the log has the end.
///
/// The outcome is looked up when `look_for_end` says so (a look that no notice asked for), before the
/// entries, so an outcome seen has every entry before it in Redis already; and whenever the entries read
/// hold `stream_end`, which the writer puts in Redis in one step with the outcome. So a notice costs a
/// follower one read, not two.
pub(crate) async fn catch_up(
    connection: &mut RedisConnection,
    id: &str,
    log: &dyn Log,
    append: &(dyn Fn(Vec<Entry>) + Sync),
    look_for_end: bool,
) -> redis::RedisResult<bool> {
    if log.is_ended() {
        return Ok(true);
    }
    let mut outcome: Option<String> =
        if look_for_end { connection.hget(keys::meta(id), "outcome").await? } else { None };
    let mut saw_end = false;
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
            saw_end |= message.kind == "event" && message.prop_str("event") == Some("stream_end");
            entries.push(Entry::kept(message, json));
        }
        let got = entries.len();
        if got > 0 {
            append(entries);
        }
        if got < PAGE {
            break;
        }
    }
    if outcome.is_none() && saw_end {
        outcome = connection.hget(keys::meta(id), "outcome").await?;
    }
    let Some(outcome) = outcome.and_then(|o| serde_json::from_str::<Outcome>(&o).ok()) else { return Ok(false) };
    append(vec![Entry::End(Arc::new(outcome))]);
    Ok(true)
}

/// The log of a followed stream as first read: its history up to now, and the end if it has ended.
pub(crate) async fn history(connection: &mut RedisConnection, id: &str) -> redis::RedisResult<MemoryLog> {
    let log = MemoryLog::default();
    catch_up(connection, id, &log, &|entries| log.append(entries), true).await?;
    Ok(log)
}

/// Keeps `stream`'s log caught up until it has the end, ending it as this node when its writer's lease
/// lapses (see `lease.rs`); lets the stream go once nothing on this node has held it for `let_go_after`
/// (see [`Hub::let_go`]), or once Redis has not answered for a lease (see the module doc).
pub(crate) async fn keep_up(
    cluster: Arc<Inner>,
    hub: Hub,
    id: String,
    stream: Weak<Stream>,
    mut connection: RedisConnection,
    notices: Arc<Notify>,
) {
    // A stream that had ended when it was taken in has its end already.
    let mut ended = stream.upgrade().is_none_or(|held| held.log().is_ended());
    let mut unused_since = None;
    // What a notice does not tell is looked at once a `LOOK_EVERY`: whether the writer's lease holds, and
    // the outcome of a stream whose notice was lost.
    let mut looked_at = Instant::now();
    // The first look is a whole one: a stream whose writer died before anyone followed it ends at once.
    let mut noticed = false;
    // When Redis last answered this follower.
    let mut answered_at = Instant::now();
    let lease = cluster.lease.lasts;
    loop {
        let Some(held) = stream.upgrade() else { break };
        if !ended {
            let look = !noticed || looked_at.elapsed() >= LOOK_EVERY;
            let before = held.log().last_sequence();
            let looked = tokio::time::timeout(lease, one_look(&cluster, &mut connection, &held, look)).await;
            match &looked {
                Ok(Ok(true)) => {
                    held.follower_ended();
                    cluster.done_following(held.id(), &notices).await;
                    ended = true;
                }
                Ok(Ok(false)) if look => looked_at = Instant::now(),
                Ok(Ok(false)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(stream = held.id(), %error, "following a stream: reading Redis failed")
                }
                Err(_) => tracing::warn!(stream = held.id(), "following a stream: Redis did not answer within a lease"),
            }
            // A look cut short while entries still came (a long history on a slow Redis) was answered.
            if matches!(looked, Ok(Ok(_))) || held.log().last_sequence() > before {
                answered_at = Instant::now();
            } else if answered_at.elapsed() >= lease && hub.lose(&held) {
                tracing::warn!(
                    stream = held.id(),
                    "no answer from Redis for a lease: the followed stream is let go, its readers told `lagged`"
                );
                drop(held);
                // Its notices are stopped once Redis answers again: an unsubscribe sent while Redis is away
                // leaves the notices connection waiting on a confirmation that never comes.
                while !cluster.steady.reaches_redis() {
                    tokio::time::sleep(LOOK_EVERY).await;
                }
                cluster.done_following(&id, &notices).await;
                return;
            }
        }
        // Held by the hub and by `held` here alone: nothing on this node uses it.
        if Arc::strong_count(&held) <= 2 {
            let since = *unused_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= cluster.let_go_after && hub.let_go(&held) {
                tracing::debug!(stream = held.id(), "let go of a followed stream nothing here uses");
                if !ended {
                    cluster.done_following(held.id(), &notices).await;
                }
                return;
            }
        } else {
            unused_since = None;
        }
        drop(held);
        noticed = tokio::time::timeout(LOOK_EVERY, notices.notified()).await.is_ok();
    }
    // Gone from the hub some other way.
    if !ended {
        cluster.done_following(&id, &notices).await;
    }
}

/// One look at Redis for `held`: the entries after its log's last (and the end once there), and when `look`
/// asks for a whole look, whether its writer still lives. True once the log has the end.
async fn one_look(
    cluster: &Inner,
    connection: &mut RedisConnection,
    held: &Stream,
    look: bool,
) -> redis::RedisResult<bool> {
    let append = |entries| held.follow_append(entries);
    if catch_up(connection, held.id(), held.log(), &append, look).await? {
        return Ok(true);
    }
    if look && cluster.steady.may_judge() {
        end_if_writer_died(connection, held, &cluster.owner).await?;
    }
    Ok(false)
}

/// When the stream's writer has died (its lease lapsed), takes the stream over and ends it with the error
/// `interrupted` after what Redis holds, unless another node does first; the end comes back to every
/// follower as any entry does.
async fn end_if_writer_died(connection: &mut RedisConnection, stream: &Stream, me: &Owner) -> redis::RedisResult<()> {
    let writer: Option<String> = connection.hget(keys::meta(stream.id()), "owner").await?;
    let Some(writer) = writer else { return Ok(()) };
    if writer == *me.node || lease::alive(connection, &writer).await? {
        return Ok(());
    }
    let Some(last) = script::claim(connection, stream.id(), &writer, &me.node, &me.url).await? else { return Ok(()) };
    // Fenced now: nothing more comes. What the log here lacks of Redis's is read, so the end closes what
    // the whole log left open.
    catch_up(connection, stream.id(), stream.log(), &|entries| stream.follow_append(entries), false).await?;
    let log: Vec<Arc<OutputMessage>> = {
        let mut read = Vec::new();
        let _ = stream.log().read(0, usize::MAX, &mut read);
        read.into_iter()
            .filter_map(|entry| if let Entry::Message { message, .. } = entry { Some(message) } else { None })
            .collect()
    };
    if log.last().and_then(|entry| entry.sequence()).unwrap_or_default() != last {
        return Err(redis::RedisError::from((redis::ErrorKind::Client, "the log here is behind Redis's")));
    }
    let outcome = Outcome::failed(ErrorProps {
        message: "the node writing the stream stopped while it was open".into(),
        code: Some("interrupted".into()),
        details: None,
    });
    let now_ms = SystemClock.now_ms();
    let ending = crate::hub::ending(stream.info(), &log, last, &outcome, now_ms);
    let append = Append {
        first: last + 1,
        messages: ending.iter().map(crate::hub::json_of).collect(),
        outcome: Some((serde_json::to_string(&outcome).unwrap_or_default(), now_ms)),
        register: None,
    };
    let ttl_ms = me.ended_ttl.as_millis().min(u128::from(u64::MAX)) as u64;
    script::append(connection, &script::append_script(), &me.node, &me.url, stream.id(), ttl_ms, &append).await?;
    tracing::warn!(stream = stream.id(), writer, "the stream's writer stopped: ended it `interrupted`");
    Ok(())
}
