//! [`Threads`]: every thread the service keeps, by id, within [`ThreadConfig`]'s limits.
//!
//! A thread is its audit entries, the run going on (if any), the calls its last run handed to the client,
//! and when it was last used. Each thread has its own lock; the map's lock is never taken while a thread's is
//! held. The bytes threads hold are counted globally, so that the total stays bounded whatever the clients do.
//!
//! Where else a thread is kept is the [`Keeper`]'s: nowhere, the embedded store (a journal of what this
//! process holds, read back at start), or Redis, shared by every node, where the map is only this node's
//! copy of the threads its clients use, read again before each use (`shared.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Map;
use tokio::sync::Notify;

use super::audit::{AuditEntry, Decision, history_of};
use super::{ThreadConfig, ThreadError, check_id};
use crate::agent::Agents;
use crate::cluster::{SharedThreads, ThreadCommit};
use crate::conversation::{ChatMessage, ToolCall, validate_user_input};
use crate::hub::{Hub, Stream};
use crate::store::{Store, StoredThread, ThreadWrite};

/// How long a read or a turn waits for the result of a run that has ended to be recorded (a moment).
pub(super) const RECORD_WAIT: Duration = Duration::from_secs(5);

/// The threads of a service. Cheap to clone; clones share the threads.
#[derive(Clone)]
pub struct Threads {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) config: ThreadConfig,
    pub(super) hub: Hub,
    pub(super) agents: Arc<Agents>,
    /// Where threads are kept besides this map.
    pub(super) keeper: Keeper,
    pub(super) map: Mutex<HashMap<String, Arc<Thread>>>,
    /// Bytes of messages held by every thread.
    bytes: AtomicU64,
}

/// Where threads are kept besides this process's memory.
pub(super) enum Keeper {
    /// Nowhere: they last as long as the process.
    Memory,
    /// The embedded store, which this process alone writes: the map is the record, the store its journal.
    Store(Arc<Store>),
    /// Redis, which every node reads and writes: Redis is the record, the map this node's copy of it.
    Shared(SharedThreads),
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

/// One thread.
pub(super) struct Thread {
    pub(super) id: String,
    /// Which thread of that id this is, in Redis (a thread deleted and made again is another); empty
    /// elsewhere.
    pub(super) epoch: String,
    /// The API key (by name) that created it, with keys configured: no other key finds it.
    pub(super) owner: Option<String>,
    pub(super) created: SystemTime,
    state: Mutex<State>,
    /// Held from reading a shared thread to committing what changed, so this node's own changes to it go
    /// one at a time (other nodes' are caught by the commit's check).
    pub(super) turn: Arc<tokio::sync::Mutex<()>>,
    /// Fires when a run's result has been recorded.
    pub(super) recorded: Notify,
}

pub(super) struct State {
    pub(super) entries: Vec<AuditEntry>,
    /// Bytes of its entries' messages.
    pub(super) bytes: u64,
    pub(super) run: Option<Run>,
    /// Calls the last run handed to the client, not yet answered.
    pub(super) pending: Vec<ToolCall>,
    pub(super) used: Instant,
    pub(super) updated: SystemTime,
    /// Set when the thread is deleted or evicted: a run still going records nothing.
    pub(super) gone: bool,
    /// How many of `entries` the keeper has.
    pub(super) journaled: usize,
    /// The stream of the run the keeper has as going on (shared threads).
    pub(super) kept_running: Option<String>,
    /// The copy may differ from the keeper's record: read all of it again (shared threads).
    pub(super) stale: bool,
}

/// The run going on in a thread.
pub(super) struct Run {
    pub(super) stream: Arc<Stream>,
    pub(super) model: String,
    pub(super) started: Instant,
}

impl Thread {
    /// A thread with `state`, made `created`.
    pub(super) fn new(id: &str, epoch: String, owner: Option<String>, created: SystemTime, state: State) -> Thread {
        Thread {
            id: id.to_owned(),
            epoch,
            owner,
            created,
            state: Mutex::new(state),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            recorded: Notify::new(),
        }
    }

    /// Whether a request from `owner` (a key's name, or none without keys) may see it.
    pub(super) fn owned_by(&self, owner: Option<&str>) -> bool {
        self.owner.is_none() || self.owner.as_deref() == owner
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }
}

impl State {
    /// A thread's state with `entries`, holding `bytes`, last used `used`.
    pub(super) fn new(entries: Vec<AuditEntry>, bytes: u64, used: Instant) -> State {
        State {
            entries,
            bytes,
            run: None,
            pending: Vec::new(),
            used,
            updated: SystemTime::now(),
            gone: false,
            journaled: 0,
            kept_running: None,
            stale: false,
        }
    }

    /// The conversation so far.
    pub(super) fn history(&self) -> impl Iterator<Item = &ChatMessage> {
        history_of(&self.entries).into_iter().filter_map(AuditEntry::history)
    }
}

/// A thread as `GET /v1/threads/{id}` shows it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Transcript {
    /// The thread's id.
    pub id: String,
    /// `thread`.
    pub object: &'static str,
    /// When it was created, in Unix seconds.
    pub created_at: u64,
    /// When its history last changed, in Unix seconds.
    pub updated_at: u64,
    /// The conversation, oldest first.
    pub messages: Vec<ChatMessage>,
    /// The stream of the run going on, if one is.
    pub running: Option<String>,
    /// The calls its last run handed to the client, which the next turn may answer.
    pub pending_tool_calls: Vec<ToolCall>,
}

pub(super) fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Threads {
    /// No threads yet; runs start agents of `agents` on streams of `hub`.
    pub fn new(hub: Hub, agents: Arc<Agents>, config: ThreadConfig) -> Self {
        Threads::with_store(hub, agents, config, None)
    }

    /// Threads kept in `store` (those it kept from before a restart first), or in memory only.
    pub fn with_store(hub: Hub, agents: Arc<Agents>, config: ThreadConfig, store: Option<Arc<Store>>) -> Self {
        let kept = store.as_ref().map(|s| s.take_threads()).unwrap_or_default();
        let keeper = store.map_or(Keeper::Memory, Keeper::Store);
        let threads = Threads::with_keeper(hub, agents, config, keeper);
        for thread in kept {
            threads.restore(thread);
        }
        threads
    }

    /// Threads every node of a cluster shares, in Redis (`--engine redis`).
    pub(crate) fn shared(hub: Hub, agents: Arc<Agents>, config: ThreadConfig, shared: SharedThreads) -> Self {
        Threads::with_keeper(hub, agents, config, Keeper::Shared(shared))
    }

    fn with_keeper(hub: Hub, agents: Arc<Agents>, config: ThreadConfig, keeper: Keeper) -> Self {
        Threads {
            inner: Arc::new(Inner {
                config,
                hub,
                agents,
                keeper,
                map: Mutex::new(HashMap::new()),
                bytes: AtomicU64::new(0),
            }),
        }
    }

    /// Takes back a thread the store kept.
    fn restore(&self, kept: StoredThread) {
        let entries: Vec<AuditEntry> =
            kept.entries.into_iter().filter_map(|e| serde_json::from_value(e).ok()).collect();
        let bytes: u64 = entries.iter().map(AuditEntry::size).sum();
        self.hold(bytes);
        let now_ms = unix_ms(SystemTime::now());
        let used = Instant::now()
            .checked_sub(Duration::from_millis(now_ms.saturating_sub(kept.used_ms)))
            .unwrap_or_else(Instant::now);
        let mut state = State::new(entries, bytes, used);
        state.journaled = state.entries.len();
        state.pending = serde_json::from_value(kept.pending).unwrap_or_default();
        let created = UNIX_EPOCH + Duration::from_millis(kept.created_ms);
        let thread = Arc::new(Thread::new(&kept.id, String::new(), kept.owner, created, state));
        self.map().insert(kept.id, thread);
    }

    /// What changed in `thread` since the keeper last had it: the store is handed it here and now; for
    /// Redis, the commit to make once the thread's lock is let go ([`Threads::commit`]).
    pub(super) fn changes(&self, thread: &Thread, state: &mut State) -> Option<ThreadCommit> {
        if state.gone {
            return None;
        }
        match &self.inner.keeper {
            Keeper::Memory => None,
            Keeper::Store(store) => {
                for (position, entry) in state.entries.iter().enumerate().skip(state.journaled) {
                    let entry = serde_json::to_string(entry).unwrap_or_default();
                    let (thread, position) = (thread.id.clone(), position as u64);
                    store.write_thread(ThreadWrite::Entry { thread, position, entry });
                }
                state.journaled = state.entries.len();
                store.write_thread(ThreadWrite::Thread {
                    id: thread.id.clone(),
                    created_ms: unix_ms(thread.created),
                    used_ms: unix_ms(SystemTime::now()),
                    pending: serde_json::to_string(&state.pending).unwrap_or_else(|_| "[]".into()),
                    owner: thread.owner.clone(),
                });
                None
            }
            Keeper::Shared(_) => super::shared::commit_of(thread, state),
        }
    }

    pub(super) fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Thread>>> {
        crate::sync::lock(&self.inner.map)
    }

    /// Creates a thread, under `id` or a new one, with `messages` (user, system and developer messages
    /// only: the client cannot write what the model said), for `owner` (the key that creates it, when the
    /// service has keys: no other key will find it).
    pub async fn create(
        &self,
        id: Option<&str>,
        messages: Vec<ChatMessage>,
        owner: Option<&str>,
    ) -> Result<Transcript, ThreadError> {
        if !messages.is_empty() {
            validate_user_input(&messages)?;
        }
        let id = match id {
            Some(id) => {
                check_id(id)?;
                id.to_owned()
            }
            None => format!("thread_{}", uuid::Uuid::new_v4().simple()),
        };
        let entries: Vec<AuditEntry> = messages
            .into_iter()
            .map(|message| {
                let decision = Decision::for_input(&message);
                AuditEntry::new(None, Some(message), decision, Map::new())
            })
            .collect();
        let thread = self.insert(&id, entries, true, owner).await?;
        let state = thread.lock();
        Ok(self.transcript(&thread, &state))
    }

    /// Adds a thread with `entries` for `owner`; an existing one is an error when `exclusive`, and is
    /// returned otherwise (not found when another key owns it).
    pub(super) async fn insert(
        &self,
        id: &str,
        mut entries: Vec<AuditEntry>,
        exclusive: bool,
        owner: Option<&str>,
    ) -> Result<Arc<Thread>, ThreadError> {
        let config = &self.inner.config;
        let bytes: u64 = entries.iter().map(AuditEntry::size).sum();
        if bytes > config.thread_bytes {
            return Err(ThreadError::TooLarge { size: bytes, limit: config.thread_bytes });
        }
        for entry in &mut entries {
            entry.audit.insert("bytes".into(), entry.size().into());
        }
        if let Keeper::Shared(shared) = &self.inner.keeper {
            return super::shared::insert(self, shared, id, &entries, exclusive, owner).await;
        }
        let mut map = self.map();
        if let Some(thread) = map.get(id) {
            return match (exclusive, thread.owned_by(owner)) {
                (true, _) => Err(ThreadError::Exists(id.to_owned())),
                (false, true) => Ok(Arc::clone(thread)),
                (false, false) => Err(ThreadError::NotFound(id.to_owned())),
            };
        }
        if map.len() >= config.max_threads {
            return Err(ThreadError::Full { limit: config.max_threads as u64 });
        }
        self.reserve(bytes)?;
        let state = State::new(entries, bytes, Instant::now());
        let thread = Arc::new(Thread::new(id, String::new(), owner.map(str::to_owned), SystemTime::now(), state));
        map.insert(id.to_owned(), Arc::clone(&thread));
        drop(map);
        self.changes(&thread, &mut thread.lock());
        Ok(thread)
    }

    /// Counts `bytes` more held by threads, unless that passes the total.
    pub(super) fn reserve(&self, bytes: u64) -> Result<(), ThreadError> {
        let limit = self.inner.config.total_bytes;
        self.inner
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| held.checked_add(bytes).filter(|&t| t <= limit))
            .map(drop)
            .map_err(|_| ThreadError::Full { limit })
    }

    /// Counts `bytes` more held, even past the total: a run's result is recorded whatever its size (the
    /// stream already bounded it), and the next input is refused instead.
    pub(super) fn hold(&self, bytes: u64) {
        self.inner.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn release(&self, bytes: u64) {
        let _ = self
            .inner
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| Some(held.saturating_sub(bytes)));
    }

    /// The thread `id`, if `owner` may see it: as the keeper has it now.
    pub(super) async fn find(&self, id: &str, owner: Option<&str>) -> Result<Option<Arc<Thread>>, ThreadError> {
        let thread = match &self.inner.keeper {
            Keeper::Shared(shared) => super::shared::read(self, shared, id).await?.map(|(thread, _turn)| thread),
            _ => self.map().get(id).cloned(),
        };
        Ok(thread.filter(|thread| thread.owned_by(owner)))
    }

    /// The run going on in thread `id`, if `owner` may see the thread and one is.
    pub async fn running(&self, id: &str, owner: Option<&str>) -> Result<Option<Arc<Stream>>, ThreadError> {
        let Some(thread) = self.find(id, owner).await? else { return Ok(None) };
        let state = thread.lock();
        Ok(state.run.as_ref().map(|run| Arc::clone(&run.stream)).filter(|stream| stream.outcome().is_none()))
    }

    pub(super) fn transcript(&self, thread: &Thread, state: &State) -> Transcript {
        Transcript {
            id: thread.id.clone(),
            object: "thread",
            created_at: unix(thread.created),
            updated_at: unix(state.updated),
            messages: state.history().cloned().collect(),
            running: state.run.as_ref().map(|run| run.stream.id().to_owned()),
            pending_tool_calls: state.pending.clone(),
        }
    }

    /// The thread, once the result of a run that has ended is recorded: a client that read a run's end and
    /// reads the thread at once sees the run in it.
    pub(super) async fn settled(&self, id: &str, owner: Option<&str>) -> Result<Option<Arc<Thread>>, ThreadError> {
        let Some(thread) = self.find(id, owner).await? else { return Ok(None) };
        self.caught_up(&thread).await?;
        let deadline = tokio::time::Instant::now() + RECORD_WAIT;
        loop {
            let recorded = thread.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            let recording = thread.lock().run.as_ref().is_some_and(|run| run.stream.outcome().is_some());
            if !recording || tokio::time::timeout_at(deadline, recorded).await.is_err() {
                break;
            }
        }
        Ok(Some(thread))
    }

    /// With Redis, waits (a moment at most) for this node's copy of the stream of the thread's run to have
    /// the end Redis has already, or is about to have: a run that ended on another node reaches this one a
    /// moment later (a client that read the end there and turns to this node at once should find the run
    /// ended here too), and a run whose node died ends `interrupted` at the follower's first look.
    pub(super) async fn caught_up(&self, thread: &Thread) -> Result<(), ThreadError> {
        let Keeper::Shared(shared) = &self.inner.keeper else { return Ok(()) };
        let running = thread.lock().run.as_ref().map(|run| Arc::clone(&run.stream));
        let Some(stream) = running.filter(|stream| stream.outcome().is_none()) else { return Ok(()) };
        if shared.stream_ending(stream.id()).await.map_err(super::shared::unavailable)? {
            let _ = tokio::time::timeout(RECORD_WAIT, stream.ended()).await;
        }
        Ok(())
    }

    /// The thread's conversation, or `None` when there is no such thread (for `owner`).
    pub async fn get(&self, id: &str, owner: Option<&str>) -> Result<Option<Transcript>, ThreadError> {
        let Some(thread) = self.settled(id, owner).await? else { return Ok(None) };
        let state = thread.lock();
        Ok(Some(self.transcript(&thread, &state)))
    }

    /// The thread's audit log, in order, or `None` when there is no such thread (for `owner`).
    pub async fn audit(&self, id: &str, owner: Option<&str>) -> Result<Option<Vec<AuditEntry>>, ThreadError> {
        let Some(thread) = self.settled(id, owner).await? else { return Ok(None) };
        let state = thread.lock();
        Ok(Some(state.entries.clone()))
    }

    /// Removes a thread; a run still going on it goes on, and its result is not recorded. False when there
    /// was no such thread (for `owner`).
    pub async fn delete(&self, id: &str, owner: Option<&str>) -> Result<bool, ThreadError> {
        if let Keeper::Shared(shared) = &self.inner.keeper {
            return super::shared::delete(self, shared, id, owner).await;
        }
        let mut map = self.map();
        if !map.get(id).is_some_and(|thread| thread.owned_by(owner)) {
            return Ok(false);
        }
        let Some(thread) = map.remove(id) else { return Ok(false) };
        drop(map);
        self.forget(&thread);
        if let Keeper::Store(store) = &self.inner.keeper {
            store.write_thread(ThreadWrite::Delete { id: thread.id.clone() });
        }
        Ok(true)
    }

    /// Lets go of this process's copy of a thread (a run still going on it records nothing here).
    pub(super) fn forget(&self, thread: &Thread) {
        let mut state = thread.lock();
        state.gone = true;
        self.release(std::mem::take(&mut state.bytes));
        state.entries = Vec::new();
    }

    /// How many threads are kept (with Redis: this node's copies).
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// True when no thread is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Evicts the threads unused for longer than the TTL that have no run going on. With Redis, which
    /// expires threads itself, this node lets go of its copies unused for [`super::shared::KEEP_COPY`] (or
    /// the TTL, when shorter).
    pub fn sweep(&self) {
        let (ttl, shared) = match &self.inner.keeper {
            Keeper::Shared(_) => {
                let ttl = self.inner.config.ttl;
                (if ttl.is_zero() { super::shared::KEEP_COPY } else { ttl.min(super::shared::KEEP_COPY) }, true)
            }
            _ => (self.inner.config.ttl, false),
        };
        if ttl.is_zero() {
            return;
        }
        let mut evicted = Vec::new();
        self.map().retain(|_, thread| {
            let state = thread.lock();
            let keep = state.run.is_some() || state.used.elapsed() < ttl;
            drop(state);
            if !keep {
                evicted.push(Arc::clone(thread));
            }
            keep
        });
        for thread in evicted {
            tracing::debug!(thread = thread.id, "thread evicted after its TTL");
            self.forget(&thread);
            if let (Keeper::Store(store), false) = (&self.inner.keeper, shared) {
                store.write_thread(ThreadWrite::Delete { id: thread.id.clone() });
            }
        }
    }
}
