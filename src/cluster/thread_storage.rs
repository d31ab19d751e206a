//! Threads and their audit log in Redis ([`RedisThreads`], the threads' storage every node shares: a
//! [`ThreadStorage`] that is the record, `thread/replica.rs` keeping each node's copy), so a conversation goes
//! on whichever node its next turn reaches.
//!
//! Redis is the thread's record, not a copy of one node's: per thread a hash of its facts (`epoch`, a new
//! one each time the id is created; `owner`; `created_ms`, `updated_ms`; the tool calls it waits on,
//! `pending`; and while a run goes on, `running` with the run's model and start) and a list of its audit
//! entries, oldest first, as the JSON the audit export shows. Entries are only ever appended, so a node
//! that read a thread before reads only the entries after the ones it has.
//!
//! Every change is one script ([`COMMIT`]) that applies only if the thread is still what the node last
//! read: the same epoch, the same number of entries, the same run going on. Two turns that reach two nodes
//! at once cannot both start a run: the second commit finds the first's run and is refused, and its node
//! reads the thread again (and answers `thread_busy`). The same check makes a run's result recorded once
//! when more than one node waits for the run to end (any node that read the thread while the run went on
//! does, so the result is recorded even when the node that started the run dies): the first commit clears
//! `running`, the others find it cleared.
//!
//! The keys expire after the thread's TTL without a change; a run going on keeps them alive.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::Script;

use super::connection::RedisConnection;
use crate::hub::{Hub, Stream};
use crate::thread::{Change, Commit, Made, RecordedRun, RecordedThread, ThreadError, ThreadStorage};

/// How long this node keeps its copy of a thread nobody here has used (Redis keeps the thread).
const KEEP_COPY: Duration = Duration::from_secs(60);

/// A Redis error, for the client.
fn unavailable(error: redis::RedisError) -> ThreadError {
    ThreadError::Unavailable(error.to_string())
}

/// A thread's facts, owner and run (see the module doc).
fn meta(thread: &str) -> String {
    format!("agentmux:thread:{{{thread}}}:meta")
}

/// A thread's audit entries, oldest first.
fn audit(thread: &str) -> String {
    format!("agentmux:thread:{{{thread}}}:audit")
}

/// KEYS: meta, audit. ARGV: epoch, owner ('' for none), created_ms, ttl (ms; 0: none), then the entries.
/// Makes the thread unless one has the id; returns the owner of the one that has it then, or false.
const CREATE: &str = r"
local meta, audit = KEYS[1], KEYS[2]
if redis.call('EXISTS', meta) == 1 then
  return redis.call('HGET', meta, 'owner') or ''
end
redis.call('HSET', meta, 'epoch', ARGV[1], 'owner', ARGV[2], 'created_ms', ARGV[3], 'updated_ms', ARGV[3],
  'pending', '[]')
for i = 5, #ARGV do
  redis.call('RPUSH', audit, ARGV[i])
end
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  redis.call('PEXPIRE', meta, ttl)
  redis.call('PEXPIRE', audit, ttl)
end
return false
";

/// KEYS: meta, audit. ARGV: epoch, entries the node read, the run it read ('' for none), the run from now
/// on ('' for none), its model, its start (ms), pending, updated_ms, ttl (ms; 0: none), then the new
/// entries. Applies only to the thread the node read; returns 1 when it did, 0 when the thread changed.
const COMMIT: &str = r"
local meta, audit = KEYS[1], KEYS[2]
if redis.call('HGET', meta, 'epoch') ~= ARGV[1] then return 0 end
if redis.call('LLEN', audit) ~= tonumber(ARGV[2]) then return 0 end
if (redis.call('HGET', meta, 'running') or '') ~= ARGV[3] then return 0 end
if ARGV[4] == '' then
  redis.call('HDEL', meta, 'running', 'run_model', 'run_started_ms')
else
  redis.call('HSET', meta, 'running', ARGV[4], 'run_model', ARGV[5], 'run_started_ms', ARGV[6])
end
redis.call('HSET', meta, 'pending', ARGV[7], 'updated_ms', ARGV[8])
for i = 10, #ARGV do
  redis.call('RPUSH', audit, ARGV[i])
end
local ttl = tonumber(ARGV[9])
if ttl > 0 then
  redis.call('PEXPIRE', meta, ttl)
  redis.call('PEXPIRE', audit, ttl)
end
return 1
";

/// The threads of every node, in Redis. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct RedisThreads {
    /// For the streams of the runs.
    cluster: super::Cluster,
    connection: RedisConnection,
    /// How long a thread's keys live without a change (zero: forever).
    ttl: Duration,
}

impl RedisThreads {
    pub(crate) fn new(cluster: super::Cluster, connection: RedisConnection, ttl: Duration) -> RedisThreads {
        RedisThreads { cluster, connection, ttl }
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// Thread `id` as Redis holds it, its entries from position `from` on when it is still at `epoch` (all of
    /// them otherwise); `None` when Redis has no such thread.
    async fn read_thread(&self, id: &str, known: Option<(&str, usize)>) -> redis::RedisResult<Option<RecordedThread>> {
        let mut connection = self.connection.clone();
        let mut from = known.map_or(0, |(_, from)| from);
        loop {
            let (fields, len, entries): (HashMap<String, String>, usize, Vec<String>) = redis::pipe()
                .atomic()
                .hgetall(meta(id))
                .llen(audit(id))
                .lrange(audit(id), from as isize, -1)
                .query_async(&mut connection)
                .await?;
            let Some(epoch) = fields.get("epoch") else { return Ok(None) };
            if from > 0 && (known.is_none_or(|(e, _)| e != epoch) || len < from) {
                // Another thread under the same id since (deleted and made again): all of it.
                from = 0;
                continue;
            }
            let number = |name: &str| fields.get(name).and_then(|v| v.parse().ok()).unwrap_or_default();
            let running = fields.get("running").map(|stream| RecordedRun {
                stream: stream.clone(),
                model: fields.get("run_model").cloned().unwrap_or_default(),
                started_ms: number("run_started_ms"),
            });
            return Ok(Some(RecordedThread {
                epoch: epoch.clone(),
                owner: fields.get("owner").filter(|o| !o.is_empty()).cloned(),
                created_ms: number("created_ms"),
                updated_ms: number("updated_ms"),
                pending: fields.get("pending").cloned().unwrap_or_else(|| "[]".to_owned()),
                running,
                len,
                entries,
                from,
            }));
        }
    }

    /// Makes thread `id` with `entries` unless one has the id: `Ok(None)` when it was made, the owner of the
    /// existing one otherwise (`Some(None)`: it has none).
    async fn create_thread(
        &self,
        id: &str,
        epoch: &str,
        owner: Option<&str>,
        created_ms: u64,
        entries: &[String],
    ) -> redis::RedisResult<Option<Option<String>>> {
        let script = Script::new(CREATE);
        let mut invocation = script.key(meta(id));
        invocation.key(audit(id)).arg(epoch).arg(owner.unwrap_or("")).arg(created_ms).arg(self.ttl_ms());
        for entry in entries {
            invocation.arg(entry);
        }
        let existing: Option<String> = invocation.invoke_async(&mut self.connection.clone()).await?;
        Ok(existing.map(|owner| Some(owner).filter(|o| !o.is_empty())))
    }

    /// Applies `commit` if the thread is still as its node read it; false when it changed since.
    async fn commit_thread(&self, commit: &Commit) -> redis::RedisResult<bool> {
        let script = Script::new(COMMIT);
        let mut invocation = script.key(meta(&commit.id));
        invocation.key(audit(&commit.id)).arg(&commit.epoch).arg(commit.len);
        invocation.arg(commit.running.as_deref().unwrap_or(""));
        match &commit.run {
            Some(run) => invocation.arg(&run.stream).arg(&run.model).arg(run.started_ms),
            None => invocation.arg("").arg("").arg(0),
        };
        invocation.arg(&commit.pending).arg(commit.updated_ms).arg(self.ttl_ms());
        for entry in &commit.entries {
            invocation.arg(entry);
        }
        let applied: u8 = invocation.invoke_async(&mut self.connection.clone()).await?;
        Ok(applied == 1)
    }

    /// Deletes thread `id` (at `epoch`: a thread made again under the id since is left alone).
    async fn delete_thread(&self, id: &str, epoch: &str) -> redis::RedisResult<()> {
        const DELETE: &str = r"
if redis.call('HGET', KEYS[1], 'epoch') == ARGV[1] then redis.call('DEL', KEYS[1], KEYS[2]) end
return 0
";
        let _: u8 = Script::new(DELETE)
            .key(meta(id))
            .key(audit(id))
            .arg(epoch)
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(())
    }

    /// Keeps thread `id`'s keys for another TTL (while a run goes on).
    async fn keep_thread(&self, id: &str) -> redis::RedisResult<()> {
        let ttl = self.ttl_ms();
        if ttl == 0 {
            return Ok(());
        }
        let mut connection = self.connection.clone();
        redis::pipe().pexpire(meta(id), ttl as i64).pexpire(audit(id), ttl as i64).query_async(&mut connection).await
    }

    /// Whether stream `id` has ended, or is about to: Redis has its end, or its writer died (its lease
    /// lapsed, as this node may judge), so a follower here ends it at its next look (at once, for a stream
    /// just taken in).
    async fn stream_ending_now(&self, id: &str) -> redis::RedisResult<bool> {
        use redis::AsyncCommands;
        let mut connection = self.connection.clone();
        let (outcome, writer): (bool, Option<String>) = redis::pipe()
            .hexists(super::keys::meta(id), "outcome")
            .hget(super::keys::meta(id), "owner")
            .query_async(&mut connection)
            .await?;
        if outcome {
            return Ok(true);
        }
        let Some(writer) = writer else { return Ok(false) };
        if *writer == *self.cluster.inner.owner.node || !self.cluster.inner.steady.may_judge() {
            return Ok(false);
        }
        Ok(!connection.exists::<_, bool>(super::keys::node(&writer)).await?)
    }
}

impl ThreadStorage for RedisThreads {
    /// The commit of what changed in the thread since it was read or last committed, if anything did.
    fn changed(&self, change: &Change<'_>) -> Option<Commit> {
        let new = change.new_entries();
        if new.is_empty() && change.run.as_ref().map(|r| r.stream.as_str()) == change.running {
            return None;
        }
        Some(Commit {
            id: change.id.to_owned(),
            epoch: change.epoch.to_owned(),
            len: change.kept,
            running: change.running.map(str::to_owned),
            run: change.run.clone(),
            pending: serde_json::to_string(change.pending).unwrap_or_else(|_| "[]".into()),
            updated_ms: change.updated_ms,
            entries: new.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect(),
        })
    }

    /// Redis expires threads itself (after their TTL without a change).
    fn forget(&self, _id: &str) {}

    fn kept_for(&self, ttl: Duration) -> Duration {
        if ttl.is_zero() { KEEP_COPY } else { ttl.min(KEEP_COPY) }
    }

    fn is_record(&self) -> bool {
        true
    }

    fn read<'a>(
        &'a self,
        id: &'a str,
        known: Option<(&'a str, usize)>,
    ) -> BoxFuture<'a, Result<Option<RecordedThread>, ThreadError>> {
        Box::pin(async move { self.read_thread(id, known).await.map_err(unavailable) })
    }

    fn create<'a>(&'a self, made: Made<'a>) -> BoxFuture<'a, Result<bool, ThreadError>> {
        Box::pin(async move {
            let json: Vec<String> = made.entries.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect();
            let existing = self
                .create_thread(made.id, made.epoch, made.owner, made.created_ms, &json)
                .await
                .map_err(unavailable)?;
            Ok(existing.is_some())
        })
    }

    fn commit<'a>(&'a self, commit: &'a Commit) -> BoxFuture<'a, Result<bool, ThreadError>> {
        Box::pin(async move { self.commit_thread(commit).await.map_err(unavailable) })
    }

    fn delete<'a>(&'a self, id: &'a str, epoch: &'a str) -> BoxFuture<'a, Result<(), ThreadError>> {
        Box::pin(async move { self.delete_thread(id, epoch).await.map_err(unavailable) })
    }

    fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    fn renew<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ThreadError>> {
        Box::pin(async move { self.keep_thread(id).await.map_err(unavailable) })
    }

    /// The stream of a run, wherever it was written (`None`: Redis no longer has it).
    fn stream<'a>(&'a self, hub: &'a Hub, id: &'a str) -> BoxFuture<'a, Result<Option<Arc<Stream>>, ThreadError>> {
        Box::pin(async move { self.cluster.follow(hub, id).await.map_err(unavailable) })
    }

    fn stream_ending<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, ThreadError>> {
        Box::pin(async move { self.stream_ending_now(id).await.map_err(unavailable) })
    }
}
