//! This node's copy of a thread whose record is a storage every node shares (Redis): reading the thread into
//! the copy.
//!
//! The record is the storage's ([`ThreadStorage::is_record`]); the registry's map holds this node's copy of
//! the threads its clients use. Each use reads the thread again first, under the thread's turn lock: only
//! the entries after those the copy has, since entries are only appended. A change (a turn's input and its
//! run, a refused input, a run's result) is made to the copy as on one node, then committed with the check
//! that the record still holds what the copy was read from ([`Threads::commit`]); when another node changed
//! the thread first, the copy is read again and the change made again on it (a turn whose run had started
//! cancels that run: it was never handed out). A run going on in a thread is followed wherever it was
//! started, and recorded when it ends by whichever node that knows of it commits first, so a run's result
//! is recorded even when its node dies: [`read`] hands such a run to its caller, which has it recorded
//! (`recorder.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::sync::OwnedMutexGuard;

use super::audit::{AuditEntry, Decision};
use super::error::ThreadError;
use super::registry::{Run, State, Thread, Threads, unix_ms};
use super::storage::{RecordedRun, RecordedThread};
use crate::hub::Stream;

/// What [`read`] found.
pub(super) enum Fetched {
    /// The storage is a journal: the registry's map is the record.
    Local,
    /// The record has no such thread.
    Missing,
    /// This node's copy, brought up to the record, with its turn lock held.
    Copy {
        thread: Arc<Thread>,
        turn: OwnedMutexGuard<()>,
        /// The stream of a run the record has going on that the copy did not know of: now the copy's run,
        /// to be recorded when it ends.
        follow: Option<Arc<Stream>>,
    },
}

/// Thread `id` as the record holds it now, in this node's copy, with the copy's turn lock held.
pub(super) async fn read(threads: &Threads, id: &str) -> Result<Fetched, ThreadError> {
    let storage = &threads.inner.storage;
    if !storage.is_record() {
        return Ok(Fetched::Local);
    }
    // Twice at most: a run the record no longer has the stream of is recorded lost, then the thread read
    // again.
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
        let kept = storage.read(id, known.as_ref().map(|(epoch, len)| (epoch.as_str(), *len))).await?;
        let Some(kept) = kept else {
            if let Some(local) = local {
                let mut map = threads.map();
                if map.get(id).is_some_and(|t| Arc::ptr_eq(t, &local)) {
                    map.remove(id);
                }
                drop(map);
                threads.forget(&local);
            }
            return Ok(Fetched::Missing);
        };
        let entries = parse(&kept.entries)?;
        let (thread, turn) = match (local, turn) {
            (Some(thread), Some(turn)) if thread.epoch == kept.epoch && !thread.lock().gone => (thread, turn),
            (old, _) => copy(threads, id, &kept, old).await?,
        };
        let follow = take_in(threads, &thread, &kept, entries);
        let Some(run) = follow else { return Ok(Fetched::Copy { thread, turn, follow: None }) };
        match storage.stream(&threads.inner.hub, &run.stream).await? {
            Some(stream) => {
                let started = Instant::now()
                    .checked_sub(Duration::from_millis(unix_ms(SystemTime::now()).saturating_sub(run.started_ms)))
                    .unwrap_or_else(Instant::now);
                let mut state = thread.lock();
                state.run = Some(Run { stream: Arc::clone(&stream), model: run.model, started });
                drop(state);
                return Ok(Fetched::Copy { thread, turn, follow: Some(stream) });
            }
            None => {
                // Nobody recorded the run while the record had its stream (every node that knew of it went
                // away): its end is recorded with nothing of its output.
                let commit = {
                    let mut state = thread.lock();
                    state.entries.push(Arc::new(lost_run(&run)));
                    state.updated = SystemTime::now();
                    threads.changes(&thread, &mut state)
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
    kept: &RecordedThread,
    old: Option<Arc<Thread>>,
) -> Result<(Arc<Thread>, OwnedMutexGuard<()>), ThreadError> {
    let created = UNIX_EPOCH + Duration::from_millis(kept.created_ms);
    let thread = Arc::new(Thread::new(
        id,
        kept.epoch.clone(),
        kept.owner.clone(),
        created,
        State::new(Vec::new(), 0, threads.now_ms()),
    ));
    let turn = Arc::clone(&thread.turn).lock_owned().await;
    let mut map = threads.map();
    let limit = threads.inner.config.max_threads;
    let mut evicted = Vec::new();
    if !map.contains_key(id) && map.len() >= limit {
        // The copies are a cache of what the record holds: the least recently used ones without a run go.
        evicted = least_used(&mut map, limit / 100 + 1);
        if evicted.is_empty() {
            return Err(ThreadError::Full { limit, retry_after: threads.room_in(&map, None) });
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
    let mut idle: Vec<(u64, String)> = map
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

/// Brings `thread`'s copy up to `kept`; the run to follow, when the record has one the copy does not.
fn take_in(
    threads: &Threads,
    thread: &Thread,
    kept: &RecordedThread,
    entries: Vec<Arc<AuditEntry>>,
) -> Option<RecordedRun> {
    let mut state = thread.lock();
    let bytes: u64 = entries.iter().map(|entry| entry.size()).sum();
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
    state.used = threads.now_ms();
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

/// Entries read from the record; one that is not an entry is an error (this service wrote them all).
fn parse(entries: &[String]) -> Result<Vec<Arc<AuditEntry>>, ThreadError> {
    entries
        .iter()
        .map(|entry| {
            serde_json::from_str(entry)
                .map(Arc::new)
                .map_err(|e| ThreadError::Unavailable(format!("an audit entry in Redis is not one: {e}")))
        })
        .collect()
}

/// The end of a run whose stream the record no longer has, nobody having recorded it.
fn lost_run(run: &RecordedRun) -> AuditEntry {
    let mut audit = serde_json::Map::new();
    audit.insert("model".into(), run.model.clone().into());
    audit.insert("status".into(), json!("error"));
    let message = "the run's stream ended and expired before its result was recorded";
    audit.insert("error".into(), json!({"message": message, "code": "interrupted"}));
    AuditEntry::new(Some(&run.stream), None, Decision::RunEnd, audit)
}
