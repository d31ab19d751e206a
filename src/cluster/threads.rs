//! Threads and their audit log in Redis ([`SharedThreads`]), so a conversation goes on whichever node its
//! next turn reaches.
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
use std::time::Duration;

use super::connection::RedisConnection;
use redis::Script;

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

/// A thread as Redis holds it.
#[derive(Debug, Clone)]
pub(crate) struct KeptThread {
    pub(crate) epoch: String,
    pub(crate) owner: Option<String>,
    pub(crate) created_ms: u64,
    pub(crate) updated_ms: u64,
    /// The calls it waits on, as JSON.
    pub(crate) pending: String,
    pub(crate) running: Option<KeptRun>,
    /// How many entries Redis holds.
    pub(crate) len: usize,
    /// The entries from [`KeptThread::from`] on, as JSON.
    pub(crate) entries: Vec<String>,
    /// The position of the first of `entries`: where the reader said it was, or 0 for a thread it did not
    /// know (another epoch).
    pub(crate) from: usize,
}

/// The run going on in a thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptRun {
    pub(crate) stream: String,
    pub(crate) model: String,
    pub(crate) started_ms: u64,
}

/// A change to a thread read at `epoch` with `len` entries and `running`.
#[derive(Debug, Clone)]
pub(crate) struct ThreadCommit {
    pub(crate) id: String,
    pub(crate) epoch: String,
    pub(crate) len: usize,
    pub(crate) running: Option<String>,
    /// The run from now on.
    pub(crate) run: Option<KeptRun>,
    pub(crate) pending: String,
    pub(crate) updated_ms: u64,
    /// The entries to append, as JSON.
    pub(crate) entries: Vec<String>,
}

/// The threads of every node, in Redis. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct SharedThreads {
    /// For the streams of the runs.
    cluster: super::Cluster,
    connection: RedisConnection,
    /// How long a thread's keys live without a change (zero: forever).
    ttl: Duration,
}

impl SharedThreads {
    pub(crate) fn new(cluster: super::Cluster, connection: RedisConnection, ttl: Duration) -> SharedThreads {
        SharedThreads { cluster, connection, ttl }
    }

    /// The stream of a run, wherever it was written (`None`: Redis no longer has it).
    pub(crate) async fn stream(
        &self,
        hub: &crate::hub::Hub,
        id: &str,
    ) -> redis::RedisResult<Option<std::sync::Arc<crate::hub::Stream>>> {
        self.cluster.follow(hub, id).await
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// Thread `id` as Redis holds it, its entries from position `from` on when it is still at `epoch` (all of
    /// them otherwise); `None` when Redis has no such thread.
    pub(crate) async fn read(&self, id: &str, known: Option<(&str, usize)>) -> redis::RedisResult<Option<KeptThread>> {
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
            let running = fields.get("running").map(|stream| KeptRun {
                stream: stream.clone(),
                model: fields.get("run_model").cloned().unwrap_or_default(),
                started_ms: number("run_started_ms"),
            });
            return Ok(Some(KeptThread {
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
    pub(crate) async fn create(
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
    pub(crate) async fn commit(&self, commit: &ThreadCommit) -> redis::RedisResult<bool> {
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
    pub(crate) async fn delete(&self, id: &str, epoch: &str) -> redis::RedisResult<()> {
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
    pub(crate) async fn keep(&self, id: &str) -> redis::RedisResult<()> {
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
    pub(crate) async fn stream_ending(&self, id: &str) -> redis::RedisResult<bool> {
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

    /// How long a thread lives without a change.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }
}
