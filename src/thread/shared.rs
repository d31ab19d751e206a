//! Threads shared through Redis: reading a thread into this node's copy, and committing what changed.
//!
//! Redis holds the record (`crate::cluster::SharedThreads`); the map holds this node's copy of the threads
//! its clients use. Each use reads the thread again first, under the thread's turn lock: only the entries
//! after those the copy has, since entries are only appended. A change (a turn's input and its run, a
//! refused input, a run's result) is made to the copy as on one node, then committed with the check that
//! Redis still holds what the copy was read from; when another node changed the thread first, the copy is
//! read again and the change made again on it (a turn whose run had started cancels that run: it was never
//! handed out). A run going on in a thread is followed wherever it was started, and recorded when it ends
//! by whichever node that knows of it commits first, so a run's result is recorded even when its node
//! dies.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::sync::OwnedMutexGuard;

use super::ThreadError;
use super::audit::{AuditEntry, Decision};
use super::store::{Run, State, Thread, Threads, unix_ms};
use crate::cluster::{KeptRun, KeptThread, SharedThreads, ThreadCommit};

/// How long this node keeps its copy of a thread nobody here has used (Redis keeps the thread).
pub(crate) const KEEP_COPY: Duration = Duration::from_secs(60);

/// A Redis error, for the client.
pub(super) fn unavailable(error: redis::RedisError) -> ThreadError {
    ThreadError::Unavailable(error.to_string())
}

/// The commit of what changed in `thread` since it was read or last committed, if anything did.
pub(super) fn commit_of(thread: &Thread, state: &State) -> Option<ThreadCommit> {
    let run = state.run.as_ref().map(|run| KeptRun {
        stream: run.stream.id().to_owned(),
        model: run.model.clone(),
        started_ms: unix_ms(SystemTime::now()).saturating_sub(run.started.elapsed().as_millis() as u64),
    });
    let new = state.entries.get(state.journaled..).unwrap_or_default();
    if new.is_empty() && run.as_ref().map(|r| &r.stream) == state.kept_running.as_ref() {
        return None;
    }
    Some(ThreadCommit {
        id: thread.id.clone(),
        epoch: thread.epoch.clone(),
        len: state.journaled,
        running: state.kept_running.clone(),
        run,
        pending: serde_json::to_string(&state.pending).unwrap_or_else(|_| "[]".into()),
        updated_ms: unix_ms(state.updated),
        entries: new.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect(),
    })
}

impl Threads {
    /// Hands the keeper `commit` (from [`Threads::changes`]): true when it has it (or there was nothing to
    /// hand), false when another node changed the thread first, and the copy is to be read again.
    pub(super) async fn commit(&self, thread: &Thread, commit: Option<ThreadCommit>) -> Result<bool, ThreadError> {
        let (Some(commit), super::store::Keeper::Shared(shared)) = (commit, &self.inner.keeper) else {
            return Ok(true);
        };
        // A run's stream is in Redis before the thread names it, so every node that reads the thread finds
        // the stream (and does not take a run it cannot find for one whose stream expired).
        let starting = thread.lock().run.as_ref().map(|run| Arc::clone(&run.stream));
        if let Some(stream) = starting.filter(|s| commit.running.as_deref() != Some(s.id())) {
            stream.readable(1).await;
        }
        let applied = shared.commit(&commit).await;
        let mut state = thread.lock();
        match applied {
            Ok(true) => {
                state.journaled = commit.len + commit.entries.len();
                state.kept_running = commit.run.map(|run| run.stream);
                Ok(true)
            }
            Ok(false) => {
                undo(&mut state);
                Ok(false)
            }
            Err(error) => {
                undo(&mut state);
                Err(unavailable(error))
            }
        }
    }
}

/// Takes back what the copy has that Redis does not, and has it read whole again.
fn undo(state: &mut State) {
    state.entries.truncate(state.journaled);
    if state.run.as_ref().map(|run| run.stream.id()) != state.kept_running.as_deref() {
        state.run = None;
    }
    state.stale = true;
}

/// Thread `id` as Redis holds it now, in this node's copy, with the copy's turn lock held; `None` when Redis
/// has no such thread.
pub(super) async fn read(
    threads: &Threads,
    shared: &SharedThreads,
    id: &str,
) -> Result<Option<(Arc<Thread>, OwnedMutexGuard<()>)>, ThreadError> {
    // Twice at most: a run Redis no longer has the stream of is recorded lost, then the thread read again.
    for _ in 0..2 {
        let local = threads.map().get(id).cloned();
        let turn = match &local {
            Some(thread) => Some(Arc::clone(&thread.turn).lock_owned().await),
            None => None,
        };
        let known = local.as_ref().and_then(|thread| {
            let state = thread.lock();
            (!state.stale && !state.gone).then(|| (thread.epoch.clone(), state.journaled))
        });
        let kept = shared.read(id, known.as_ref().map(|(epoch, len)| (epoch.as_str(), *len))).await;
        let Some(kept) = kept.map_err(unavailable)? else {
            if let Some(local) = local {
                let mut map = threads.map();
                if map.get(id).is_some_and(|t| Arc::ptr_eq(t, &local)) {
                    map.remove(id);
                }
                drop(map);
                threads.forget(&local);
            }
            return Ok(None);
        };
        let entries = parse(&kept.entries)?;
        let (thread, turn) = match (local, turn) {
            (Some(thread), Some(turn)) if thread.epoch == kept.epoch && !thread.lock().gone => (thread, turn),
            (old, _) => copy(threads, id, &kept, old).await?,
        };
        let follow = take_in(threads, &thread, &kept, entries);
        let Some(run) = follow else { return Ok(Some((thread, turn))) };
        match shared.stream(&threads.inner.hub, &run.stream).await.map_err(unavailable)? {
            Some(stream) => {
                let started = Instant::now()
                    .checked_sub(Duration::from_millis(unix_ms(SystemTime::now()).saturating_sub(run.started_ms)))
                    .unwrap_or_else(Instant::now);
                let mut state = thread.lock();
                state.run = Some(Run { stream: Arc::clone(&stream), model: run.model, started });
                drop(state);
                super::run::spawn_record(threads, &thread, stream);
                return Ok(Some((thread, turn)));
            }
            None => {
                // Nobody recorded the run while Redis had its stream (every node that knew of it went away):
                // its end is recorded with nothing of its output.
                let commit = {
                    let mut state = thread.lock();
                    state.entries.push(lost_run(&run));
                    state.updated = SystemTime::now();
                    commit_of(&thread, &state)
                };
                threads.commit(&thread, commit).await?;
            }
        }
    }
    Err(ThreadError::Unavailable(format!("the thread {id:?} changed while it was read; try again")))
}

/// A new copy of thread `id` (in place of `old`, a copy of a thread of that id since deleted), in the map.
async fn copy(
    threads: &Threads,
    id: &str,
    kept: &KeptThread,
    old: Option<Arc<Thread>>,
) -> Result<(Arc<Thread>, OwnedMutexGuard<()>), ThreadError> {
    let created = UNIX_EPOCH + Duration::from_millis(kept.created_ms);
    let thread = Arc::new(Thread::new(
        id,
        kept.epoch.clone(),
        kept.owner.clone(),
        created,
        State::new(Vec::new(), 0, Instant::now()),
    ));
    let turn = Arc::clone(&thread.turn).lock_owned().await;
    let mut map = threads.map();
    let limit = threads.inner.config.max_threads;
    let mut evicted = Vec::new();
    if !map.contains_key(id) && map.len() >= limit {
        // The copies are a cache of what Redis holds: the least recently used ones without a run go.
        evicted = least_used(&mut map, limit / 100 + 1);
        if evicted.is_empty() {
            return Err(ThreadError::Full { limit: limit as u64 });
        }
    }
    map.insert(id.to_owned(), Arc::clone(&thread));
    drop(map);
    for old in evicted.iter().chain(&old) {
        threads.forget(old);
    }
    Ok((thread, turn))
}

/// Takes out of `map` up to `count` copies without a run going on, those unused longest first.
fn least_used(map: &mut std::collections::HashMap<String, Arc<Thread>>, count: usize) -> Vec<Arc<Thread>> {
    let mut idle: Vec<(Instant, String)> = map
        .iter()
        .filter_map(|(id, thread)| {
            let state = thread.lock();
            state.run.is_none().then(|| (state.used, id.clone()))
        })
        .collect();
    if idle.len() > count {
        idle.select_nth_unstable(count);
        idle.truncate(count);
    }
    idle.into_iter().filter_map(|(_, id)| map.remove(&id)).collect()
}

/// Brings `thread`'s copy up to `kept`; the run to follow, when Redis has one the copy does not.
fn take_in(threads: &Threads, thread: &Thread, kept: &KeptThread, entries: Vec<AuditEntry>) -> Option<KeptRun> {
    let mut state = thread.lock();
    let bytes: u64 = entries.iter().map(AuditEntry::size).sum();
    if kept.from == 0 {
        threads.release(std::mem::take(&mut state.bytes));
        state.entries = entries;
    } else {
        state.entries.truncate(kept.from);
        state.entries.extend(entries);
    }
    threads.hold(bytes);
    state.bytes += bytes;
    state.journaled = kept.len;
    state.stale = false;
    state.pending = serde_json::from_str(&kept.pending).unwrap_or_default();
    state.updated = UNIX_EPOCH + Duration::from_millis(kept.updated_ms);
    state.used = Instant::now();
    state.kept_running = kept.running.as_ref().map(|run| run.stream.clone());
    let copied = state.run.as_ref().map(|run| run.stream.id().to_owned());
    match &kept.running {
        Some(run) if copied.as_deref() == Some(run.stream.as_str()) => None,
        Some(run) => Some(run.clone()),
        None => {
            // Recorded by another node.
            if state.run.take().is_some() {
                thread.recorded.notify_waiters();
            }
            None
        }
    }
}

/// Entries read from Redis; one that is not an entry is an error (this service wrote them all).
fn parse(entries: &[String]) -> Result<Vec<AuditEntry>, ThreadError> {
    entries
        .iter()
        .map(|entry| {
            serde_json::from_str(entry)
                .map_err(|e| ThreadError::Unavailable(format!("an audit entry in Redis is not one: {e}")))
        })
        .collect()
}

/// The end of a run whose stream Redis no longer has, nobody having recorded it.
fn lost_run(run: &KeptRun) -> AuditEntry {
    let mut audit = serde_json::Map::new();
    audit.insert("model".into(), run.model.clone().into());
    audit.insert("status".into(), json!("error"));
    let message = "the run's stream ended and expired before its result was recorded";
    audit.insert("error".into(), json!({"message": message, "code": "interrupted"}));
    AuditEntry::new(Some(&run.stream), None, Decision::RunEnd, audit)
}

/// Thread `id` for `owner`, made (with `entries`) when Redis has none; an existing one is an error when
/// `exclusive`.
pub(super) async fn insert(
    threads: &Threads,
    shared: &SharedThreads,
    id: &str,
    entries: &[AuditEntry],
    exclusive: bool,
    owner: Option<&str>,
) -> Result<Arc<Thread>, ThreadError> {
    let not_found = || ThreadError::NotFound(id.to_owned());
    if !exclusive && let Some((thread, _turn)) = read(threads, shared, id).await? {
        return if thread.owned_by(owner) { Ok(thread) } else { Err(not_found()) };
    }
    let epoch = uuid::Uuid::new_v4().simple().to_string();
    let json: Vec<String> = entries.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect();
    let now = unix_ms(SystemTime::now());
    let existing = shared.create(id, &epoch, owner, now, &json).await.map_err(unavailable)?;
    if existing.is_some() && exclusive {
        return Err(ThreadError::Exists(id.to_owned()));
    }
    let (thread, _turn) = read(threads, shared, id).await?.ok_or_else(not_found)?;
    if thread.owned_by(owner) { Ok(thread) } else { Err(not_found()) }
}

/// Deletes thread `id` (for `owner`) from Redis and this node; false when there is none.
pub(super) async fn delete(
    threads: &Threads,
    shared: &SharedThreads,
    id: &str,
    owner: Option<&str>,
) -> Result<bool, ThreadError> {
    let Some((thread, _turn)) = read(threads, shared, id).await? else { return Ok(false) };
    if !thread.owned_by(owner) {
        return Ok(false);
    }
    shared.delete(id, &thread.epoch).await.map_err(unavailable)?;
    let mut map = threads.map();
    if map.get(id).is_some_and(|t| Arc::ptr_eq(t, &thread)) {
        map.remove(id);
    }
    drop(map);
    threads.forget(&thread);
    Ok(true)
}
