//! [`Threads`]: the registry of every thread the service keeps, by id, within [`ThreadConfig`]'s limits.
//!
//! A thread is its audit entries, the run going on (if any), the calls its last run handed to the client,
//! and when it was last used (by the hub's clock, [`crate::hub::HubConfig::clock`], so that a test moves
//! a thread past its TTL by hand). Each thread has its own lock; the map's lock is never taken while a
//! thread's is held. The bytes threads hold are counted globally, so that the total stays bounded whatever
//! the clients do.
//!
//! Where else a thread is kept is its [`ThreadStorage`]'s (`storage.rs`): nowhere, a journal of what this
//! process holds (read back at start through [`Threads::restore`]), or a record every node shares, where
//! the map is only this node's copy of the threads its clients use, read again before each use
//! (`replica.rs`). This file holds what is the same whatever the storage: the threads' state, handing
//! their changes to the storage ([`Threads::changes`], [`Threads::commit`]), the limits, and eviction.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::Notify;

use super::audit::{AuditEntry, history_of};
use super::budget::ThreadBudgets;
use super::config::ThreadConfig;
use super::error::ThreadError;
use super::storage::{Change, Commit, MemoryThreadStorage, RecordedRun, RestoredThread, ThreadStorage};
use crate::agent::Agents;
use crate::conversation::{ChatMessage, ToolCall};
use crate::hub::{Hub, Stream};

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
    pub(super) storage: Arc<dyn ThreadStorage>,
    pub(super) map: Mutex<HashMap<String, Arc<Thread>>>,
    /// Threads kept, by client (`budget.rs`).
    pub(super) budgets: ThreadBudgets,
    /// Bytes of messages held by every thread.
    bytes: AtomicU64,
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

/// One thread.
pub(super) struct Thread {
    pub(super) id: String,
    /// Which thread of that id this is, in a shared record (a thread deleted and made again is another);
    /// empty elsewhere.
    pub(super) epoch: String,
    /// The API key (by name) that created it, with keys configured: no other key finds it.
    pub(super) owner: Option<String>,
    /// The client whose budget it counts against (`budget.rs`), if any.
    pub(super) client: Option<String>,
    pub(super) created: SystemTime,
    state: Mutex<State>,
    /// Held from reading a shared thread to committing what changed, so this node's own changes to it go
    /// one at a time (other nodes' are caught by the commit's check).
    pub(super) turn: Arc<tokio::sync::Mutex<()>>,
    /// Fires when a run's result has been recorded.
    pub(super) recorded: Notify,
}

pub(super) struct State {
    /// Shared with the reads under way (a read holds the entries it writes out, not a copy of them).
    pub(super) entries: Vec<Arc<AuditEntry>>,
    /// Bytes of its entries' messages.
    pub(super) bytes: u64,
    pub(super) run: Option<Run>,
    /// Calls the last run handed to the client, not yet answered.
    pub(super) pending: Vec<ToolCall>,
    /// When it was last used (ms by the hub's clock).
    pub(super) used: u64,
    pub(super) updated: SystemTime,
    /// Set when the thread is deleted or evicted: a run still going records nothing.
    pub(super) gone: bool,
    /// How many of `entries` the storage has.
    pub(super) journaled: usize,
    /// The stream of the run the storage has as going on (a shared record).
    pub(super) kept_running: Option<String>,
    /// The copy may differ from the storage's record: read all of it again (a shared record).
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
            client: None,
            created,
            state: Mutex::new(state),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            recorded: Notify::new(),
        }
    }

    /// The same thread, counted against `client`'s budget (whoever made it counted it).
    pub(super) fn counted_for(mut self, client: Option<&str>) -> Thread {
        self.client = client.map(str::to_owned);
        self
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
    /// A thread's state with `entries`, holding `bytes`, last used `used` (ms by the hub's clock).
    pub(super) fn new(entries: Vec<AuditEntry>, bytes: u64, used: u64) -> State {
        State {
            entries: entries.into_iter().map(Arc::new).collect(),
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
    pub(super) fn history(&self) -> impl Iterator<Item = &Arc<ChatMessage>> {
        history_of(&self.entries).into_iter().filter_map(|entry| entry.history())
    }

    /// Takes back what the copy has that the shared record does not, and has it read whole again.
    fn undo(&mut self) {
        self.entries.truncate(self.journaled);
        if self.run.as_ref().map(|run| run.stream.id()) != self.kept_running.as_deref() {
            self.run = None;
        }
        self.stale = true;
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
    // The thread's own messages, shared: a read holds no copy of them.
    pub messages: Vec<Arc<ChatMessage>>,
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
    /// No threads yet, kept in memory only; runs start agents of `agents` on streams of `hub`.
    pub fn new(hub: Hub, agents: Arc<Agents>, config: ThreadConfig) -> Self {
        Threads::with_storage(hub, agents, config, Arc::new(MemoryThreadStorage))
    }

    /// No threads yet, kept in `storage` too. Threads a journal kept from before a restart come back
    /// through [`Threads::restore`], called by whoever assembles the service.
    pub(crate) fn with_storage(
        hub: Hub,
        agents: Arc<Agents>,
        config: ThreadConfig,
        storage: Arc<dyn ThreadStorage>,
    ) -> Self {
        Threads {
            inner: Arc::new(Inner {
                config,
                hub,
                agents,
                storage,
                map: Mutex::new(HashMap::new()),
                budgets: ThreadBudgets::default(),
                bytes: AtomicU64::new(0),
            }),
        }
    }

    /// Takes back a thread the storage kept from before a restart.
    pub(crate) fn restore(&self, kept: RestoredThread) {
        let bytes: u64 = kept.entries.iter().map(AuditEntry::size).sum();
        self.hold(bytes);
        let mut state = State::new(kept.entries, bytes, kept.used_ms);
        state.journaled = state.entries.len();
        state.pending = kept.pending;
        let created = UNIX_EPOCH + Duration::from_millis(kept.created_ms);
        // A key's thread counts against the key again; one made without keys was counted against an address
        // the journal does not keep, and counts only against the service's limit.
        let client = kept.owner.as_deref().map(|owner| format!("key:{owner}"));
        if let Some(client) = &client {
            self.inner.budgets.hold(client);
        }
        let thread = Thread::new(&kept.id, String::new(), kept.owner, created, state).counted_for(client.as_deref());
        self.map().insert(kept.id, Arc::new(thread));
    }

    /// Now, in ms by the hub's clock: what a thread's `used` and its TTL are measured by.
    pub(super) fn now_ms(&self) -> u64 {
        self.inner.hub.config().clock.now_ms()
    }

    /// Hands the storage what changed in `thread` since it last had it, under the thread's lock: a journal
    /// has it here and now; a shared record answers the commit to make once the lock is let go
    /// ([`Threads::commit`]).
    pub(super) fn changes(&self, thread: &Thread, state: &mut State) -> Option<Commit> {
        if state.gone {
            return None;
        }
        let run = state.run.as_ref().map(|run| RecordedRun {
            stream: run.stream.id().to_owned(),
            model: run.model.clone(),
            started_ms: unix_ms(SystemTime::now()).saturating_sub(run.started.elapsed().as_millis() as u64),
        });
        let change = Change {
            id: &thread.id,
            epoch: &thread.epoch,
            owner: thread.owner.as_deref(),
            created_ms: unix_ms(thread.created),
            used_ms: self.now_ms(),
            updated_ms: unix_ms(state.updated),
            kept: state.journaled,
            entries: &state.entries,
            pending: &state.pending,
            running: state.kept_running.as_deref(),
            run,
        };
        let commit = self.inner.storage.changed(&change);
        if commit.is_none() {
            state.journaled = state.entries.len();
        }
        commit
    }

    /// Hands the storage `commit` (from [`Threads::changes`]): true when it has it (or there was nothing to
    /// hand), false when another node changed the thread first, and the copy is to be read again.
    pub(super) async fn commit(&self, thread: &Thread, commit: Option<Commit>) -> Result<bool, ThreadError> {
        let Some(commit) = commit else { return Ok(true) };
        // A run's stream is in the storage before the thread names it, so every node that reads the thread
        // finds the stream (and does not take a run it cannot find for one whose stream expired).
        let starting = thread.lock().run.as_ref().map(|run| Arc::clone(&run.stream));
        if let Some(stream) = starting.filter(|s| commit.running.as_deref() != Some(s.id())) {
            stream.readable(1).await;
        }
        let applied = self.inner.storage.commit(&commit).await;
        let mut state = thread.lock();
        match applied {
            Ok(true) => {
                state.journaled = commit.len + commit.entries.len();
                state.kept_running = commit.run.map(|run| run.stream);
                Ok(true)
            }
            Ok(false) => {
                state.undo();
                Ok(false)
            }
            Err(error) => {
                state.undo();
                Err(error)
            }
        }
    }

    pub(super) fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Thread>>> {
        crate::sync::lock(&self.inner.map)
    }

    /// Counts `bytes` more held by threads, unless that passes the total.
    pub(super) fn reserve(&self, bytes: u64) -> Result<(), ThreadError> {
        let limit = self.inner.config.total_bytes;
        self.inner
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| held.checked_add(bytes).filter(|&t| t <= limit))
            .map(drop)
            .map_err(|_| ThreadError::BytesFull { limit, retry_after: self.ttl() })
    }

    /// The thread TTL, as a wait: an idle thread expires by then (none when threads never expire).
    fn ttl(&self) -> Option<Duration> {
        let ttl = self.inner.config.ttl;
        (!ttl.is_zero()).then(|| ttl.max(Duration::from_secs(1)))
    }

    /// When the first of the threads in `map` (of `client`, if one is given) is expected to expire: a TTL
    /// after its last use (none when threads never expire). What a refusal for want of room answers as
    /// `retry-after`.
    pub(super) fn room_in(&self, map: &HashMap<String, Arc<Thread>>, client: Option<&str>) -> Option<Duration> {
        let ttl = self.ttl()?;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let now_ms = self.now_ms();
        let budgets = &self.inner.budgets;
        let at_ms = budgets.room_at(client, now_ms).unwrap_or_else(|| {
            let first_used = map
                .values()
                .filter(|thread| client.is_none() || thread.client.as_deref() == client)
                .map(|thread| thread.lock().used)
                .min();
            let at_ms = first_used.unwrap_or(now_ms).saturating_add(ttl_ms);
            budgets.expect_room(client, at_ms);
            at_ms
        });
        // At least a second: `Retry-After` counts whole seconds, and the sweep that expires threads runs
        // about once a second.
        Some(Duration::from_millis(at_ms.saturating_sub(now_ms).max(1_000)))
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

    /// With a shared record, waits (a moment at most) for this node's copy of the stream of the thread's
    /// run to have the end the record has already, or is about to have: a run that ended on another node
    /// reaches this one a moment later (a client that read the end there and turns to this node at once
    /// should find the run ended here too), and a run whose node died ends `interrupted` at the follower's
    /// first look.
    pub(super) async fn caught_up(&self, thread: &Thread) -> Result<(), ThreadError> {
        let running = thread.lock().run.as_ref().map(|run| Arc::clone(&run.stream));
        let Some(stream) = running.filter(|stream| stream.outcome().is_none()) else { return Ok(()) };
        if self.inner.storage.stream_ending(stream.id()).await? {
            let _ = tokio::time::timeout(RECORD_WAIT, stream.ended()).await;
        }
        Ok(())
    }

    /// Lets go of this process's copy of a thread (a run still going on it records nothing here).
    pub(super) fn forget(&self, thread: &Thread) {
        let mut state = thread.lock();
        if !std::mem::replace(&mut state.gone, true)
            && let Some(client) = &thread.client
        {
            self.inner.budgets.release(client);
        }
        self.release(std::mem::take(&mut state.bytes));
        state.entries = Vec::new();
    }

    /// How many threads are kept (with a shared record: this node's copies).
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// True when no thread is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Evicts the threads unused for longer than the TTL (by the hub's clock) that have no run going on.
    /// With a shared record, which expires threads itself, this node lets go of the copies it has not used
    /// for a while ([`ThreadStorage::kept_for`]), and the record keeps them.
    pub fn sweep(&self) {
        let ttl = self.inner.storage.kept_for(self.inner.config.ttl);
        if ttl.is_zero() {
            return;
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let now_ms = self.now_ms();
        let mut evicted = Vec::new();
        self.map().retain(|_, thread| {
            let state = thread.lock();
            let keep = state.run.is_some() || now_ms.saturating_sub(state.used) < ttl_ms;
            drop(state);
            if !keep {
                evicted.push(Arc::clone(thread));
            }
            keep
        });
        for thread in evicted {
            tracing::debug!(thread = thread.id, "thread evicted after its TTL");
            self.forget(&thread);
            self.inner.storage.forget(&thread.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::hub::{Clock, HubConfig};

    /// A clock moved by hand.
    #[derive(Debug, Default)]
    struct HandClock(AtomicU64);

    impl Clock for HandClock {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    #[tokio::test]
    async fn a_thread_unused_for_its_ttl_by_the_hubs_clock_is_swept_and_one_used_since_is_kept() {
        let clock = Arc::new(HandClock::default());
        let hub = Hub::new(HubConfig { clock: clock.clone(), ..HubConfig::default() });
        let config = ThreadConfig { ttl: Duration::from_secs(60), ..ThreadConfig::default() };
        let threads = Threads::new(hub, Arc::new(Agents::builtin()), config);
        threads.create(None, Some("old"), Vec::new(), None).await.expect("created");
        clock.0.store(30_000, Ordering::Relaxed);
        threads.create(None, Some("new"), Vec::new(), None).await.expect("created");
        clock.0.store(59_999, Ordering::Relaxed);
        threads.sweep();
        assert_eq!(threads.len(), 2, "neither is past its TTL");
        clock.0.store(60_000, Ordering::Relaxed);
        threads.sweep();
        let kept: Vec<String> = threads.map().keys().cloned().collect();
        assert_eq!(kept, ["new"], "the one unused for 60 s is evicted");
        clock.0.store(90_000, Ordering::Relaxed);
        threads.sweep();
        assert!(threads.is_empty());
    }
}
